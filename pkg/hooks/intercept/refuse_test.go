package intercept

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// TestUpstreamCertificateRefused: the world's certificate is not trusted
// by the proxy: the client gets a 403 that says why, the world no
// request.
func TestUpstreamCertificateRefused(t *testing.T) {
	w := newWorld(t)
	other := newWorld(t) // its CA is the one the proxy trusts: w's is not
	tp := newTestProxy(t, w, func(c *Config) { c.UpstreamCAFiles = []string{other.caFile} })
	for _, h2 := range []bool{false, true} {
		r := do(t, goClient(tp, h2), "GET", tp.url("/hello"), "")
		if r.status != 403 || !strings.Contains(r.body, "upstream certificate of localhost") || !strings.Contains(r.body, "not trusted") {
			t.Errorf("h2=%v: %+v", h2, r)
		}
	}
	if n := len(w.received()); n != 0 {
		t.Errorf("the world received %d requests", n)
	}
	if n := len(tp.dec.seen()); n != 0 {
		t.Errorf("the decider was asked %d times", n)
	}
}

// TestClientRejectsCA: a client that does not trust carbd's CA fails
// its handshake; nothing reaches the world.
func TestClientRejectsCA(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: newPoolFromFile(t, w.caFile)}}}
	_, err := c.Get(tp.url("/hello"))
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without carbd's CA got: %v", err)
	}
	if n := len(w.received()); n != 0 {
		t.Errorf("the world received %d requests", n)
	}
}

// TestStreamingResponse: a response is relayed as it arrives (server-sent
// events): the client reads the first event while the server still
// holds the rest.
func TestStreamingResponse(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		w := newWorld(t)
		tp := newTestProxy(t, w, nil)
		resp, err := goClient(tp, h2).Get(tp.url("/hold"))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		first := make(chan string, 1)
		go func() {
			l, _ := br.ReadString('\n')
			first <- l
		}()
		select {
		case l := <-first:
			if l != "data: first\n" {
				t.Fatalf("h2=%v: first line %q", h2, l)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("h2=%v: the first event did not come before the response ended: responses are buffered", h2)
		}
		close(w.gate)
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		if !strings.Contains(string(rest), "data: second") {
			t.Errorf("h2=%v: rest %q", h2, rest)
		}
	}
}

// TestOversizedBody: a body over MaxBodyBytes is decided with its start,
// flagged Oversized; released, the whole body goes up; refused, none.
func TestOversizedBody(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		w := newWorld(t)
		tp := newTestProxy(t, w, func(c *Config) { c.MaxBodyBytes = 1024 })
		big := strings.Repeat("x", 300000)
		c := goClient(tp, h2)
		r := do(t, c, "POST", tp.url("/big-upload"), big)
		if r.status != 200 || !strings.Contains(r.body, "body=300000") {
			t.Fatalf("h2=%v: oversized released: %+v", h2, r)
		}
		r = do(t, c, "POST", tp.url("/big-upload"), big+secret)
		if r.status != 200 {
			// The secret is past the limit: the decider did not see it;
			// Oversized tells the daemon to defer such a request.
			t.Fatalf("h2=%v: %+v", h2, r)
		}
		r = do(t, c, "POST", tp.url("/big-upload"), secret+big)
		if r.status != 403 || !r.reused {
			t.Fatalf("h2=%v: oversized refused: %+v", h2, r)
		}
		r = do(t, c, "GET", tp.url("/after"), "")
		if r.status != 200 || !r.reused {
			t.Fatalf("h2=%v: after an oversized refusal: %+v", h2, r)
		}
		reqs := tp.dec.seen()
		if len(reqs) != 4 || !reqs[0].Oversized || !reqs[2].Oversized || reqs[3].Oversized || !reqs[0].Event.Opaque {
			t.Errorf("h2=%v: Oversized flags wrong: %d requests", h2, len(reqs))
		}
		if got := len(w.received()); got != 3 {
			t.Errorf("h2=%v: world received %d requests, want 3", h2, got)
		}
		if n := w.bytesWith(secret[:6]); n != 1 { // only the released one whose secret was past the limit
			t.Errorf("h2=%v: %d requests with the marker reached the world, want 1", h2, n)
		}
	}
}

// TestNoSNI: a client that sends no server name gets a certificate for
// the original destination's address.
func TestNoSNI(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	conn, err := tls.Dial("tcp", tp.addr.String(), &tls.Config{RootCAs: tp.ca.Pool(), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().PeerCertificates[0].IPAddresses; len(got) != 1 || !got[0].Equal(net.IP(netip.MustParseAddr("127.0.0.1").AsSlice())) {
		t.Fatalf("leaf IPs %v", got)
	}
	io.WriteString(conn, "GET /ip HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%v %v", resp, err)
	}
}

// TestMisdirected: a request whose Host is not the server the connection
// was verified for is refused without asking the decider (the policy
// would judge one party while the bytes go to another).
func TestMisdirected(t *testing.T) {
	w := newWorld(t)
	var refused []string
	var mu sync.Mutex
	tp := newTestProxy(t, w, func(c *Config) {
		c.Refused = func(_ *Request, notice string) { mu.Lock(); refused = append(refused, notice); mu.Unlock() }
	})
	for _, h2 := range []bool{false, true} {
		req, _ := http.NewRequest("GET", tp.url("/fronted"), nil)
		req.Host = "allowed.example"
		resp, err := goClient(tp, h2).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), `misdirected request: host "allowed.example" on a connection to "localhost"`) {
			t.Errorf("h2=%v: %d %q", h2, resp.StatusCode, b)
		}
	}
	if len(w.received()) != 0 || len(tp.dec.seen()) != 0 {
		t.Errorf("world received %d, decider saw %d", len(w.received()), len(tp.dec.seen()))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refused) != 2 {
		t.Errorf("Refused called %d times", len(refused))
	}
}

// TestObserveBeforeClient: a response is reported to Observe before the
// client holds all of it, so a request the client makes because of it is
// decided after provenance saw it. Observe holds the response's last
// bytes back: the client must still be reading while it runs.
func TestObserveBeforeClient(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		w := newWorld(t)
		inObserve := make(chan struct{})
		release := make(chan struct{})
		tp := newTestProxy(t, w, func(c *Config) {
			c.Observe = func(_ *Request, ev decide.Event) {
				if ev.Op == "http:response" {
					close(inObserve)
					<-release
				}
			}
		})
		clientDone := make(chan result, 1)
		go func() {
			resp, err := goClient(tp, h2).Get(tp.url("/hello"))
			if err != nil {
				clientDone <- result{body: err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			clientDone <- result{status: resp.StatusCode, body: string(b)}
		}()
		select {
		case <-inObserve:
		case r := <-clientDone:
			t.Fatalf("h2=%v: the client had the whole response (%+v) before Observe ran", h2, r)
		}
		select {
		case r := <-clientDone:
			t.Fatalf("h2=%v: the client had the whole response (%+v) while Observe ran", h2, r)
		default:
		}
		close(release)
		if r := <-clientDone; r.status != 200 {
			t.Fatalf("h2=%v: %+v", h2, r)
		}
	}
}

// TestConnectRefused: a connection the Connect hook refuses sends nothing
// upstream; its requests are answered 403 with the reason, in HTTP/1.1
// and HTTP/2, and the decider is never asked.
func TestConnectRefused(t *testing.T) {
	w := newWorld(t)
	var mu sync.Mutex
	var asked []string
	tp := newTestProxy(t, w, func(c *Config) {
		c.Connect = func(_ context.Context, client, dst netip.AddrPort, sni string) error {
			mu.Lock()
			asked = append(asked, sni)
			mu.Unlock()
			return errors.New("the server name is not derivable from trusted sources")
		}
	})
	for _, h2 := range []bool{false, true} {
		r := do(t, goClient(tp, h2), "GET", tp.url("/hello"), "")
		if r.status != 403 || !strings.Contains(r.body, "not derivable from trusted sources") {
			t.Errorf("h2=%v: %+v", h2, r)
		}
	}
	if n := len(w.received()); n != 0 {
		t.Errorf("the world received %d requests", n)
	}
	if n := len(tp.dec.seen()); n != 0 {
		t.Errorf("the decider was asked %d times", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) == 0 || asked[0] != "localhost" {
		t.Errorf("Connect asked about %q, want the server name localhost", asked)
	}
}
