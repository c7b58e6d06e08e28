package intercept

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
)

// TestLargeResponse: a response of several MiB (relayed through the
// client pipe over HTTP/1.1, the pooled buffer over HTTP/2) reaches the
// client whole and in order, is reported to Observe (with its length, its
// first bytes, and before the client holds all of it: Observe holds the
// response back until the test has seen that the client is still
// reading), and the connection then carries the next request.
func TestLargeResponse(t *testing.T) {
	const size = 5<<20 + 7
	for _, h2 := range []bool{false, true} {
		w := newWorld(t)
		var mu sync.Mutex
		var seen []decide.Event
		inObserve := make(chan struct{})
		release := make(chan struct{})
		tp := newTestProxy(t, w, func(c *Config) {
			c.Observe = func(_ *Request, ev decide.Event) {
				if ev.Op != "http:response" {
					return
				}
				mu.Lock()
				seen = append(seen, ev)
				mu.Unlock()
				if strings.Contains(ev.Obj, "/big") {
					close(inObserve)
					<-release
				}
			}
		})
		c := goClient(tp, h2)
		type got struct {
			body []byte
			err  error
		}
		done := make(chan got, 1)
		go func() {
			resp, err := c.Get(tp.url(fmt.Sprintf("/big?n=%d", size)))
			if err != nil {
				done <- got{err: err}
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			done <- got{b, err}
		}()
		select {
		case <-inObserve:
		case g := <-done:
			t.Fatalf("h2=%v: the client had the whole response (%d bytes, %v) before Observe ran", h2, len(g.body), g.err)
		}
		select {
		case g := <-done:
			t.Fatalf("h2=%v: the client had the whole response (%d bytes, %v) while Observe ran", h2, len(g.body), g.err)
		default:
		}
		close(release)
		g := <-done
		if g.err != nil {
			t.Fatalf("h2=%v: %v", h2, g.err)
		}
		if len(g.body) != size {
			t.Fatalf("h2=%v: %d bytes, want %d", h2, len(g.body), size)
		}
		const pattern = "0123456789abcdef"
		for i, b := range g.body {
			if b != pattern[i%len(pattern)] {
				t.Fatalf("h2=%v: byte %d is %q, want %q", h2, i, b, pattern[i%len(pattern)])
			}
		}
		r := do(t, c, "GET", tp.url("/after"), "")
		if r.status != 200 || !r.reused || !strings.Contains(r.body, "/after") {
			t.Fatalf("h2=%v: the next request on the connection: %+v", h2, r)
		}
		mu.Lock()
		evs := append([]decide.Event(nil), seen...)
		mu.Unlock()
		if len(evs) != 2 || !strings.Contains(evs[0].Obj, "/big") || !strings.Contains(evs[1].Obj, "/after") {
			t.Fatalf("h2=%v: observed %d responses, want /big then /after: %+v", h2, len(evs), evs)
		}
		big := evs[0]
		if !strings.HasPrefix(big.Content, pattern) || len(big.Content) > 1<<20 {
			t.Errorf("h2=%v: the observed body holds %d bytes starting %.20q, want the first bytes, at most 1 MiB", h2, len(big.Content), big.Content)
		}
		var bodyLen string
		for _, f := range big.Fields {
			if f.Name == respwatch.FieldBodyLen {
				bodyLen = f.Value
			}
		}
		if bodyLen != fmt.Sprint(size) {
			t.Errorf("h2=%v: body.len %q, want %d (fields %+v)", h2, bodyLen, size, big.Fields)
		}
		c.CloseIdleConnections()
	}
}

// TestUpstreamResumption: a second connection to a server the proxy
// verified before resumes its TLS session upstream (no chain to verify
// again), whichever protocol; a server the proxy does not trust is
// refused every time (nothing is cached from a failed handshake).
func TestUpstreamResumption(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	for i, h2 := range []bool{false, true, false} {
		c := goClient(tp, h2)
		if r := do(t, c, "GET", tp.url(fmt.Sprintf("/conn%d", i)), ""); r.status != 200 {
			t.Fatalf("connection %d: %+v", i, r)
		}
		c.CloseIdleConnections()
	}
	got := w.received()
	if len(got) != 3 {
		t.Fatalf("the world saw %d requests, want 3: %+v", len(got), got)
	}
	for i, r := range got {
		if want := i > 0; r.Resumed != want {
			t.Errorf("request %d (%s): resumed %v, want %v", i, r.URI, r.Resumed, want)
		}
	}
	// A proxy that trusts another CA: its every connection is refused.
	other := newTestProxy(t, w, func(c *Config) { c.UpstreamCAFiles = []string{tp.caFile} })
	for i := range 2 {
		c := goClient(other, false)
		r := do(t, c, "GET", other.url("/untrusted"), "")
		if r.status != 403 || !strings.Contains(r.body, "not trusted") {
			t.Fatalf("untrusted upstream, connection %d: %+v", i, r)
		}
		c.CloseIdleConnections()
	}
	if n := len(w.received()); n != 3 {
		t.Fatalf("the untrusted proxy's requests reached the world: %d requests", n)
	}
}

// TestReadBody: readBody returns what io.ReadAll of the first limit+1
// bytes would, whatever length the request declared.
func TestReadBody(t *testing.T) {
	const limit = 100
	for _, tc := range []struct {
		name     string
		body     string
		declared int64
		nobody   bool
	}{
		{name: "no body", nobody: true},
		{name: "empty, declared", declared: 0},
		{name: "declared", body: "hello", declared: 5},
		{name: "unknown length", body: strings.Repeat("x", 700), declared: -1},
		{name: "at the limit", body: strings.Repeat("y", limit), declared: limit},
		{name: "over the limit, declared", body: strings.Repeat("z", 3*limit), declared: 3 * limit},
		{name: "over the limit, unknown", body: strings.Repeat("w", 3*limit), declared: -1},
		{name: "declared more than sent", body: "short", declared: 50},
		{name: "declared less than sent", body: "longer than said", declared: 3},
	} {
		r, err := http.NewRequest("POST", "https://world.test/", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		r.ContentLength = tc.declared
		if tc.nobody {
			r.Body = http.NoBody
		}
		got, err := readBody(r, limit)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := tc.body[:min(len(tc.body), limit+1)]
		if string(got) != want {
			t.Errorf("%s: got %d bytes %.12q…, want %d bytes %.12q…", tc.name, len(got), got, len(want), want)
		}
	}
}
