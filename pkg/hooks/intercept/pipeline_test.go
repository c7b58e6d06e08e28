package intercept

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestPipelined sends pipelined HTTP/1.1 requests in one write (a chunked
// body, a refused one in the middle, an Expect: 100-continue one): each
// is decided on its own, answers come in order, the refused one never
// reaches the world.
func TestPipelined(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	conn, err := tls.Dial("tcp", tp.addr.String(), &tls.Config{ServerName: "localhost", RootCAs: tp.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	reqs := "GET /one HTTP/1.1\r\nHost: localhost\r\n\r\n" +
		"POST /two HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n" +
		"POST /forbidden HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc" +
		"PUT /three HTTP/1.1\r\nHost: localhost\r\nContent-Length: 11\r\n\r\n" + secret +
		"HEAD /four-head HTTP/1.1\r\nHost: localhost\r\n\r\n" +
		"GET /four HTTP/1.1\r\nHost: localhost\r\n\r\n"
	if _, err := io.WriteString(conn, reqs); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	want := []struct {
		status int
		body   string
	}{
		{200, "GET /one body=0"},
		{200, "POST /two body=11"},
		{403, "destination not allowed"},
		{403, "sensitive value in body"},
		{200, ""},
		{200, "GET /four body=0"},
	}
	for i, wt := range want {
		var req *http.Request
		if i == 4 {
			req = &http.Request{Method: "HEAD"}
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wt.status || !strings.Contains(string(b), wt.body) {
			t.Errorf("response %d: %d %q, want %d with %q", i, resp.StatusCode, b, wt.status, wt.body)
		}
	}
	// Expect: 100-continue: carbd answers 100, then decides the whole
	// request.
	io.WriteString(conn, "POST /five HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 100 {
		t.Fatalf("100-continue: %v %v", resp, err)
	}
	io.WriteString(conn, "body")
	for {
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 100 {
			break
		}
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "POST /five body=4") {
		t.Errorf("100-continue request: %d %q", resp.StatusCode, b)
	}
	got := w.received()
	var uris []string
	for _, r := range got {
		uris = append(uris, r.Method+" "+r.URI+" "+string(r.Body))
	}
	wantURIs := []string{"GET /one ", "POST /two hello world", "HEAD /four-head ", "GET /four ", "POST /five body"}
	if strings.Join(uris, "|") != strings.Join(wantURIs, "|") {
		t.Errorf("the world received %q, want %q", uris, wantURIs)
	}
	var bodyField string
	for _, f := range tp.dec.seen()[1].Event.Fields {
		if f.Name == "body" {
			bodyField = f.Value
		}
	}
	if bodyField != "hello world" {
		t.Errorf("chunked body field %q", bodyField)
	}
	// Each response the world sent is observed, paired with its request
	// (the refused ones' 403s are carbd's own).
	wantObs := "http:response https://localhost/one|http:response https://localhost/two|" +
		"http:response https://localhost/four-head|http:response https://localhost/four|http:response https://localhost/five"
	if obs := strings.Join(tp.observed(), "|"); obs != wantObs {
		t.Errorf("observed %q, want %q", obs, wantObs)
	}
}

// TestNotHTTP: bytes that are not HTTP/1.x inside TLS are one open,
// opaque effect; refused, the connection closes and nothing goes up.
func TestNotHTTP(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	conn, err := tls.Dial("tcp", tp.addr.String(), &tls.Config{ServerName: "localhost", RootCAs: tp.ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "SSH-2.0-"+secret+"\r\n")
	rest, _ := io.ReadAll(conn)
	if !strings.Contains(string(rest), "403 Forbidden") {
		t.Errorf("answer %q", rest)
	}
	reqs := tp.dec.seen()
	if len(reqs) != 1 || !reqs[0].Open || !reqs[0].Event.Opaque || reqs[0].Event.Op != "tcp:opaque" {
		t.Fatalf("decided %+v", reqs)
	}
	if len(w.received()) != 0 {
		t.Error("the world received something")
	}
}
