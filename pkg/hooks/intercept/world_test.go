package intercept

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/carbd/carbd/pkg/decide"
)

// world is a TLS server on loopback with its own test CA: the "world"
// the proxy's upstream reaches. It logs every request it receives, with
// its whole body, so that tests can assert what reached it.
type world struct {
	addr   netip.AddrPort
	caFile string
	// certs are the world's server certificates (localhost, world.test).
	certs  []tls.Certificate
	keyLog bytes.Buffer // the world's TLS secrets (guarded by mu)
	// gate releases the rest of a /hold response.
	gate chan struct{}
	mu   sync.Mutex
	log  []worldReq
}

type worldReq struct {
	Method, URI, Proto string
	Header             http.Header
	Body               []byte
	// Resumed: the request came on a resumed TLS session.
	Resumed bool
}

// received returns the requests the world saw.
func (w *world) received() []worldReq {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]worldReq(nil), w.log...)
}

// bytesWith counts the requests whose URI, header values or body hold s.
func (w *world) bytesWith(s string) int {
	n := 0
	for _, r := range w.received() {
		hit := strings.Contains(r.URI, s) || bytes.Contains(r.Body, []byte(s))
		for _, vv := range r.Header {
			for _, v := range vv {
				hit = hit || strings.Contains(v, s)
			}
		}
		if hit {
			n++
		}
	}
	return n
}

// newWorld starts a world server whose certificate (for localhost,
// world.test and 127.0.0.1) comes from a fresh test CA, written to a
// PEM file (caFile) for the proxy's UpstreamCAFiles.
func newWorld(t testing.TB) *world {
	t.Helper()
	return newWorldOn(t, nil)
}

// newWorldOn is newWorld on a given listener (nil: loopback, any port).
func newWorldOn(t testing.TB, ln net.Listener) *world {
	t.Helper()
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, LeafOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{caFile: filepath.Join(dir, CACertFile), gate: make(chan struct{})}
	certs := make([]tls.Certificate, 0, 1)
	leaf, err := ca.mintSANs([]string{"localhost", "world.test"}, []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")})
	if err != nil {
		t.Fatal(err)
	}
	certs = append(certs, *leaf)
	w.certs = certs
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/bench" {
			io.WriteString(rw, "ok\n")
			return
		}
		w.mu.Lock()
		w.log = append(w.log, worldReq{r.Method, r.RequestURI, r.Proto, r.Header.Clone(), body, r.TLS != nil && r.TLS.DidResume})
		w.mu.Unlock()
		switch {
		case r.URL.Path == "/sse":
			rw.Header().Set("Content-Type", "text/event-stream")
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			for i := range n {
				fmt.Fprintf(rw, "data: event %d\n\n", i)
				rw.(http.Flusher).Flush()
				time.Sleep(20 * time.Millisecond)
			}
		case r.URL.Path == "/hold":
			rw.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(rw, "data: first\n\n")
			rw.(http.Flusher).Flush()
			select {
			case <-w.gate:
			case <-r.Context().Done():
				return
			}
			io.WriteString(rw, "data: second\n\n")
		case r.URL.Path == "/close-idle":
			// A complete, kept-alive response, then the server closes the
			// connection (as an idle timeout would, before the next
			// request arrives).
			conn, _, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nclosed")
			conn.Close()
		case r.URL.Path == "/wsecho":
			websocket.Handler(func(ws *websocket.Conn) {
				for {
					var msg string
					if err := websocket.Message.Receive(ws, &msg); err != nil {
						return
					}
					w.mu.Lock()
					w.log = append(w.log, worldReq{Method: "WS", URI: r.RequestURI, Body: []byte(msg)})
					w.mu.Unlock()
					if err := websocket.Message.Send(ws, strings.ToUpper(msg)); err != nil {
						return
					}
				}
			}).ServeHTTP(rw, r)
		case r.URL.Path == "/ws":
			conn, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			for {
				l, err := brw.ReadString('\n')
				if err != nil {
					return
				}
				w.mu.Lock()
				w.log = append(w.log, worldReq{Method: "MSG", Body: []byte(l)})
				w.mu.Unlock()
				io.WriteString(conn, strings.ToUpper(l))
			}
		case r.URL.Path == "/big":
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			rw.Header().Set("Content-Type", "application/octet-stream")
			rw.Header().Set("Content-Length", strconv.Itoa(n))
			chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096)
			for n > 0 {
				k := min(n, len(chunk))
				rw.Write(chunk[:k])
				n -= k
			}
		default:
			rw.Header().Set("Content-Type", "text/plain")
			fmt.Fprintf(rw, "hello from the world: %s %s %s body=%d\n", r.Proto, r.Method, r.URL.Path, len(body))
		}
	})
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	srv := &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: certs, NextProtos: []string{"h2", "http/1.1"}, KeyLogWriter: lockedWriter{&w.mu, &w.keyLog}},
		ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, srv.TLSConfig))
	t.Cleanup(func() { srv.Close() })
	w.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	return w
}

// mintSANs mints a leaf with several names (test worlds only).
func (ca *CA) mintSANs(dns []string, ips []netip.Addr) (*tls.Certificate, error) {
	c, err := ca.mint(dns[0], ca.opts.Now())
	if err != nil {
		return nil, err
	}
	tmpl := *c.Leaf
	tmpl.DNSNames = dns
	for _, ip := range ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.AsSlice())
	}
	der, err := x509.CreateCertificate(nil, &tmpl, ca.Cert, c.Leaf.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: c.PrivateKey}, nil
}

// testDecider refuses requests carrying the marker SECRET anywhere (URL,
// headers, body) and records every request it saw.
type testDecider struct {
	mu   sync.Mutex
	reqs []Request
}

const secret = "SECRET-7f3a"

func (d *testDecider) Decide(_ context.Context, r *Request) Verdict {
	d.mu.Lock()
	d.reqs = append(d.reqs, *r)
	d.mu.Unlock()
	for _, f := range r.Event.Fields {
		if strings.Contains(f.Value, secret) {
			return Verdict{Notice: "the request carries a sensitive value in " + f.Name}
		}
	}
	if strings.Contains(r.Event.Obj, "/forbidden") {
		return Verdict{Notice: "destination not allowed"}
	}
	return Verdict{Release: true}
}

func (d *testDecider) seen() []Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Request(nil), d.reqs...)
}

// testProxy is a proxy on loopback whose connections all go to one
// world; caFile is the carbd CA clients are given.
type testProxy struct {
	*Proxy
	addr   netip.AddrPort
	ca     *CA
	caFile string
	dec    *testDecider
	mu     sync.Mutex
	obs    []string
}

func newTestProxy(t testing.TB, w *world, mod func(*Config)) *testProxy {
	t.Helper()
	return newTestProxyOn(t, w, nil, mod)
}

// newTestProxyOn is newTestProxy serving a given listener (nil: loopback).
func newTestProxyOn(t testing.TB, w *world, ln net.Listener, mod func(*Config)) *testProxy {
	t.Helper()
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir, LeafOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tp := &testProxy{ca: ca, caFile: filepath.Join(dir, CACertFile), dec: &testDecider{}}
	cfg := Config{
		CA: ca, Decider: tp.dec,
		RootCAs:         x509.NewCertPool(), // the world's CA only: nothing else is trusted
		UpstreamCAFiles: []string{w.caFile},
		OrigDst:         func(net.Conn) (netip.AddrPort, error) { return w.addr, nil },
		Observe: func(_ *Request, ev decide.Event) {
			tp.mu.Lock()
			tp.obs = append(tp.obs, ev.Op+" "+ev.Obj)
			tp.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tp.Proxy = p
	if ln == nil {
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	tp.addr = ln.Addr().(*net.TCPAddr).AddrPort()
	return tp
}

func (tp *testProxy) observed() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]string(nil), tp.obs...)
}

// url is a URL of the world reached through the proxy (the client
// resolves localhost to the proxy's address).
func (tp *testProxy) url(path string) string {
	return fmt.Sprintf("https://localhost:%d%s", tp.addr.Port(), path)
}

func readFile(t testing.TB, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newPoolFromFile(t testing.TB, f string) *x509.CertPool {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(readFile(t, f)) {
		t.Fatalf("%s: no certificate", f)
	}
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
