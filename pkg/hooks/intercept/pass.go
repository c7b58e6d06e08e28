package intercept

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// Route is what a Front does with a redirected connection, chosen from
// its ClientHello before any byte of it goes upstream.
type Route uint8

const (
	// RouteIntercept terminates the connection (Proxy.Handle): each
	// request in it is decided.
	RouteIntercept Route = iota
	// RoutePass relays the connection to its original destination,
	// byte for byte (the ClientHello first): its content stays opaque.
	RoutePass
	// RouteRefuse closes the connection: nothing goes upstream.
	RouteRefuse
)

func (r Route) String() string {
	switch r {
	case RouteIntercept:
		return "intercept"
	case RoutePass:
		return "pass"
	case RouteRefuse:
		return "refuse"
	}
	return fmt.Sprintf("route(%d)", uint8(r))
}

// Hello is what a redirected connection's ClientHello says.
type Hello struct {
	// SNI is the server name ("" without one), lowercased.
	SNI string
	// ALPN are the protocols offered, in order.
	ALPN []string
	// Version is the highest TLS version offered.
	Version uint16
	// ECH: the hello has an encrypted_client_hello extension; SNI is then
	// the client-facing public name.
	ECH bool
}

// FrontConfig configures a Front. Proxy is required.
type FrontConfig struct {
	// Proxy handles the connections routed to interception.
	Proxy *Proxy
	// Route chooses what to do with a connection from its ClientHello,
	// before anything goes upstream (the client waits for the server's
	// answer meanwhile). ctx ends with the connection. Nil: every
	// connection is intercepted.
	Route func(ctx context.Context, client, dst netip.AddrPort, h *Hello) Route
	// Recheck, when set, is called before each chunk a passed
	// connection's client sends after its ClientHello is forwarded; an
	// error ends the connection (both sides) and the chunk is not
	// forwarded. For an opaque connection that must be decided again
	// once the agent has read something new. It may block.
	Recheck func(ctx context.Context, client, dst netip.AddrPort, h *Hello) error
	// CARefused, when set, is told of an intercepted connection whose
	// client ended its handshake with carbd's certificate by a
	// certificate alert (it does not trust carbd's CA); alert is the
	// alert's text ("tls: unknown certificate authority"). The
	// connection is over; nothing but the upstream handshake was sent.
	CARefused func(client, dst netip.AddrPort, h *Hello, alert string)
	// Passed, when set, is told when a passed connection ends: the bytes
	// sent each way and why it ended (nil: both sides closed).
	Passed func(client, dst netip.AddrPort, h *Hello, up, down int64, err error)
	// OrigDst gives Serve the original destination of an accepted
	// connection; nil: the connection's local address (TPROXY).
	OrigDst func(net.Conn) (netip.AddrPort, error)
	// Dial connects passed connections upstream; nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// HelloTimeout bounds the wait for a complete ClientHello and the
	// upstream dial of a passed connection. Default 10 s.
	HelloTimeout time.Duration
	// Logger receives connection errors; nil: discarded.
	Logger *slog.Logger
}

// maxHelloBytes bounds the ClientHello a Front reads (post-quantum key
// shares make hellos of a few KiB; 64 KiB is the handshake message
// limit that matters here).
const maxHelloBytes = 64 << 10

// Front accepts the redirected connections and peeks at each one's
// ClientHello (netparse's parser, as the verdict loop reads it); Route
// then chooses between interception (Proxy.Handle, which the peeked
// bytes are replayed to) and an opaque pass-through relayed to the
// original destination. It is safe for concurrent use.
type Front struct {
	cfg FrontConfig
	log *slog.Logger
}

// NewFront checks the configuration.
func NewFront(cfg FrontConfig) (*Front, error) {
	if cfg.Proxy == nil {
		return nil, errors.New("intercept: front: Proxy is required")
	}
	if cfg.HelloTimeout <= 0 {
		cfg.HelloTimeout = 10 * time.Second
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Front{cfg: cfg, log: log}, nil
}

// Serve accepts connections from ln and handles each on its own
// goroutine until ctx ends or ln fails; it closes ln when ctx ends and
// returns once every connection has ended.
func (f *Front) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, f.cfg.OrigDst, f.Handle, f.log)
}

// Handle reads the ClientHello of one connection the guest opened to
// dst, routes it, and serves it to its end. It closes c.
func (f *Front) Handle(ctx context.Context, c net.Conn, dst netip.AddrPort) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	client, _ := addrPort(c.RemoteAddr())
	peeked, h, err := f.peek(c)
	if err != nil {
		c.Close()
		return fmt.Errorf("intercept: %s to %s: %w", client, dst, err)
	}
	route := RouteIntercept
	if f.cfg.Route != nil {
		route = f.cfg.Route(ctx, client, dst, h)
	}
	switch route {
	case RouteIntercept:
		rc := &replayConn{Conn: c, buf: peeked, watch: true}
		err := f.cfg.Proxy.Handle(ctx, rc, dst)
		if alert, ok := refusedCA(err, rc.alert); ok && f.cfg.CARefused != nil {
			f.cfg.CARefused(client, dst, h, alert)
		}
		return err
	case RoutePass:
		up, down, err := f.pass(ctx, c, client, dst, h, peeked)
		if f.cfg.Passed != nil {
			f.cfg.Passed(client, dst, h, up, down, err)
		}
		return err
	default:
		abort(c)
		return nil
	}
}

// peek reads from c until its ClientHello is complete; it returns the
// bytes read (to be replayed or forwarded) and the hello.
func (f *Front) peek(c net.Conn) ([]byte, *Hello, error) {
	if err := c.SetReadDeadline(time.Now().Add(f.cfg.HelloTimeout)); err != nil {
		return nil, nil, err
	}
	var (
		sc  netparse.HelloScanner
		ch  netparse.ClientHello
		buf = make([]byte, 0, 2048)
	)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if n > 0 {
			switch serr := sc.Scan(buf, maxHelloBytes, &ch); {
			case serr == nil:
				if err := c.SetReadDeadline(time.Time{}); err != nil {
					return nil, nil, err
				}
				h := &Hello{SNI: strings.ToLower(strings.TrimSuffix(string(ch.SNI), ".")), Version: ch.Version, ECH: ch.ECH}
				for _, p := range ch.ALPN {
					h.ALPN = append(h.ALPN, string(p))
				}
				return buf, h, nil
			case !errors.Is(serr, netparse.ErrHelloIncomplete):
				return nil, nil, fmt.Errorf("not a tls clienthello: %w", serr)
			}
		}
		if err != nil {
			if len(buf) == 0 && errors.Is(err, io.EOF) {
				return nil, nil, errors.New("closed before its clienthello")
			}
			return nil, nil, fmt.Errorf("clienthello: %w", err)
		}
	}
}

// pass connects to dst and relays the connection both ways, the peeked
// bytes first: what the client sent reaches dst byte for byte. Each
// chunk from the client is forwarded after Recheck allows it. Both ways
// are copied in chunks of up to passChunk (relay).
func (f *Front) pass(ctx context.Context, c net.Conn, client, dst netip.AddrPort, h *Hello, peeked []byte) (up, down int64, err error) {
	dctx, dcancel := context.WithTimeout(ctx, f.cfg.HelloTimeout)
	u, err := f.cfg.Dial(dctx, "tcp", dst.String())
	dcancel()
	if err != nil {
		abort(c)
		return 0, 0, fmt.Errorf("intercept: pass to %s: %w", dst, err)
	}
	defer u.Close()
	stop := context.AfterFunc(ctx, func() { u.Close() })
	defer stop()
	if _, err := u.Write(peeked); err != nil {
		abort(c)
		return 0, 0, fmt.Errorf("intercept: pass to %s: %w", dst, err)
	}
	up = int64(len(peeked))
	var (
		wg      sync.WaitGroup
		downErr error
	)
	wg.Go(func() {
		down, _, downErr = relay(c, u, nil)
		closeWrite(c)
	})
	n, upErr := f.relayUp(ctx, u, c, client, dst, h)
	up += n
	if upErr != nil {
		// Refused (or broken) midway: nothing more goes either way.
		abort(c)
		u.Close()
	} else {
		closeWrite(u)
	}
	wg.Wait()
	c.Close()
	if upErr != nil {
		return up, down, upErr
	}
	if downErr != nil {
		return up, down, fmt.Errorf("intercept: pass from %s: %w", dst, downErr)
	}
	return up, down, nil
}

// relayUp copies the client's bytes to u, each chunk after Recheck.
func (f *Front) relayUp(ctx context.Context, u, c net.Conn, client, dst netip.AddrPort, h *Hello) (int64, error) {
	var check func() error
	if f.cfg.Recheck != nil {
		check = func() error { return f.cfg.Recheck(ctx, client, dst, h) }
	}
	n, step, err := relay(u, c, check)
	switch {
	case err == nil:
		return n, nil
	case step == stepCheck:
		return n, fmt.Errorf("intercept: pass to %s ended: %w", dst, err)
	case step == stepWrite:
		return n, fmt.Errorf("intercept: pass to %s: %w", dst, err)
	}
	return n, fmt.Errorf("intercept: pass from %s: %w", client, err)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite() //nolint:errcheck // the peer sees the end, or the connection is gone
		return
	}
	c.Close()
}

// abort closes c with a reset (no FIN), as a refused flow is ended.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) //nolint:errcheck // best effort: closed either way
	}
	c.Close()
}

// replayConn reads buf before the connection's own bytes. With watch,
// it follows the TLS records the client sends until the first
// encrypted or ChangeCipherSpec record, and keeps the description of a
// plaintext alert among them: OpenSSL clients (curl, Python, Node) send
// the alert that refuses a certificate in the clear in TLS 1.3, which
// crypto/tls then reports only as "bad record MAC".
type replayConn struct {
	net.Conn
	buf   []byte
	watch bool // following the client's records
	hdr   [5]byte
	nhdr  int    // bytes of hdr filled
	skip  int    // bytes of the current record's body still to come
	body  []byte // a plaintext alert's body, while it comes
	alert replayAlert
}

func (r *replayConn) Read(p []byte) (int, error) {
	if len(r.buf) > 0 {
		n := copy(p, r.buf)
		r.buf = r.buf[n:]
		if r.watch {
			r.follow(p[:n])
		}
		return n, nil
	}
	n, err := r.Conn.Read(p)
	if r.watch && n > 0 {
		r.follow(p[:n])
	}
	return n, err
}

// follow reads record headers (and plaintext alerts) from b.
func (r *replayConn) follow(b []byte) {
	for len(b) > 0 && r.watch {
		if r.skip > 0 {
			k := min(r.skip, len(b))
			if r.body != nil {
				r.body = append(r.body, b[:k]...)
			}
			r.skip -= k
			b = b[k:]
			if r.skip == 0 && r.body != nil {
				if len(r.body) == 2 {
					r.alert = replayAlert{seen: true, desc: int(r.body[1])}
				}
				r.body = nil
			}
			continue
		}
		k := copy(r.hdr[r.nhdr:], b)
		r.nhdr += k
		b = b[k:]
		if r.nhdr < len(r.hdr) {
			return
		}
		r.nhdr = 0
		typ, n := r.hdr[0], int(r.hdr[3])<<8|int(r.hdr[4])
		switch typ {
		case 20, 23: // ChangeCipherSpec, application data: encrypted from here on
			r.watch = false
			return
		case 21:
			if n == 2 {
				r.body = make([]byte, 0, 2)
			}
		}
		r.skip = n
	}
}

// clientHandshakePrefix starts the error Proxy.Handle returns when the
// client's handshake with carbd fails (proxy.go).
const clientHandshakePrefix = "intercept: client handshake"

// certAlerts are the TLS alerts (RFC 8446 §6.2) a client sends when it
// does not accept the server's certificate.
var certAlerts = map[uint64]bool{
	42: true, // bad_certificate
	43: true, // unsupported_certificate
	44: true, // certificate_revoked
	45: true, // certificate_expired
	46: true, // certificate_unknown
	48: true, // unknown_ca
}

// refusedCA reports whether err, from Proxy.Handle, says the client
// ended its handshake with carbd by a certificate alert, and which:
// crypto/tls reports a peer's alert as a *net.OpError "remote error"
// whose Err is its (unexported) alert type, a uint8; a plaintext alert
// the client sent during its handshake (plain, from replayConn) counts
// too.
func refusedCA(err error, plain replayAlert) (string, bool) {
	if err == nil || !strings.HasPrefix(err.Error(), clientHandshakePrefix) {
		return "", false
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "remote error" && oe.Err != nil {
		if v := reflect.ValueOf(oe.Err); v.Kind() == reflect.Uint8 && certAlerts[v.Uint()] {
			return oe.Err.Error(), true
		}
	}
	if plain.seen && certAlerts[uint64(plain.desc)] {
		return alertNames[plain.desc], true
	}
	return "", false
}

// replayAlert is a plaintext alert a client sent during its handshake.
type replayAlert struct {
	seen bool
	desc int
}

// alertNames name the certificate alerts as crypto/tls does.
var alertNames = map[int]string{
	42: "tls: bad certificate",
	43: "tls: unsupported certificate",
	44: "tls: revoked certificate",
	45: "tls: expired certificate",
	46: "tls: unknown certificate",
	48: "tls: unknown certificate authority",
}
