package netparse

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/go-cmp/cmp"
)

func TestParseHeadRefusesAmbiguity(t *testing.T) {
	bad := map[string]string{
		"bare CR":              "GET / HTTP/1.1\r\nHost: a\rX: y\r\n\r\n",
		"obs-fold":             "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
		"space before colon":   "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
		"two hosts":            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"cl and te":            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"conflicting cl":       "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"cl list conflict":     "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 2\r\n\r\n",
		"cl not digits":        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
		"te not chunked last":  "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
		"te chunked twice":     "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
		"te in http/1.0":       "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"two te fields":        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
		"http/2 version":       "GET / HTTP/2.0\r\n\r\n",
		"control in value":     "GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
		"fragment in target":   "GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
		"connect without port": "CONNECT example.com HTTP/1.1\r\nHost: a\r\n\r\n",
		"star not options":     "GET * HTTP/1.1\r\nHost: a\r\n\r\n",
		"relative target":      "GET a/b HTTP/1.1\r\nHost: a\r\n\r\n",
		"double space":         "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
	}
	for name, head := range bad {
		t.Run(name, func(t *testing.T) {
			var r HTTPRequest
			if err := parseHead([]byte(head), &r); !errors.Is(err, ErrHTTP) {
				t.Fatalf("got %v, want ErrHTTP", err)
			}
		})
	}
}

func TestParseHeadForms(t *testing.T) {
	tests := []struct {
		head                  string
		host, path, query, ui string
		chunked, tunnel       bool
		bodyLen               int64
	}{
		{"GET /p?q=1 HTTP/1.1\r\nHost: h:8080\r\n\r\n", "h:8080", "/p", "q=1", "", false, false, 0},
		{"GET http://u:pw@abs.example/x/y?z HTTP/1.1\r\nHost: other\r\n\r\n", "abs.example", "/x/y", "z", "u:pw", false, false, 0},
		{"GET http://abs.example?z=2 HTTP/1.1\r\n\r\n", "abs.example", "/", "z=2", "", false, false, 0},
		{"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n", "h", "*", "", "", false, false, 0},
		{"CONNECT db.example:5432 HTTP/1.1\r\nHost: db.example:5432\r\n\r\n", "db.example:5432", "", "", "", false, true, 0},
		{"GET /ws HTTP/1.1\nHost: h\nUpgrade: websocket\nConnection: keep-alive, Upgrade\n\n", "h", "/ws", "", "", false, true, 0},
		{"POST /u HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", "h", "/u", "", "", true, false, 0},
		{"POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 7, 7\r\n\r\n", "h", "/u", "", "", false, false, 7},
	}
	for _, tc := range tests {
		var r HTTPRequest
		if err := parseHead([]byte(tc.head), &r); err != nil {
			t.Errorf("%q: %v", tc.head, err)
			continue
		}
		got := []any{string(r.Host), string(r.Path), string(r.Query), string(r.UserInfo), r.Chunked, r.Tunnel, r.BodyLen}
		want := []any{tc.host, tc.path, tc.query, tc.ui, tc.chunked, tc.tunnel, tc.bodyLen}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%q (-want +got):\n%s", tc.head, diff)
		}
	}
}

func TestHTTPEventFields(t *testing.T) {
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40200", "203.0.113.7:8080", 5)
	c.syn()
	req := "POST /v1/send?to=alice%40example.com&api_key=K123&note=a+b HTTP/1.1\r\n" +
		"Host: api.example:8080\r\nAuthorization: Bearer tok-1\r\nCookie: sid=42\r\nX-Api-Key: k-2\r\n" +
		"User-Agent: agent/1\r\nX-Custom-Session-Id: s-3\r\nContent-Length: 14\r\n\r\n{\"msg\":\"hi!\"}\n"
	r := c.data(0, req)
	if r.Action != Decide || len(r.Effects) != 1 {
		t.Fatalf("%v %v", r.Action, r.Err)
	}
	ev := r.Effects[0].Event()
	want := []decide.Field{
		{Name: "method", Role: decide.RoleControl, Value: "POST"},
		{Name: "host", Role: decide.RoleTarget, Value: "api.example"},
		{Name: "url", Role: decide.RoleTarget, Value: "http://api.example:8080/v1/send?to=alice%40example.com&api_key=K123&note=a+b"},
		{Name: "query", Role: decide.RoleSelector, Value: "to=alice%40example.com&api_key=K123&note=a+b"},
		{Name: "query.to", Role: decide.RoleSelector, Value: "alice@example.com"},
		{Name: "query.api_key", Role: decide.RoleCredential, Value: "K123"},
		{Name: "query.note", Role: decide.RoleSelector, Value: "a b"},
		{Name: "header.authorization", Role: decide.RoleCredential, Value: "Bearer tok-1"},
		{Name: "header.cookie", Role: decide.RoleCredential, Value: "sid=42"},
		{Name: "header.x-api-key", Role: decide.RoleCredential, Value: "k-2"},
		{Name: "header.user-agent", Role: decide.RoleControl, Value: "agent/1"},
		{Name: "header.x-custom-session-id", Role: decide.RoleCredential, Value: "s-3"},
		{Name: "header.content-length", Role: decide.RoleControl, Value: "14"},
		{Name: "body", Role: decide.RoleContent, Value: "{\"msg\":\"hi!\"}\n"},
	}
	if diff := cmp.Diff(want, ev.Fields); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	wantDest := decide.Dest{Host: "api.example", Addr: netip.MustParseAddr("203.0.113.7"), Port: 8080, Proto: "tcp"}
	if diff := cmp.Diff(wantDest, *ev.Dest, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("dest (-want +got):\n%s", diff)
	}
	if ev.Ch != decide.ChanNet || ev.Dir != decide.Out || ev.Op != "http:POST" || ev.Content != "{\"msg\":\"hi!\"}\n" || ev.Opaque {
		t.Errorf("event %+v", ev)
	}
}

func TestHTTPPrefix(t *testing.T) {
	for s, want := range map[string]bool{
		"":                     true,
		"G":                    true,
		"GET":                  true,
		"GET ":                 true,
		"GET /x":               true,
		"GET /x HT":            true,
		"GET /x HTTP/1.1\r":    true,
		"GET /x HTTP/1.1\r\n":  true,
		"\r\nGET /":            true,
		"GET /x HTTP/1.2":      false,
		"GET /x SSH":           false,
		"\x16\x03\x01":         false,
		"SSH-2.0-x":            false,
		"GET\t/":               false,
		"PRI * HTTP/2.0\r\n":   false,
		"GET /x HTTP/1.1 junk": false,
	} {
		if got := httpPrefixOK([]byte(s)); got != want {
			t.Errorf("httpPrefixOK(%q) = %v, want %v", s, got, want)
		}
	}
}
