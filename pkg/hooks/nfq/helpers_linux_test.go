package nfq

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// testPinDir keeps the tests' pins apart from a real carbd's.
const testPinDir = "/sys/fs/bpf/carbd-nfqtest"

// env is the guest / router / world topology with carbd's data path on
// the router's r0: the TC program (tcx), carbd's netfilter rules
// (nfrules) and, once started, the verdict loop.
type env struct {
	topo *tcxtest.Topology
	id   string
	qnum uint16
	dp   *tcx.Datapath
	dec  *scripted
	loop *Loop
	stop func() // stops the loop and waits for Run to return
	err  error  // what Run returned

	hook        func(*packet)
	allowPanics bool
}

type envOpt struct {
	noLoop      bool // topology, tcx and rules only
	cfg         func(*Config)
	hook        func(*packet) // core.testHookHandle
	allowPanics bool
}

func newEnv(t testing.TB, o envOpt) *env {
	t.Helper()
	testutil.RequireRoot(t)
	return envOn(t, tcxtest.New(t), o)
}

// envOn puts the TC program, the queue rules and (unless o.noLoop) the
// verdict loop on topo's router link.
func envOn(t testing.TB, topo *tcxtest.Topology, o envOpt) *env {
	t.Helper()
	e := &env{topo: topo, id: testutil.UniqueName("nq"), qnum: tcxtest.QueueNum(), dec: newScripted()}
	tcfg := tcx.Config{SandboxID: e.id, Ifname: topo.RouterIf, NetNS: tcxtest.Path(topo.Router), PinDir: testPinDir}
	dp, err := tcx.Attach(tcfg)
	if err != nil {
		t.Fatalf("attach tc program: %v", err)
	}
	e.dp = dp
	t.Cleanup(func() {
		if err := tcx.Remove(tcfg); err != nil {
			t.Errorf("remove tc program: %v", err)
		}
		os.RemoveAll(filepath.Join(testPinDir, e.id))
	})
	if err := dp.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	rc := e.rules()
	if _, err := nfrules.Apply(rc); err != nil {
		t.Fatalf("apply netfilter rules: %v", err)
	}
	t.Cleanup(func() {
		if err := nfrules.Remove(rc); err != nil {
			t.Errorf("remove netfilter rules: %v", err)
		}
	})
	e.hook, e.allowPanics = o.hook, o.allowPanics
	if !o.noLoop {
		e.start(t, o.cfg)
	}
	return e
}

func (e *env) rules() nfrules.Config {
	return nfrules.Config{SandboxID: e.id, Iface: e.topo.RouterIf, QueueNum: e.qnum, NetNS: tcxtest.Path(e.topo.Router)}
}

func (e *env) baseConfig() Config {
	return Config{
		QueueNum:    e.qnum,
		NetNS:       tcxtest.Path(e.topo.Router),
		MaxQueueLen: 1024,
		Decider:     e.dec,
		Datapath:    e.dp,
		HoldTimeout: 20 * time.Second,
	}
}

// start runs a verdict loop in the router namespace until the test ends.
func (e *env) start(t testing.TB, mod func(*Config)) {
	t.Helper()
	cfg := e.baseConfig()
	if mod != nil {
		mod(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.loop = l
	l.c.testHookHandle = e.hook
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.err = l.Run(ctx) }()
	select {
	case <-l.Ready():
	case <-done:
		t.Fatalf("loop: %v", e.err)
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			<-done
			if e.err != nil {
				t.Errorf("loop: %v", e.err)
			}
		})
	}
	t.Cleanup(func() {
		e.stop()
		s := l.Stats()
		t.Logf("loop stats: %s", s.String())
		if e.allowPanics {
			s.Panics = 0
		}
		checkInvariant(t, &s)
	})
}

// checkInvariant: every packet received has exactly one verdict (the loop
// is stopped or idle: nothing held).
func checkInvariant(t testing.TB, s *Stats) {
	t.Helper()
	if s.DoubleVerdicts != 0 {
		t.Errorf("%d second verdicts attempted", s.DoubleVerdicts)
	}
	if got := s.Accepted() + s.Dropped() + uint64(s.Held); got != s.Received {
		t.Errorf("received %d packets, accounted %d (accepted %d, dropped %d, held %d)",
			s.Received, got, s.Accepted(), s.Dropped(), s.Held)
	}
	if s.Panics != 0 {
		t.Errorf("%d panics", s.Panics)
	}
}

// decision is what the scripted decider saw.
type decision struct {
	meta Meta
	ev   decide.Event
	out  Outcome
}

// scripted is a test Decider: rules match events in order, first wins;
// no rule matching refuses. Held effects get tickets announced on held.
type scripted struct {
	mu     sync.Mutex
	rules  []rule
	seen   []decision
	ticket atomic.Uint64
	held   chan decision
}

type rule struct {
	match func(m Meta, ev *decide.Event) bool
	v     Verdict
}

func newScripted() *scripted { return &scripted{held: make(chan decision, 1024)} }

func (s *scripted) on(v Verdict, match func(m Meta, ev *decide.Event) bool) {
	s.mu.Lock()
	s.rules = append(s.rules, rule{match, v})
	s.mu.Unlock()
}

// reset forgets the rules and what was seen.
func (s *scripted) reset() {
	s.mu.Lock()
	s.rules, s.seen = nil, nil
	s.mu.Unlock()
}

func (s *scripted) Decide(_ context.Context, m Meta, ev decide.Event) Outcome {
	s.mu.Lock()
	out := Outcome{Verdict: Refuse, Reason: "no-rule"}
	for _, r := range s.rules {
		if r.match(m, &ev) {
			out = Outcome{Verdict: r.v, Reason: "rule"}
			break
		}
	}
	if out.Verdict == Hold {
		out.Ticket = s.ticket.Add(1)
	}
	d := decision{m, ev, out}
	s.seen = append(s.seen, d)
	s.mu.Unlock()
	if out.Verdict == Hold {
		s.held <- d
	}
	return out
}

// decisions returns what was decided so far matching f (all when nil).
func (s *scripted) decisions(f func(d decision) bool) []decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []decision
	for _, d := range s.seen {
		if f == nil || f(d) {
			out = append(out, d)
		}
	}
	return out
}

// log writes what was decided, one line each.
func (s *scripted) log(t testing.TB) {
	t.Helper()
	for _, d := range s.decisions(nil) {
		line := d.ev.Summary()
		if len(line) > 300 {
			line = line[:300] + "..."
		}
		t.Logf("decided %s %s [%d,%d) %s -> %v", d.meta.Flow, d.meta.Span, d.meta.Seq, d.meta.End, line, d.out.Verdict)
	}
}

// waitHeld waits for the next held effect.
func (s *scripted) waitHeld(t testing.TB) decision {
	t.Helper()
	select {
	case d := <-s.held:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no effect was held")
	}
	return decision{}
}

func host(h string) func(Meta, *decide.Event) bool {
	return func(_ Meta, ev *decide.Event) bool { return ev.Dest != nil && ev.Dest.Host == h }
}

func op(o string) func(Meta, *decide.Event) bool {
	return func(_ Meta, ev *decide.Event) bool { return ev.Op == o }
}

func dstPort(p uint16) func(Meta, *decide.Event) bool {
	return func(m Meta, _ *decide.Event) bool { return m.Flow.DstPort == p }
}

func anything(Meta, *decide.Event) bool { return true }

// counted wraps a listener and counts every byte read from its
// connections: what reached the world.
type counted struct {
	net.Listener
	bytes, conns atomic.Int64
}

func (c *counted) Accept() (net.Conn, error) {
	conn, err := c.Listener.Accept()
	if err == nil {
		c.conns.Add(1)
		conn = &countedConn{Conn: conn, n: &c.bytes}
	}
	return conn, err
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// httpServer serves on addr in ns: every request is answered with
// "<method> <path> <sha256 of the body>". It returns the byte counter.
func httpServer(t testing.TB, ns string, addr netip.AddrPort) *counted {
	t.Helper()
	l := &counted{Listener: tcxtest.Listen(t, ns, addr)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.Path, hex.EncodeToString(sum[:]))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l
}

// curl runs curl in the guest; it returns stdout, stderr and the exit code.
func curl(t testing.TB, ns string, args ...string) (string, string, int) {
	t.Helper()
	return curlIn(t, ns, nil, args...)
}

// curlIn is curl with stdin.
func curlIn(t testing.TB, ns string, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "curl", "-sS", "--max-time", "30"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("curl: %v", err)
	}
	return out.String(), errb.String(), code
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func urlOf(a netip.AddrPort, path string) string { return "http://" + a.String() + path }

// settle gives a packet that should not arrive the time it would take.
func settle() { time.Sleep(300 * time.Millisecond) }

// waitStats waits until cond holds for the loop's counters.
func (e *env) waitStats(t testing.TB, what string, cond func(s *Stats) bool) Stats {
	t.Helper()
	var s Stats
	if !tcxtest.Eventually(20*time.Second, func() bool { s = e.loop.Stats(); return cond(&s) }) {
		t.Fatalf("waiting for %s: %s", what, s.String())
	}
	return s
}

// payloadSink records the datagrams arriving at addr in ns.
type payloadSink struct {
	mu   sync.Mutex
	got  [][]byte
	n    atomic.Int64
	size atomic.Int64
}

func udpPayloadSink(t testing.TB, ns string, addr netip.AddrPort) *payloadSink {
	t.Helper()
	var pc net.PacketConn
	if err := tcxtest.Do(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return err }); err != nil {
		t.Fatal(err)
	}
	s := &payloadSink{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, append([]byte(nil), buf[:n]...))
			s.mu.Unlock()
			s.n.Add(1)
			s.size.Add(int64(n))
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return s
}

func (s *payloadSink) all() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.got...)
}

// sendUDP sends each payload as one datagram from ns to dst, from port
// src (0: any).
func sendUDP(t testing.TB, ns string, dst netip.AddrPort, src uint16, payloads ...[]byte) {
	t.Helper()
	var local netip.AddrPort
	if src != 0 {
		if dst.Addr().Is4() {
			local = netip.AddrPortFrom(netip.IPv4Unspecified(), src)
		} else {
			local = netip.AddrPortFrom(netip.IPv6Unspecified(), src)
		}
	}
	c, err := tcxtest.Dial(ns, "udp", dst, local, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, p := range payloads {
		_, err := c.Write(p)
		if err != nil && (errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EACCES)) {
			// A connected socket reports the ICMP error a refused earlier
			// datagram drew on its next call: this datagram was not sent.
			_, err = c.Write(p)
		}
		if err != nil {
			t.Fatalf("send udp to %s: %v", dst, err)
		}
	}
}

// dnsServer answers every A/AAAA query over UDP and TCP on addr in ns
// with addr's own address, and records the names asked.
type dnsServer struct {
	mu    sync.Mutex
	names []string
}

func (d *dnsServer) asked() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.names...)
}

func newDNSServer(t testing.TB, ns string, addr netip.AddrPort) *dnsServer {
	t.Helper()
	d := &dnsServer{}
	answer := func(q []byte) []byte {
		var msg layers.DNS
		if err := msg.DecodeFromBytes(q, gopacket.NilDecodeFeedback); err != nil || len(msg.Questions) == 0 {
			return nil
		}
		d.mu.Lock()
		d.names = append(d.names, string(msg.Questions[0].Name))
		d.mu.Unlock()
		resp := layers.DNS{ID: msg.ID, QR: true, OpCode: msg.OpCode, RD: msg.RD, RA: true, Questions: msg.Questions}
		for _, qq := range msg.Questions {
			if qq.Type == layers.DNSTypeA {
				resp.Answers = append(resp.Answers, layers.DNSResourceRecord{Name: qq.Name, Type: layers.DNSTypeA,
					Class: layers.DNSClassIN, TTL: 60, IP: net.IPv4(10, 77, 2, 2)})
			}
		}
		buf := gopacket.NewSerializeBuffer()
		if err := resp.SerializeTo(buf, gopacket.SerializeOptions{FixLengths: true}); err != nil {
			return nil
		}
		return buf.Bytes()
	}
	var pc net.PacketConn
	var l net.Listener
	if err := tcxtest.Do(ns, func() (err error) {
		if pc, err = net.ListenPacket("udp", addr.String()); err != nil {
			return err
		}
		l, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if r := answer(buf[:n]); r != nil {
				pc.WriteTo(r, from)
			}
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					var hdr [2]byte
					if _, err := io.ReadFull(c, hdr[:]); err != nil {
						return
					}
					q := make([]byte, int(hdr[0])<<8|int(hdr[1]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					if r := answer(q); r != nil {
						c.Write(append([]byte{byte(len(r) >> 8), byte(len(r))}, r...))
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { pc.Close(); l.Close() })
	return d
}

// run runs a command in ns and returns its combined output and exit code.
func run(ns string, name string, args ...string) (string, int) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		return err.Error(), -1
	}
	return string(out), 0
}

// wire counts the frames seen on interface dev in ns (an AF_PACKET
// socket, as tcpdump would) that contain pattern: what reached the
// world, fragments included.
type wire struct {
	frames atomic.Int64
}

func sniff(t testing.TB, ns, dev string, pattern []byte) *wire {
	t.Helper()
	w := &wire{}
	var fd int
	err := tcxtest.Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		tv := unix.NsecToTimeval(int64(50 * time.Millisecond))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		t.Fatalf("sniff %s: %v", dev, err)
	}
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for !stop.Load() {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n <= 0 {
				continue
			}
			if bytes.Contains(buf[:n], pattern) {
				w.frames.Add(1)
			}
		}
	}()
	t.Cleanup(func() { stop.Store(true); <-done; unix.Close(fd) })
	return w
}
