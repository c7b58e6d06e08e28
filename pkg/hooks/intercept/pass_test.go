package intercept

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
)

// The Front: each redirected connection's ClientHello is read first;
// then it is intercepted, passed through byte for byte, or refused
// before anything goes upstream.

// testFront serves a Front on loopback in front of tp's proxy; every
// connection's original destination is dst.
type testFront struct {
	addr netip.AddrPort
	mu   sync.Mutex
	// What the Front reported.
	hellos  []string // "route sni"
	refused []string // CARefused: "sni alert"
	passed  []string // Passed: "sni up down err"
}

func newTestFront(t testing.TB, tp *testProxy, dst netip.AddrPort, route func(h *Hello) Route, mod func(*FrontConfig)) *testFront {
	t.Helper()
	tf := &testFront{}
	cfg := FrontConfig{
		Proxy:   tp.Proxy,
		OrigDst: func(net.Conn) (netip.AddrPort, error) { return dst, nil },
		Route: func(_ context.Context, _, _ netip.AddrPort, h *Hello) Route {
			r := route(h)
			tf.mu.Lock()
			tf.hellos = append(tf.hellos, r.String()+" "+h.SNI)
			tf.mu.Unlock()
			return r
		},
		CARefused: func(_, _ netip.AddrPort, h *Hello, alert string) {
			tf.mu.Lock()
			tf.refused = append(tf.refused, h.SNI+" "+alert)
			tf.mu.Unlock()
		},
		Passed: func(_, _ netip.AddrPort, h *Hello, up, down int64, err error) {
			tf.mu.Lock()
			tf.passed = append(tf.passed, fmt.Sprintf("%s %d %d %v", h.SNI, up, down, err))
			tf.mu.Unlock()
		},
		HelloTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	f, err := NewFront(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	tf.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	return tf
}

func (tf *testFront) report() (hellos, refused, passed []string) {
	tf.mu.Lock()
	defer tf.mu.Unlock()
	return append([]string(nil), tf.hellos...), append([]string(nil), tf.refused...), append([]string(nil), tf.passed...)
}

// recConn records what is written to and read from a connection.
type recConn struct {
	net.Conn
	mu          sync.Mutex
	wrote, read bytes.Buffer
}

func (r *recConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.wrote.Write(p)
	r.mu.Unlock()
	return r.Conn.Write(p)
}

func (r *recConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.mu.Lock()
	r.read.Write(p[:n])
	r.mu.Unlock()
	return n, err
}

func (r *recConn) bytes() (wrote, read []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.wrote.Bytes()), bytes.Clone(r.read.Bytes())
}

// recListener records every accepted connection.
type recListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*recConn
}

func (l *recListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	r := &recConn{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, r)
	l.mu.Unlock()
	return r, nil
}

func (l *recListener) accepted() []*recConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*recConn(nil), l.conns...)
}

// newRecWorld is a world whose raw TCP bytes are recorded.
func newRecWorld(t *testing.T) (*world, *recListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &recListener{Listener: ln}
	return newWorldOn(t, rl), rl
}

// TestFrontPass: a passed connection reaches the world byte for byte
// both ways: the client sees the world's own certificate (not carbd's),
// its request is answered, and the proxy never saw a request.
func TestFrontPass(t *testing.T) {
	w, rl := newRecWorld(t)
	tp := newTestProxy(t, w, nil)
	tf := newTestFront(t, tp, w.addr, func(*Hello) Route { return RoutePass }, nil)

	raw, err := net.Dial("tcp", tf.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	rc := &recConn{Conn: raw}
	tc := tls.Client(rc, &tls.Config{ServerName: "world.test", RootCAs: newPoolFromFile(t, w.caFile), NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake through the pass-through: %v", err)
	}
	st := tc.ConnectionState()
	if bytes.Equal(st.PeerCertificates[0].AuthorityKeyId, tp.ca.Cert.SubjectKeyId) {
		t.Errorf("the client saw carbd's certificate, want the world's")
	}
	// The client ends the connection (close_notify, FIN), so every byte
	// it wrote is one the world reads.
	fmt.Fprintf(tc, "GET /passed HTTP/1.1\r\nHost: world.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := tc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if rest, err := io.ReadAll(tc); err != nil || len(rest) != 0 {
		t.Errorf("after the response: %q %v", rest, err)
	}
	tc.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "GET /passed") {
		t.Errorf("the world's answer: %d %q", resp.StatusCode, body)
	}
	if n := len(tp.dec.seen()); n != 0 {
		t.Errorf("the proxy decided %d requests of a passed connection", n)
	}
	// Byte for byte: what the client wrote is what the world read, and
	// the other way round.
	var passed []string
	waitUntil(t, 5*time.Second, "the pass-through's end", func() bool {
		_, _, passed = tf.report()
		return len(passed) == 1
	})
	conns := rl.accepted()
	if len(conns) != 1 {
		t.Fatalf("the world accepted %d connections, want 1", len(conns))
	}
	cw, cr := rc.bytes()
	ww, wr := conns[0].bytes()
	if !bytes.Equal(cw, wr) {
		t.Errorf("the world read %d bytes, the client wrote %d: not the same bytes", len(wr), len(cw))
	}
	if !bytes.Equal(ww, cr) {
		t.Errorf("the client read %d bytes, the world wrote %d: not the same bytes", len(cr), len(ww))
	}
	if want := fmt.Sprintf("world.test %d %d <nil>", len(cw), len(ww)); passed[0] != want {
		t.Errorf("Passed reported %q, want %q", passed[0], want)
	}
	hellos, _, _ := tf.report()
	if strings.Join(hellos, ",") != "pass world.test" {
		t.Errorf("routes %q", hellos)
	}
}

// TestFrontIntercept: a connection routed to interception is the
// proxy's: the client sees carbd's certificate, each request decided.
func TestFrontIntercept(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	tf := newTestFront(t, tp, w.addr, func(*Hello) Route { return RouteIntercept }, nil)
	c := &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: newPoolFromFile(t, tp.caFile)},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", tf.addr.String())
		},
	}}
	for path, want := range map[string]int{"/hello": 200, "/up?t=" + secret: 403} {
		resp, err := c.Get("https://localhost" + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, want)
		}
		if !bytes.Equal(resp.TLS.PeerCertificates[0].AuthorityKeyId, tp.ca.Cert.SubjectKeyId) {
			t.Errorf("%s: the client did not see carbd's certificate", path)
		}
	}
	if n := len(tp.dec.seen()); n != 2 {
		t.Errorf("the proxy decided %d requests, want 2", n)
	}
	if w.bytesWith(secret) != 0 || len(w.received()) != 1 {
		t.Errorf("the world received %d requests (%d with the secret), want the clean one", len(w.received()), w.bytesWith(secret))
	}
}

// TestFrontCARefused: a client that does not trust carbd's CA ends its
// handshake with a certificate alert; the Front reports it with the
// server name, and nothing reaches the world. curl (OpenSSL: unknown
// CA) and Go (bad certificate).
func TestFrontCARefused(t *testing.T) {
	curl := testutil.RequireTool(t, "curl")
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	tf := newTestFront(t, tp, w.addr, func(*Hello) Route { return RouteIntercept }, nil)
	out, err := exec.Command(curl, "-sS", "--cacert", w.caFile, "--resolve", fmt.Sprintf("world.test:%d:127.0.0.1", tf.addr.Port()),
		fmt.Sprintf("https://world.test:%d/curl", tf.addr.Port())).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 60 {
		t.Fatalf("curl trusting another CA: %v %s, want exit 60", err, out)
	}
	gc, err := tls.Dial("tcp", tf.addr.String(), &tls.Config{ServerName: "go.world.test", RootCAs: newPoolFromFile(t, w.caFile)})
	if err == nil {
		gc.Close()
		t.Fatal("a Go client trusting another CA completed its handshake")
	}
	var refused []string
	waitUntil(t, 5*time.Second, "both refusals reported", func() bool {
		_, refused, _ = tf.report()
		return len(refused) == 2
	})
	got := strings.Join(refused, "\n")
	if !strings.Contains(got, "world.test tls: unknown certificate authority") || !strings.Contains(got, "go.world.test tls: bad certificate") {
		t.Errorf("CARefused reported:\n%s", got)
	}
	if n := len(w.received()); n != 0 {
		t.Errorf("the world received %d requests", n)
	}
}

// TestFrontRefuse: a refused connection is closed after its hello;
// the world never sees a byte. Bytes that are not a ClientHello are
// never routed.
func TestFrontRefuse(t *testing.T) {
	w, rl := newRecWorld(t)
	tp := newTestProxy(t, w, nil)
	tf := newTestFront(t, tp, w.addr, func(*Hello) Route { return RouteRefuse }, nil)
	c, err := tls.Dial("tcp", tf.addr.String(), &tls.Config{ServerName: "refused.test", RootCAs: newPoolFromFile(t, w.caFile)})
	if err == nil {
		c.Close()
		t.Fatal("a refused connection completed its handshake")
	}
	raw, err := net.Dial("tcp", tf.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(raw, "GET / HTTP/1.1\r\nHost: world.test\r\n\r\n")
	if b, _ := io.ReadAll(raw); len(b) != 0 {
		t.Errorf("plain HTTP on the TLS port got %q", b)
	}
	raw.Close()
	hellos, _, _ := tf.report()
	if strings.Join(hellos, ",") != "refuse refused.test" {
		t.Errorf("routes %q, want the TLS connection's only", hellos)
	}
	if n := len(rl.accepted()); n != 0 {
		t.Errorf("the world accepted %d connections", n)
	}
}

// TestFrontRecheck: a passed connection whose Recheck fails is ended
// before the chunk goes upstream.
func TestFrontRecheck(t *testing.T) {
	w, rl := newRecWorld(t)
	tp := newTestProxy(t, w, nil)
	var mu sync.Mutex
	allow := true
	tf := newTestFront(t, tp, w.addr, func(*Hello) Route { return RoutePass }, func(c *FrontConfig) {
		c.Recheck = func(context.Context, netip.AddrPort, netip.AddrPort, *Hello) error {
			mu.Lock()
			defer mu.Unlock()
			if !allow {
				return errors.New("the agent read a secret since the connection was released")
			}
			return nil
		}
	})
	tc, err := tls.Dial("tcp", tf.addr.String(), &tls.Config{ServerName: "world.test", RootCAs: newPoolFromFile(t, w.caFile), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	br := make([]byte, 4096)
	fmt.Fprintf(tc, "GET /first HTTP/1.1\r\nHost: world.test\r\n\r\n")
	if n, err := tc.Read(br); err != nil || !strings.Contains(string(br[:n]), "GET /first") {
		t.Fatalf("the first request: %q %v", br[:n], err)
	}
	mu.Lock()
	allow = false
	mu.Unlock()
	fmt.Fprintf(tc, "GET /second HTTP/1.1\r\nHost: world.test\r\n\r\n")
	if n, err := tc.Read(br); err == nil {
		t.Errorf("the connection went on after Recheck refused: %q", br[:n])
	}
	for _, r := range w.received() {
		if r.URI == "/second" {
			t.Errorf("the world received the request after Recheck refused")
		}
	}
	var passed []string
	waitUntil(t, 5*time.Second, "the pass-through's end", func() bool {
		_, _, passed = tf.report()
		return len(passed) == 1
	})
	if !strings.Contains(passed[0], "the agent read a secret") {
		t.Errorf("Passed: %q", passed[0])
	}
	if len(rl.accepted()) != 1 {
		t.Errorf("the world accepted %d connections", len(rl.accepted()))
	}
}

// TestRefusedCAOnlyClientHandshake: the same certificate alert counts
// only when the client's handshake with carbd failed, not when an
// upstream server sent it.
func TestRefusedCAOnlyClientHandshake(t *testing.T) {
	w := newWorld(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		tp := newTestProxy(t, w, nil)
		leaf, err := tp.ca.Leaf("world.test")
		if err != nil {
			got <- err
			return
		}
		got <- tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*leaf}}).Handshake()
	}()
	if c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: "world.test", RootCAs: newPoolFromFile(t, w.caFile)}); err == nil {
		c.Close()
		t.Fatal("handshake succeeded")
	}
	alertErr := <-got
	if alert, ok := refusedCA(fmt.Errorf("%s (1.2.3.4:443): %w", clientHandshakePrefix, alertErr), replayAlert{}); !ok || alert != "tls: bad certificate" {
		t.Errorf("the client's alert: %q %v (%v)", alert, ok, alertErr)
	}
	if _, ok := refusedCA(fmt.Errorf("intercept: upstream tls handshake with x (1.2.3.4:443): %w", alertErr), replayAlert{seen: true, desc: 48}); ok {
		t.Errorf("an upstream's alert counted as the client refusing carbd's CA")
	}
	if _, ok := refusedCA(fmt.Errorf("%s: %w", clientHandshakePrefix, io.EOF), replayAlert{}); ok {
		t.Errorf("an EOF counted as a refusal")
	}
	// OpenSSL's TLS 1.3 client sends its alert in the clear: crypto/tls
	// reports a bad record MAC, the record follower has the alert.
	mac := fmt.Errorf("%s: local error: tls: bad record MAC", clientHandshakePrefix)
	if alert, ok := refusedCA(mac, replayAlert{seen: true, desc: 48}); !ok || alert != "tls: unknown certificate authority" {
		t.Errorf("a plaintext unknown_ca alert: %q %v", alert, ok)
	}
	if _, ok := refusedCA(mac, replayAlert{seen: true, desc: 40}); ok {
		t.Errorf("a handshake_failure alert counted as a refusal of the CA")
	}
}

// waitUntil polls cond until it holds; a report the Front makes after a
// connection ended arrives shortly after the client saw the end.
func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(limit); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
