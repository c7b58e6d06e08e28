package intercept

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// Protocols carbd speaks inside TLS (ALPN).
const (
	ProtoH2    = "h2"
	ProtoHTTP1 = "http/1.1"
)

// DefaultMaxBodyBytes is the request body decided whole by default.
const DefaultMaxBodyBytes = 16 << 20

// Request is one effect of an intercepted connection: an HTTP request
// (or, with Open, the rest of the connection), decided before any of its
// bytes go upstream.
type Request struct {
	// Client is the guest's end of the connection; Dst its original
	// destination.
	Client, Dst netip.AddrPort
	// SNI is the server name the client sent ("" without one); ALPN the
	// protocol agreed with both sides (ProtoH2, ProtoHTTP1, or "" when
	// none was: HTTP/1.1).
	SNI, ALPN string
	// Stream is the HTTP/2 stream ID (0 for HTTP/1.x).
	Stream uint32
	// Event is the request as carbd's engine sees it: built by netparse's
	// HTTP event code, so its fields (method, host, url, query.*,
	// header.*, body) are those of the same request in clear; only the
	// URL's scheme is https.
	Event decide.Event
	// Oversized: the body is longer than Config.MaxBodyBytes; Event holds
	// its first MaxBodyBytes and is marked opaque. The daemon must take
	// its defer path (the oracle, or refuse): a release forwards the
	// whole body, seen or not.
	Oversized bool
	// Open: the verdict covers the rest of the connection, not one
	// request: a WebSocket or other Upgrade, a chunked body over the
	// limit (its end is not framed), or bytes that are not HTTP/1.x
	// (Event then has Op "tcp:opaque" and is opaque). After a release
	// the rest of the connection is relayed as it is.
	Open bool
}

// Verdict is the decision on a Request.
type Verdict struct {
	// Release lets the request go upstream; otherwise it is refused: the
	// client gets a 403 with Notice, nothing goes upstream.
	Release bool
	// Notice says why a request was refused (the abort notice).
	Notice string
}

// Decider decides requests. Decide is called concurrently (one call at
// a time per HTTP/1.x connection, one per HTTP/2 stream) and may block
// (an oracle); ctx ends when the connection does.
type Decider interface {
	Decide(ctx context.Context, req *Request) Verdict
}

// DeciderFunc adapts a function to a Decider.
type DeciderFunc func(ctx context.Context, req *Request) Verdict

// Decide calls f.
func (f DeciderFunc) Decide(ctx context.Context, req *Request) Verdict { return f(ctx, req) }

// Config configures a Proxy. CA and Decider are required; zero fields
// take their defaults.
type Config struct {
	// CA mints the certificates the client sees.
	CA *CA
	// Decider decides each request.
	Decider Decider
	// Observe, when set, receives the world's responses to released
	// requests as incoming events for provenance (respwatch's
	// "http:response" and "http:response-headers" events for HTTP/1.x;
	// the same operations and fields for HTTP/2). It is called from the
	// connection's goroutines and must not block for long.
	Observe func(req *Request, ev decide.Event)
	// UpstreamCAFiles are PEM files of CAs trusted upstream in addition
	// to RootCAs (the daemon's --upstream-ca, repeatable).
	UpstreamCAFiles []string
	// RootCAs is the base upstream trust; nil: the host's roots.
	RootCAs *x509.CertPool
	// MaxBodyBytes is the request body decided whole; a longer one is
	// Oversized. Default 16 MiB.
	MaxBodyBytes int
	// KeyLog receives the TLS secrets of both legs in the NSS key log
	// format (SSLKEYLOGFILE). Writes are serialized by crypto/tls.
	KeyLog io.Writer
	// ClientKeyLog receives the secrets of the client leg only (the
	// guest's connection to carbd, what a capture on the sandbox's link
	// sees), besides KeyLog.
	ClientKeyLog io.Writer
	// Dial connects upstream; nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HandshakeTimeout bounds the upstream dial and both handshakes.
	// Default 10 s.
	HandshakeTimeout time.Duration
	// OrigDst gives Serve the original destination of an accepted
	// connection; nil: the connection's local address (TPROXY).
	OrigDst func(net.Conn) (netip.AddrPort, error)
	// Logger receives connection errors; nil: discarded.
	Logger *slog.Logger
	// Connect, when set, decides a connection before anything goes
	// upstream: the client, the original destination and the server name
	// the client sent ("" without one). An error refuses the connection:
	// nothing is sent upstream, the client's handshake completes and
	// every request on it is answered 403 with the error as the notice.
	Connect func(ctx context.Context, client, dst netip.AddrPort, sni string) error
	// Refused, when set, is told of each request the proxy refuses
	// without asking the Decider (a Host that is not the connection's
	// server, an upstream that failed verification), for the audit.
	Refused func(req *Request, notice string)
}

// Proxy terminates intercepted TLS connections and relays the HTTP
// requests its Decider releases. It is safe for concurrent use.
type Proxy struct {
	cfg Config
	// roots is the upstream trust, built on first use: the host's roots
	// take tens of milliseconds of CPU to parse, which a sandbox that
	// never makes an intercepted connection should not pay at start.
	// Handle starts building it as a connection arrives, so that it
	// overlaps the client's handshake and the decision.
	roots        func() (*x509.CertPool, error)
	log          *slog.Logger
	clientKeyLog io.Writer // KeyLog and ClientKeyLog
	// sessions keeps the upstream servers' TLS session tickets, so that
	// a new connection to a server carbd verified before resumes (no
	// certificate chain to verify again, no signature); crypto/tls still
	// checks the cached leaf's name and expiry. Bounded (LRU).
	sessions tls.ClientSessionCache
}

// upstreamSessions is how many upstream sessions the proxy keeps.
const upstreamSessions = 1024

// New checks the configuration and loads the upstream CA files.
func New(cfg Config) (*Proxy, error) {
	if cfg.CA == nil {
		return nil, errors.New("intercept: config: CA is required")
	}
	if cfg.Decider == nil {
		return nil, errors.New("intercept: config: Decider is required")
	}
	if cfg.MaxBodyBytes < 0 || cfg.MaxBodyBytes > 1<<30 {
		return nil, fmt.Errorf("intercept: config: MaxBodyBytes %d out of range", cfg.MaxBodyBytes)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	// The upstream CA files are read and checked now (a mistake is a
	// configuration error); the pool they join is built on first use.
	var extra [][]byte
	for _, f := range cfg.UpstreamCAFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("intercept: upstream ca: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("intercept: upstream ca %s: no PEM certificate", f)
		}
		extra = append(extra, b)
	}
	base := cfg.RootCAs
	roots := sync.OnceValues(func() (*x509.CertPool, error) {
		roots := base
		if roots == nil {
			sys, err := x509.SystemCertPool()
			if err != nil {
				return nil, fmt.Errorf("intercept: host roots: %w", err)
			}
			roots = sys
		} else {
			roots = roots.Clone()
		}
		for _, b := range extra {
			roots.AppendCertsFromPEM(b)
		}
		return roots, nil
	})
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clientKeyLog := cfg.KeyLog
	switch {
	case cfg.ClientKeyLog != nil && cfg.KeyLog != nil:
		clientKeyLog = io.MultiWriter(cfg.KeyLog, cfg.ClientKeyLog)
	case cfg.ClientKeyLog != nil:
		clientKeyLog = cfg.ClientKeyLog
	}
	return &Proxy{cfg: cfg, roots: roots, log: log, clientKeyLog: clientKeyLog, sessions: tls.NewLRUClientSessionCache(upstreamSessions)}, nil
}

// Serve accepts connections from ln and handles each on its own
// goroutine until ctx ends or ln fails; it closes ln when ctx ends.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, p.cfg.OrigDst, p.Handle, p.log)
}

// serve is the accept loop of Proxy and Front: each connection, with its
// original destination (origDst, default the accepted connection's local
// address), is given to handle on its own goroutine until ctx ends or ln
// fails. It closes ln when ctx ends and returns once every connection
// has ended.
func serve(ctx context.Context, ln net.Listener, origDst func(net.Conn) (netip.AddrPort, error),
	handle func(context.Context, net.Conn, netip.AddrPort) error, log *slog.Logger) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("intercept: accept: %w", err)
		}
		wg.Go(func() {
			var dst netip.AddrPort
			var err error
			if origDst != nil {
				dst, err = origDst(c)
			} else {
				dst, err = addrPort(c.LocalAddr())
			}
			if err != nil {
				log.Warn("intercept: original destination", "client", c.RemoteAddr(), "err", err)
				c.Close()
				return
			}
			if err := handle(ctx, c, dst); err != nil {
				log.Info("intercept: connection", "client", c.RemoteAddr(), "dst", dst, "err", err)
			}
		})
	}
}

func addrPort(a net.Addr) (netip.AddrPort, error) {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort(), nil
	}
	return netip.ParseAddrPort(a.String())
}

// conn is one intercepted connection.
type conn struct {
	p       *Proxy
	client  netip.AddrPort
	dst     netip.AddrPort
	sni     string
	alpn    string
	up      *tls.Conn
	upErr   error
	cliTLS  *tls.Conn
	offered []string
}

// Handle intercepts one connection the guest opened to origDst: it
// completes the TLS handshake with the client as origDst's server name
// (the SNI, else the address), connects and verifies upstream first so
// that the client is told only the protocol upstream agreed to, then
// decides and relays each request. It closes clientConn and returns when
// the connection ends; the error says why it ended early.
func (p *Proxy) Handle(ctx context.Context, clientConn net.Conn, origDst netip.AddrPort) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer clientConn.Close()
	stop := context.AfterFunc(ctx, func() { clientConn.Close() })
	defer stop()
	// The upstream trust is needed once the request is decided: build
	// it (once per proxy) while the client's handshake goes on.
	go func() { _, _ = p.roots() }()
	cl, _ := addrPort(clientConn.RemoteAddr())
	c := &conn{p: p, client: cl, dst: origDst}
	defer func() {
		if c.up != nil {
			c.up.Close()
		}
	}()
	hctx, hcancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	defer hcancel()
	c.cliTLS = tls.Server(clientConn, &tls.Config{
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			return c.clientConfig(hctx, hello)
		},
		MinVersion: tls.VersionTLS12,
	})
	if err := c.cliTLS.HandshakeContext(hctx); err != nil {
		return fmt.Errorf("intercept: client handshake (%s): %w", origDst, err)
	}
	hcancel()
	if c.upErr != nil {
		c.refuseAll(ctx)
		return c.upErr
	}
	if c.cliTLS.ConnectionState().NegotiatedProtocol == ProtoH2 {
		return c.serveH2(ctx)
	}
	return c.serveH1(ctx)
}

// clientConfig runs inside the client's handshake: it connects upstream
// with the protocols the client offered and answers with the leaf for
// the client's server name and the protocol upstream chose.
func (c *conn) clientConfig(ctx context.Context, hello *tls.ClientHelloInfo) (*tls.Config, error) {
	c.sni = hello.ServerName
	for _, pr := range hello.SupportedProtos {
		if (pr == ProtoH2 || pr == ProtoHTTP1) && !slices.Contains(c.offered, pr) {
			c.offered = append(c.offered, pr)
		}
	}
	name := c.sni
	if name == "" {
		name = c.dst.Addr().Unmap().String()
	}
	leaf, err := c.p.cfg.CA.Leaf(name)
	if err != nil {
		return nil, err
	}
	if c.p.cfg.Connect != nil {
		if err := c.p.cfg.Connect(ctx, c.client, c.dst, c.sni); err != nil {
			c.upErr = fmt.Errorf("intercept: connection to %s refused: %w", name, err)
		}
	}
	if c.upErr == nil {
		c.dialUpstream(ctx, name)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		MinVersion:   tls.VersionTLS12,
		KeyLogWriter: c.p.clientKeyLog,
		// Full-size records from the first byte: the guest is a hop
		// away, there is no slow start to spare small records for, and
		// each record is an encryption and a write.
		DynamicRecordSizingDisabled: true,
	}
	switch {
	case c.upErr != nil:
		// The client gets its answer (a 403 saying why) in HTTP: prefer
		// HTTP/1.1, which every client speaks.
		switch {
		case slices.Contains(c.offered, ProtoHTTP1):
			cfg.NextProtos = []string{ProtoHTTP1}
		case slices.Contains(c.offered, ProtoH2):
			cfg.NextProtos = []string{ProtoH2}
		}
	case c.up.ConnectionState().NegotiatedProtocol != "":
		cfg.NextProtos = []string{c.up.ConnectionState().NegotiatedProtocol}
	}
	return cfg, nil
}

// dialUpstream connects to the original destination and verifies its
// certificate for name; a failure is kept in upErr.
func (c *conn) dialUpstream(ctx context.Context, name string) {
	raw, err := c.p.cfg.Dial(ctx, "tcp", c.dst.String())
	if err != nil {
		c.upErr = fmt.Errorf("intercept: upstream %s: %w", c.dst, err)
		return
	}
	roots, err := c.p.roots()
	if err != nil {
		raw.Close()
		c.upErr = err
		return
	}
	up := tls.Client(raw, &tls.Config{
		ServerName:   name,
		RootCAs:      roots,
		NextProtos:   c.offered,
		MinVersion:   tls.VersionTLS12,
		KeyLogWriter: c.p.cfg.KeyLog,
		// An upload is released whole: full-size records from its start.
		DynamicRecordSizingDisabled: true,
		ClientSessionCache:          c.p.sessions,
	})
	if err := up.HandshakeContext(ctx); err != nil {
		raw.Close()
		var ce *tls.CertificateVerificationError
		if errors.As(err, &ce) {
			c.upErr = fmt.Errorf("intercept: upstream certificate of %s (%s) not trusted: %w", name, c.dst, ce.Err)
		} else {
			c.upErr = fmt.Errorf("intercept: upstream tls handshake with %s (%s): %w", name, c.dst, err)
		}
		return
	}
	c.up = up
	c.alpn = up.ConnectionState().NegotiatedProtocol
}

// request starts a Request of this connection.
func (c *conn) request() Request {
	return Request{Client: c.client, Dst: c.dst, SNI: c.sni, ALPN: c.alpn}
}

// refusalBody is the text/plain body of a 403.
func refusalBody(notice string) string {
	if notice == "" {
		notice = "refused by policy"
	}
	return "carbd: request refused: " + notice + "\n"
}

// http1Refusal renders a 403 response; closing adds Connection: close.
func http1Refusal(notice string, closing bool) []byte {
	body := refusalBody(notice)
	b := make([]byte, 0, 160+len(body))
	b = append(b, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nCache-Control: no-store\r\nX-Carbd-Verdict: refuse\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	b = append(b, "\r\n"...)
	if closing {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	return append(b, body...)
}

// misdirected says why a request whose host (from its Host header,
// :authority or absolute URL) is not the server the connection was
// verified for must be refused: the policy decides by that host, and the
// bytes would go to another party. "" when it matches or names none.
func (c *conn) misdirected(host string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" {
		return ""
	}
	if c.sni != "" {
		if host == strings.ToLower(strings.TrimSuffix(c.sni, ".")) {
			return ""
		}
		return fmt.Sprintf("misdirected request: host %q on a connection to %q", host, c.sni)
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap() == c.dst.Addr().Unmap() {
		return ""
	}
	return fmt.Sprintf("misdirected request: host %q on a connection to %s without a server name", host, c.dst.Addr())
}

// refuse reports a refusal the proxy made itself.
func (c *conn) refuse(req *Request, notice string) {
	if c.p.cfg.Refused != nil {
		c.p.cfg.Refused(req, notice)
	}
}
