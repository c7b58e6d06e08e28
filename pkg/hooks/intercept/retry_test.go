package intercept

import (
	"strings"
	"testing"
)

// TestUpstreamIdleClose: the server closes a kept-alive connection after
// a response; the next request on the client's connection goes to a new
// upstream connection (idempotent requests only), and the world sees it
// once.
func TestUpstreamIdleClose(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	c := goClient(tp, false)
	if r := do(t, c, "GET", tp.url("/close-idle"), ""); r.status != 200 || r.body != "closed" {
		t.Fatalf("first: %+v", r)
	}
	for i := range 2 {
		r := do(t, c, "GET", tp.url("/hello"), "")
		if r.status != 200 || !strings.Contains(r.body, "GET /hello") || !r.reused {
			t.Fatalf("request %d after the server's close: %+v", i, r)
		}
	}
	n := 0
	for _, r := range w.received() {
		if r.URI == "/hello" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("the world received /hello %d times, want 2", n)
	}
	if reqs := tp.dec.seen(); len(reqs) != 3 || reqs[1].Client != reqs[0].Client {
		t.Errorf("decided %d requests (one client connection expected)", len(reqs))
	}
}
