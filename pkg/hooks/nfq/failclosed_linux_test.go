package nfq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// TestLoopChildProcess is the carbd that TestKill9 kills: it adopts the
// pinned data path, keeps its lease alive, runs a loop that releases
// allowed.test and holds held.test forever, prints "ready" and waits.
func TestLoopChildProcess(t *testing.T) {
	spec := os.Getenv("CARBD_NFQ_CHILD")
	if spec == "" {
		t.Skip("helper process for TestKill9")
	}
	f := strings.Split(spec, "|")
	qnum, _ := strconv.Atoi(f[2])
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	dp, err := tcx.Adopt(tcx.Config{SandboxID: f[0], NetNS: f[1], PinDir: testPinDir})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	go dp.KeepAlive(ctx, 100*time.Millisecond, time.Second)
	dec := newScripted()
	dec.on(Release, host("allowed.test"))
	dec.on(Hold, host("held.test"))
	l, err := New(Config{QueueNum: uint16(qnum), NetNS: f[1], MaxQueueLen: 1024, Decider: dec, Datapath: dp, HoldTimeout: time.Hour})
	if err != nil {
		fail(err)
	}
	go func() { fail(fmt.Errorf("loop ended: %v", l.Run(ctx))) }()
	<-l.Ready()
	go func() {
		for range dec.held {
			fmt.Println("held")
		}
	}()
	fmt.Println("ready")
	select {}
}

// TestKill9: kill -9 of the process running the loop while a request is
// held: nothing reaches the world, during the outage nothing passes, and
// a new loop on the same queue (the data path adopted) enforces again.
func TestKill9(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{noLoop: true})
	tcfg := tcx.Config{SandboxID: e.id, NetNS: tcxtest.Path(e.topo.Router), PinDir: testPinDir}
	if err := e.dp.Leave(); err != nil { // the child owns it now
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(e.topo.World4, 8086)
	srv := httpServer(t, e.topo.World, addr)
	udp := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(e.topo.World4, 9120))

	cmd := exec.Command(os.Args[0], "-test.run=^TestLoopChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "CARBD_NFQ_CHILD="+strings.Join([]string{e.id, tcxtest.Path(e.topo.Router), fmt.Sprint(e.qnum)}, "|"))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok || l != want {
				t.Fatalf("child said %q (open %v), want %q", l, ok, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("child did not say %q", want)
		}
	}
	expect("ready")

	// The child enforces: a released request completes.
	if out, errOut, code := curl(t, e.topo.Guest, "-H", "Host: allowed.test", urlOf(addr, "/before")); code != 0 {
		t.Fatalf("released request through the child: exit %d %q %s", code, out, errOut)
	}
	type res struct {
		err  string
		code int
	}
	heldDone := make(chan res, 1)
	go func() {
		_, er, c := curl(t, e.topo.Guest, "-H", "Host: held.test", "--max-time", "60", urlOf(addr, "/held"))
		heldDone <- res{er, c}
	}()
	expect("held")
	q, err := readQueueProc(tcxtest.Path(e.topo.Router), e.qnum)
	if err != nil || q.Total == 0 {
		t.Fatalf("the kernel queue holds %d packets (%v), want the held request", q.Total, err)
	}
	before := srv.bytes.Load()

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	// The queue went with the process: its held packets were dropped.
	if _, err := readQueueProc(tcxtest.Path(e.topo.Router), e.qnum); !errors.Is(err, ErrNoQueue) {
		t.Fatalf("queue after the kill: %v, want gone", err)
	}
	// Outage: the lease lapses within a second; nothing passes, released
	// flows included.
	time.Sleep(1500 * time.Millisecond)
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9120), 43120, []byte("during the outage"))
	if _, _, code := curl(t, e.topo.Guest, "-H", "Host: allowed.test", "--max-time", "2", urlOf(addr, "/outage")); code == 0 {
		t.Fatal("a request passed with no carbd running")
	}
	settle()
	if n := srv.bytes.Load() - before; n != 0 {
		t.Fatalf("the world read %d bytes while carbd was dead", n)
	}
	if udp.n.Load() != 0 {
		t.Fatal("a datagram passed while carbd was dead")
	}
	select {
	case r := <-heldDone:
		t.Fatalf("the held request's client finished during the outage: %+v", r)
	default:
	}

	// Restart: adopt the data path, a new loop on the same queue. The
	// held request's client retransmits; it is decided afresh (refused).
	dp, err := tcx.Adopt(tcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Leave() })
	if err := dp.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	e.dp = dp
	e.dec.on(Release, host("allowed.test"))
	e.dec.on(Release, dstPort(9120))
	e.start(t, nil)
	r := <-heldDone
	if r.code != 56 {
		t.Fatalf("the held request after the restart: curl exit %d %s, want 56 (reset: refused)", r.code, r.err)
	}
	if n := srv.bytes.Load() - before; n != 0 {
		t.Fatalf("the world read %d bytes of the held request", n)
	}
	if ds := e.dec.decisions(func(d decision) bool { return d.ev.Dest.Host == "held.test" }); len(ds) != 1 || ds[0].meta.Span != 1 {
		e.dec.log(t)
		t.Fatalf("the held request was decided %d times after the restart (want once, parsed as a request)", len(ds))
	}
	out, errOut, code := curl(t, e.topo.Guest, "-H", "Host: allowed.test", urlOf(addr, "/after"))
	if code != 0 || !strings.HasPrefix(out, "GET /after ") {
		t.Fatalf("released request after the restart: exit %d %q %s", code, out, errOut)
	}
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9120), 43121, []byte("after"))
	if !tcxtest.Eventually(10*time.Second, func() bool { return udp.n.Load() == 1 }) {
		t.Fatal("a released datagram did not pass after the restart")
	}
}

// TestFlood: many more new flows than the queue holds, sent as fast as
// the guest can: the kernel drops what does not fit (never accepts), and
// the world sees only datagrams of flows the loop released.
func TestFlood(t *testing.T) {
	e := newEnv(t, envOpt{cfg: func(c *Config) { c.MaxQueueLen = 64 }})
	e.dec.on(Release, func(m Meta, _ *decide.Event) bool { return m.Flow.DstPort%2 == 0 })
	const n = 3000
	seen := sync.Map{}
	// Go's raw IPv4 socket strips the IP header: b starts at UDP.
	got := tcxtest.RawSinkFunc(t, e.topo.World, 4, 17, func(b []byte) bool {
		if len(b) < 8 {
			return false
		}
		port := uint16(b[2])<<8 | uint16(b[3])
		if port >= 20000 && port < 20000+n {
			seen.Store(port, true)
			return true
		}
		return false
	})
	var c net.PacketConn
	if err := tcxtest.Do(e.topo.Guest, func() (err error) { c, err = net.ListenPacket("udp4", ":0"); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < n; i++ {
		dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(e.topo.World4, uint16(20000+i)))
		c.WriteTo([]byte("flood"), dst)
	}
	s := e.waitStats(t, "the flood to be decided", func(s *Stats) bool {
		return s.Held == 0 && s.Received+uint64(s.Kernel.Dropped)+uint64(s.Kernel.UserDropped) >= n
	})
	settle()
	released := map[uint16]bool{}
	for _, d := range e.dec.decisions(func(d decision) bool { return d.out.Verdict == Release }) {
		released[d.meta.Flow.DstPort] = true
	}
	bad := 0
	seen.Range(func(k, _ any) bool {
		if p := k.(uint16); p%2 != 0 || !released[p] {
			bad++
		}
		return true
	})
	if bad != 0 {
		t.Fatalf("%d flows reached the world without being released", bad)
	}
	if s.Kernel.Dropped == 0 {
		t.Errorf("the queue never overflowed (%s): the flood did not exceed MaxQueueLen", s.String())
	}
	t.Logf("%d datagrams sent, %d queued, %d dropped by the full queue, %d socket overruns, %d released flows arrived",
		n, s.Received, s.Kernel.Dropped, s.Kernel.UserDropped, got.Packets.Load())
}

// TestShutdownDropsHeld: stopping the loop drops every held packet with
// its own verdict; afterwards the queue has no listener and drops.
func TestShutdownDropsHeld(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{})
	e.dec.on(Hold, host("held.test"))
	e.dec.on(Release, dstPort(9130))
	addr := netip.AddrPortFrom(e.topo.World4, 8087)
	srv := httpServer(t, e.topo.World, addr)
	udp := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(e.topo.World4, 9130))
	done := make(chan int, 1)
	go func() {
		_, _, code := curl(t, e.topo.Guest, "-H", "Host: held.test", "--max-time", "4", urlOf(addr, "/held"))
		done <- code
	}()
	e.dec.waitHeld(t)
	held := e.loop.Stats().Held
	if held == 0 {
		t.Fatal("nothing held")
	}
	e.stop()
	s := e.loop.Stats()
	if s.Held != 0 || s.Verdicts[DropShutdown] < uint64(held) {
		t.Fatalf("after stop: %s, want the %d held packets dropped for shutdown", s.String(), held)
	}
	checkInvariant(t, &s)
	if code := <-done; code == 0 {
		t.Fatal("the held request completed after the loop stopped")
	}
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9130), 0, []byte("no listener"))
	settle()
	if srv.bytes.Load() != 0 || udp.n.Load() != 0 {
		t.Fatal("traffic passed with the loop stopped")
	}
}

// TestWorkerPanic: a panic while handling a packet drops that packet, the
// loop goes on deciding the others.
func TestWorkerPanic(t *testing.T) {
	e := newEnv(t, envOpt{hook: func(p *packet) {
		if p.pk.hasKey && p.pk.key.DstPort == 9666 {
			panic("test panic")
		}
	}, allowPanics: true})
	e.dec.on(Release, anything)
	ok := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(e.topo.World4, 9140))
	boom := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(e.topo.World4, 9666))
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9666), 0, []byte("boom"))
	e.waitStats(t, "the panic", func(s *Stats) bool { return s.Panics == 1 && s.Verdicts[DropPanic] == 1 })
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9140), 0, []byte("after"))
	if !tcxtest.Eventually(10*time.Second, func() bool { return ok.n.Load() == 1 }) {
		t.Fatal("the loop stopped deciding after a worker panic")
	}
	if boom.n.Load() != 0 {
		t.Fatal("the packet the worker panicked on was forwarded")
	}
}

// TestRevokeOpen: an opaque stream released to its end is decided again
// at its next packet after RevokeOpen (the agent read new sensitive data).
func TestRevokeOpen(t *testing.T) {
	e := newEnv(t, envOpt{})
	var mu sync.Mutex
	allow := true
	e.dec.on(Release, func(m Meta, _ *decide.Event) bool {
		mu.Lock()
		defer mu.Unlock()
		return m.Flow.DstPort == 9150 && allow
	})
	addr := netip.AddrPortFrom(e.topo.World4, 9150)
	l := &counted{Listener: tcxtest.Listen(t, e.topo.World, addr)}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	c, err := tcxtest.Dial(e.topo.Guest, "tcp", addr, netip.AddrPort{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := "\x00\x01opaque protocol hello"
	if _, err := c.Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	if !tcxtest.Eventually(10*time.Second, func() bool { return l.bytes.Load() == int64(len(first)) }) {
		t.Fatalf("the released stream's first bytes did not arrive (%d)", l.bytes.Load())
	}
	recv := e.loop.Stats().Received
	if _, err := c.Write([]byte("more of the stream")); err != nil {
		t.Fatal(err)
	}
	want := int64(len(first) + len("more of the stream"))
	if !tcxtest.Eventually(10*time.Second, func() bool { return l.bytes.Load() == want }) {
		t.Fatal("the released stream's later bytes did not arrive")
	}
	if n := e.loop.Stats().Received - recv; n != 0 {
		t.Errorf("%d packets of the released stream were queued, want the fast path", n)
	}
	mu.Lock()
	allow = false
	mu.Unlock()
	if n := e.loop.RevokeOpen(); n != 1 {
		t.Fatalf("RevokeOpen revoked %d flows, want 1", n)
	}
	c.Write([]byte("after the agent read a secret"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("read after the revoked stream was refused: %v, want a reset", err)
	}
	if n := l.bytes.Load(); n != want {
		t.Fatalf("the world read %d bytes after the revocation", n-want)
	}
	ds := e.dec.decisions(func(d decision) bool { return d.meta.Flow.DstPort == 9150 })
	if len(ds) != 2 || !ds[1].meta.Redecide {
		e.dec.log(t)
		t.Fatalf("%d decisions for the stream, want 2 (the second a re-decision)", len(ds))
	}
}

// TestRulesNoListener: with carbd's rules and data path but no loop, the
// queue drops (no bypass): the baseline every other test builds on.
func TestRulesNoListener(t *testing.T) {
	e := newEnv(t, envOpt{noLoop: true})
	udp := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(e.topo.World4, 9160))
	sendUDP(t, e.topo.Guest, netip.AddrPortFrom(e.topo.World4, 9160), 0, []byte("undecided"))
	settle()
	if udp.n.Load() != 0 {
		t.Fatal("an undecided datagram passed with no verdict loop")
	}
	if _, err := readQueueProc(tcxtest.Path(e.topo.Router), e.qnum); !errors.Is(err, ErrNoQueue) {
		t.Fatalf("queue without a loop: %v", err)
	}
}
