package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/intercept"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// DefaultCADir holds the host's interception CA (created once, the key
// 0600). Never visible in the sandbox.
const DefaultCADir = "/var/lib/carbd/ca"

// InterceptConfig configures the TLS interception of the guest's HTTPS
// (docs/interception.md).
type InterceptConfig struct {
	// Off leaves TLS opaque: decided by its server name, as carrying
	// everything the agent read so far.
	Off bool
	// CADir is where the CA is created once; default DefaultCADir.
	// CACert and CAKey, when set, name an existing CA instead.
	CADir, CACert, CAKey string
	// UpstreamCAs are PEM files of CAs trusted for the world's servers
	// besides the host's roots.
	UpstreamCAs []string
	// Ports are the TCP ports redirected to the interception; default
	// 443. The policy's intercept.ports are added to them.
	Ports []uint16
	// KeyLog, when set, is a file (created 0600, appended to) that gets
	// the TLS secrets of both legs of every intercepted connection in
	// the NSS key log format (SSLKEYLOGFILE), for tools other than the
	// pcapng audit, which carries the guest leg's secrets itself.
	KeyLog string
}

// guestBundle is where the guest finds the CAs it trusts: the system
// bundle's path on Debian-like systems, which the netns backend covers
// with the host's roots plus carbd's CA.
const guestBundle = "/etc/ssl/certs/ca-certificates.crt"

// trustEnv points the usual clients at the guest's bundle.
var trustEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"}

// interceptor terminates the guest's TLS connections to the intercepted
// ports (redirected by the NAT plan to its listener on the host side of
// the sandbox's link) and decides every request in them with the engine.
type interceptor struct {
	nc       *netChannel
	ca       *intercept.CA
	proxy    *intercept.Proxy
	front    *intercept.Front // reads each connection's ClientHello, then intercepts or passes it
	ln       net.Listener
	port     uint16
	redirect []uint16 // the intercepted TCP ports (sorted)
	bundle   string   // the guest's bundle: the host's roots and carbd's CA
	keylog   *os.File // InterceptConfig.KeyLog, or nil

	mu      sync.Mutex
	waiting map[uint64]chan decide.Decision // held requests by effect
	// passing are the connections passed through opaque, by client
	// address, with the level the agent had read when they were last
	// decided (decide.Engine.ReadLevel).
	passing map[netip.AddrPort]decide.Level
	// refusedCA are the server names whose clients refused carbd's CA:
	// with intercept.on_refused_ca: pass, their later connections pass
	// through opaque for the rest of the run.
	refusedCA map[string]bool
}

// loadCA returns the configured CA, creating the host's once.
func loadCA(c InterceptConfig) (*intercept.CA, error) {
	if c.CACert != "" || c.CAKey != "" {
		if c.CACert == "" || c.CAKey == "" {
			return nil, errors.New("interception CA: both the certificate and the key are needed")
		}
		return intercept.LoadCA(c.CACert, c.CAKey, intercept.LeafOptions{})
	}
	dir := c.CADir
	if dir == "" {
		dir = DefaultCADir
	}
	return intercept.LoadOrCreateCA(dir, intercept.LeafOptions{})
}

// startIntercept prepares the interception before the sandbox starts:
// the CA, the guest's bundle and the proxy. Its listener comes with the
// sandbox's link (listen).
func (nc *netChannel) startIntercept() (*interceptor, error) {
	d := nc.d
	ca, err := loadCA(d.cfg.Intercept)
	if err != nil {
		return nil, fmt.Errorf("interception: %w", err)
	}
	roots, err := os.ReadFile(guestBundle)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("interception: the host's roots: %w", err)
	}
	bundle := filepath.Join(d.dir, "ca-bundle.pem")
	b := append(bytes.TrimRight(roots, "\n"), '\n')
	if len(roots) == 0 {
		b = nil
	}
	b = append(b, ca.CertPEM...)
	if err := os.WriteFile(bundle, b, 0o644); err != nil {
		return nil, fmt.Errorf("interception: the guest's bundle: %w", err)
	}
	// The bundle (the host's roots, ~220 KB on tmpfs) serves the run
	// only: a host giving each run its own id kept one per run. The
	// sandbox's bind mount holds its own reference until it is torn down
	// (closers run in reverse: the sandbox's first).
	d.onClose(func() error {
		if err := os.Remove(bundle); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("interception: remove the guest's bundle: %w", err)
		}
		return nil
	})
	ic := &interceptor{nc: nc, ca: ca, bundle: bundle, waiting: map[uint64]chan decide.Decision{},
		passing: map[netip.AddrPort]decide.Level{}, refusedCA: map[string]bool{},
		redirect: interceptPorts(d.cfg.Intercept.Ports, d.engine.Policy().Intercept.Ports)}
	cfg := intercept.Config{
		CA: ca, Decider: ic, Observe: ic.observe, Refused: ic.refused, Connect: ic.connect,
		UpstreamCAFiles: d.cfg.Intercept.UpstreamCAs, OrigDst: ic.origDst,
		ClientKeyLog: captureKeyLog{nc},
		Logger:       d.log.With("channel", "intercept"),
	}
	if p := d.cfg.Intercept.KeyLog; p != "" {
		f, err := openKeyLog(p)
		if err != nil {
			return nil, fmt.Errorf("interception: key log: %w", err)
		}
		ic.keylog, cfg.KeyLog = f, f
	}
	ic.proxy, err = intercept.New(cfg)
	if err != nil {
		ic.closeKeyLog()
		return nil, err
	}
	ic.front, err = intercept.NewFront(intercept.FrontConfig{
		Proxy: ic.proxy, Route: ic.route, Recheck: ic.recheck, CARefused: ic.caRefused, Passed: ic.passed,
		OrigDst: ic.origDst, Logger: cfg.Logger,
	})
	if err != nil {
		ic.closeKeyLog()
		return nil, err
	}
	return ic, nil
}

// interceptPorts are the intercepted TCP ports: the configured ones
// (default 443) and the policy's intercept.ports, sorted, once each.
func interceptPorts(cfg, policy []uint16) []uint16 {
	ports := slices.Clone(cfg)
	if len(ports) == 0 {
		ports = []uint16{decide.DefaultInterceptPort}
	}
	ports = append(ports, policy...)
	slices.Sort(ports)
	return slices.Compact(ports)
}

// openKeyLog opens (or creates) a key log file for appending, readable
// by its owner only, whatever mode it had.
func openKeyLog(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (ic *interceptor) closeKeyLog() error {
	if ic.keylog == nil {
		return nil
	}
	return ic.keylog.Close()
}

// captureKeyLog hands the guest leg's TLS secrets to the sandbox's
// capture, whose pcapng export carries them as a Decryption Secrets
// Block (the capture is on the sandbox's link: it sees that leg). The
// capture starts before the interception serves.
type captureKeyLog struct{ nc *netChannel }

func (k captureKeyLog) Write(p []byte) (int, error) {
	if s := k.nc.stream; s != nil {
		_, _ = s.Write(p)
	}
	if c := k.nc.cap; c != nil {
		return c.KeyLog().Write(p)
	}
	return len(p), nil
}

// listen opens the listener the NAT plan redirects to: one for both
// address families, bound to the sandbox's link (it exists, still down),
// so nothing else on the host reaches it.
func (ic *interceptor) listen() error {
	ifname := ic.nc.plan.HostIf
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, ifname)
		}); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "[::]:0")
	if err != nil {
		return fmt.Errorf("interception: listen on %s: %w", ifname, err)
	}
	ic.ln, ic.port = ln, uint16(ln.Addr().(*net.TCPAddr).Port)
	return nil
}

// ports are the intercepted destination ports. The policy's are read
// when the sandbox starts: a reload does not change the redirect.
func (ic *interceptor) ports() []uint16 { return ic.redirect }

// serve runs the proxy until ctx ends. A listener that fails while ctx
// goes on is reported to the supervisor at once: the proxy returns only
// once its connections have ended, and a held request's can wait for the
// oracle until the failure's stop ends it.
func (ic *interceptor) serve(ctx context.Context) error {
	return ic.front.Serve(ctx, reportingListener{Listener: ic.ln, ctx: ctx, fail: func(err error) {
		ic.nc.d.sup.Fail("interception-proxy", fmt.Errorf("intercept: accept: %w", err))
	}})
}

// reportingListener calls fail with an Accept error that is not the
// teardown's (ctx still going on).
type reportingListener struct {
	net.Listener
	ctx  context.Context
	fail func(error)
}

func (l reportingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && l.ctx.Err() == nil {
		l.fail(err)
	}
	return c, err
}

// guest is what the sandbox needs to trust carbd's CA: the bundle bound
// over the system's, and the environment the usual clients read.
func (ic *interceptor) guest() (netns.Bind, []string) {
	env := make([]string, len(trustEnv))
	for i, n := range trustEnv {
		env[i] = n + "=" + guestBundle
	}
	return netns.Bind{Source: ic.bundle, Target: guestBundle}, env
}

// origDst is the destination the guest dialled. A connection made to the
// listener itself (not redirected) has none and is refused.
func (ic *interceptor) origDst(c net.Conn) (netip.AddrPort, error) {
	dst, err := intercept.OriginalDst(c)
	if err != nil {
		return dst, err
	}
	if dst.Port() == ic.port {
		if local, ok := c.LocalAddr().(*net.TCPAddr); ok && local.AddrPort().Addr().Unmap() == dst.Addr().Unmap() {
			return netip.AddrPort{}, fmt.Errorf("intercept: %s dialled the interception listener itself", c.RemoteAddr())
		}
	}
	return dst, nil
}

// handles reports whether a flow the verdict loop sees (after the NAT
// redirect) goes to the interception listener: the proxy decides it.
func (ic *interceptor) handles(dst netip.Addr, port uint16, proto uint8) bool {
	if ic == nil || proto != 6 || port != ic.port {
		return false
	}
	dst = dst.Unmap()
	return dst == ic.nc.plan.HostAddr4.Addr() || dst == ic.nc.plan.HostAddr6.Addr()
}

// connect decides the connection itself before anything goes upstream:
// its server name is a target, like a DNS query's name, and the
// destination must not be refused outright. Content is decided request
// by request.
func (ic *interceptor) connect(ctx context.Context, client, dst netip.AddrPort, sni string) error {
	v := ic.decide(ctx, client, dst, ic.connectEvent(dst, sni, false))
	if !v.Release {
		return errors.New(v.Notice)
	}
	return nil
}

// connectEvent is a connection's tls:connect effect. Opaque: the
// connection passes through without interception, its content carrying
// everything the agent read so far.
func (ic *interceptor) connectEvent(dst netip.AddrPort, sni string, opaque bool) decide.Event {
	fields := []decide.Field{{Name: "sni", Role: decide.RoleTarget, Value: sni}}
	obj := sni
	if sni == "" {
		obj = dst.Addr().Unmap().String()
		fields = []decide.Field{{Name: "addr", Role: decide.RoleTarget, Value: obj}}
	}
	// Before the upstream handshake nothing proves the name: it names
	// the destination only where carbd's resolver gave it for this
	// address (as on the verdict loop's path); it is a target either way.
	host := sni
	if host != "" && !ic.nc.resolved(host, dst.Addr()) {
		host = ""
	}
	return decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: "tls:connect", Obj: fmt.Sprintf("%s:%d", obj, dst.Port()),
		Fields: fields, Dest: &decide.Dest{Host: host, Addr: dst.Addr().Unmap(), Port: dst.Port(), Proto: "tcp"}, Opaque: opaque}
}

// Decide implements intercept.Decider: one request, decided by the engine
// as the same request in clear would be; a held one waits for its scope.
func (ic *interceptor) Decide(ctx context.Context, req *intercept.Request) intercept.Verdict {
	ev := req.Event
	dst := decide.Dest{Host: req.SNI, Addr: req.Dst.Addr().Unmap(), Port: req.Dst.Port(), Proto: "tcp"}
	if ev.Dest != nil && ev.Dest.Host != "" {
		dst.Host = ev.Dest.Host
	}
	ev.Dest = &dst
	return ic.decide(ctx, req.Client, req.Dst, ev)
}

// decide decides one effect of the intercepted connection from client
// to dst, and notes its final verdict for the capture's annotations.
func (ic *interceptor) decide(ctx context.Context, client, dst netip.AddrPort, ev decide.Event) intercept.Verdict {
	d := ic.nc.d
	// What the agent read before it sent this must be known first (as
	// for every network decision): fail closed if it cannot be.
	if err := d.files.syncTracing(ctx); err != nil {
		d.log.Warn("refused without a decision: the file trace could not be brought up to date", "effect", d.engine.Policy().Redact(ev.Summary()), "err", err)
		return intercept.Verdict{Notice: "carbd could not establish what the agent read before this request; it was refused"}
	}
	// The guest's socket (client to the destination it dialled) is the
	// client: when it closes, or the sandbox exits, a question about this
	// request is withdrawn (clients.go).
	flow := tcx.FlowKey{Src: client.Addr().Unmap(), SrcPort: client.Port(), Dst: dst.Addr().Unmap(), DstPort: dst.Port(), Proto: tcx.ProtoTCP}
	ctx, done := ic.nc.whileConnWaits(ctx, flow)
	defer done()
	res := d.engine.Propose(ctx, ev)
	dec := res.Decision
	if cf := d.sup.Err(); cf != nil && dec.Verdict != decide.Refuse {
		// A component failed while this was decided: nothing is
		// released after a failure (its resolutions are refused by
		// applyResolution).
		dec = failedDecision(dec, cf)
		d.auditFailed(dec)
	}
	d.record(dec)
	var wait chan decide.Decision
	if dec.Verdict == decide.Defer {
		wait = make(chan decide.Decision, 1)
		ic.mu.Lock()
		ic.waiting[dec.Seq] = wait
		ic.mu.Unlock()
		defer func() {
			ic.mu.Lock()
			delete(ic.waiting, dec.Seq)
			ic.mu.Unlock()
		}()
	}
	for i := range res.Resolutions {
		d.applyResolution(&res.Resolutions[i])
	}
	if dec.Verdict == decide.Defer {
		ic.nc.clients.watchHeld(dec.Seq, flow)
		d.resolveSoon(dec.Scope)
		if f, ok := d.finalOf(dec.Seq); ok {
			dec = f
		} else {
			select {
			case dec = <-wait:
			case <-ctx.Done():
				return intercept.Verdict{Notice: "carbd: the request was held and its connection ended before a decision"}
			}
		}
	}
	ic.note(client, dst, fmt.Sprintf("#%d %s %s (%s)", dec.Seq, dec.Verdict, ev.Op, dec.Reason.Code))
	if dec.Verdict == decide.Release {
		return intercept.Verdict{Release: true}
	}
	return intercept.Verdict{Notice: decide.AbortNotice([]decide.Decision{dec})}
}

// maxInterceptNote bounds an intercepted connection's annotation: its
// latest decisions are kept.
const maxInterceptNote = 1024

// note adds a decision of an intercepted connection to the annotation of
// its frames in the capture (which sees the guest's side of it: the
// addresses it dialled). The frames are those of the whole connection,
// so the annotation lists the connection's decisions in order, each
// with its sequence number in the audit; tshark's decrypted view shows
// which request is which.
func (ic *interceptor) note(client, dst netip.AddrPort, what string) {
	ic.noteVerdict(client, dst, "intercepted", what)
}

// noteVerdict is note with the connection's verdict ("intercepted",
// "passed" for an opaque pass-through, "closed"); an empty what only
// sets the verdict.
func (ic *interceptor) noteVerdict(client, dst netip.AddrPort, verdict, what string) {
	nc := ic.nc
	id := newFlowID(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port()), 6)
	nc.mu.Lock()
	defer nc.mu.Unlock()
	n, _ := nc.flows.peek(id)
	n.verdict = verdict
	switch {
	case what == "":
		what = n.reason
	case n.reason != "":
		what = n.reason + "; " + what
	}
	if cut := len(what) - maxInterceptNote; cut > 0 {
		if i := strings.Index(what[cut:], "; "); i >= 0 {
			what = "…; " + what[cut+i+2:]
		}
	}
	n.reason, n.at = what, time.Now()
	nc.flows.put(id, n)
}

// resolved hands the final verdicts of a resolved scope to the requests
// waiting for them.
func (ic *interceptor) resolved(r *decide.Resolution) {
	if ic == nil {
		return
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	for _, e := range r.Effects {
		if ch, ok := ic.waiting[e.Seq]; ok {
			select {
			case ch <- e:
			default:
			}
		}
	}
}

// observe hands a response to a released request to provenance.
func (ic *interceptor) observe(_ *intercept.Request, ev decide.Event) {
	ic.nc.observe(ev)
}

// refused records a request the proxy refused on its own (a host that is
// not the connection's server, an upstream that failed verification).
func (ic *interceptor) refused(req *intercept.Request, notice string) {
	ic.nc.d.log.Warn("intercepted request refused", "client", req.Client, "dst", req.Dst, "sni", req.SNI, "why", notice)
	ic.note(req.Client, req.Dst, "refuse "+req.Event.Op+" by the interception: "+notice)
}

// close stops accepting; the proxy's connections end with its context.
// The key log is closed too: close runs after the proxy has stopped.
func (ic *interceptor) close() error {
	if ic == nil {
		return nil
	}
	var err error
	if ic.ln != nil {
		if err = ic.ln.Close(); errors.Is(err, net.ErrClosed) {
			err = nil
		}
	}
	return errors.Join(err, ic.closeKeyLog())
}

// finalOf returns an effect's final decision, once it has one.
func (d *daemon) finalOf(seq uint64) (decide.Decision, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, ok := d.final[seq]
	if !ok {
		return decide.Decision{}, false
	}
	return *f, true
}
