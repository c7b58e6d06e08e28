package intercept

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
)

func goClient(tp *testProxy, h2 bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tp.ca.Pool()}, ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr}
}

type result struct {
	status int
	proto  string
	body   string
	reused bool
}

func do(t *testing.T, c *http.Client, method, url, body string, hdr ...string) result {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, url, err)
	}
	return result{resp.StatusCode, resp.Proto, string(b), reused}
}

func TestGoClient(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := map[bool]string{false: "http1", true: "h2"}[h2]
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			tp := newTestProxy(t, w, nil)
			c := goClient(tp, h2)
			wantProto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]

			r := do(t, c, "GET", tp.url("/hello?q=1"), "")
			if r.status != 200 || r.proto != wantProto || !strings.Contains(r.body, "hello from the world: "+wantProto+" GET /hello") {
				t.Fatalf("clean request: %+v", r)
			}
			// Refused (secret in the body, then in a header): 403 with the
			// notice, nothing reaches the world, the connection goes on.
			r = do(t, c, "POST", tp.url("/upload"), "data="+secret)
			if r.status != 403 || !strings.Contains(r.body, "carbd: request refused: the request carries a sensitive value in body") {
				t.Fatalf("refused request: %+v", r)
			}
			r = do(t, c, "GET", tp.url("/x"), "", "Authorization", "Bearer "+secret)
			if r.status != 403 || !strings.Contains(r.body, "header.authorization") || !r.reused {
				t.Fatalf("refused header request: %+v", r)
			}
			r = do(t, c, "POST", tp.url("/after"), "plain body")
			if r.status != 200 || !r.reused || !strings.Contains(r.body, "POST /after body=10") {
				t.Fatalf("request after the refusals: %+v", r)
			}
			if n := w.bytesWith(secret); n != 0 {
				t.Fatalf("%d requests with the secret reached the world", n)
			}
			if got := len(w.received()); got != 2 {
				t.Fatalf("the world received %d requests, want 2", got)
			}
			// The decider saw the fields plain HTTP gives.
			reqs := tp.dec.seen()
			ev := reqs[0].Event
			want := map[string]string{"method": "GET", "host": "localhost", "query": "q=1", "query.q": "1",
				"url": tp.url("/hello?q=1")}
			for _, f := range ev.Fields {
				if v, ok := want[f.Name]; ok {
					if f.Value != v {
						t.Errorf("field %s = %q, want %q", f.Name, f.Value, v)
					}
					delete(want, f.Name)
				}
			}
			if len(want) > 0 {
				t.Errorf("fields missing: %v (event %+v)", want, ev)
			}
			if reqs[0].SNI != "localhost" || reqs[0].ALPN != map[bool]string{false: "", true: "h2"}[h2] {
				t.Errorf("request flow: SNI %q ALPN %q", reqs[0].SNI, reqs[0].ALPN)
			}
			for _, q := range reqs[1:] {
				if q.Client != reqs[0].Client {
					t.Errorf("requests came on several connections: %v and %v", reqs[0].Client, q.Client)
				}
			}
			obs := tp.observed()
			if len(obs) == 0 || obs[0] != "http:response "+tp.url("/hello?q=1") {
				t.Errorf("observed responses: %q", obs)
			}
		})
	}
}
