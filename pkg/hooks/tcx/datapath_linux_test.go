package tcx

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	nfqueue "github.com/florianl/go-nfqueue/v2"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// testPinDir keeps the tests' pins apart from a real carbd's.
const testPinDir = "/sys/fs/bpf/carbd-test"

// env is a topology with the program attached on the router's r0.
type env struct {
	topo *tcxtest.Topology
	cfg  Config
	d    *Datapath
	qnum uint16
}

type envOpt struct {
	mode      Mode
	rules     bool // install carbd's netfilter rules in the router
	untracked bool // with the guest's networks untracked (nfrules.Config.Untracked)
	readGen   *ebpf.Map
}

func newEnv(t *testing.T, o envOpt) *env {
	t.Helper()
	topo := tcxtest.New(t)
	e := &env{topo: topo, qnum: tcxtest.QueueNum()}
	e.cfg = Config{
		SandboxID: testutil.UniqueName("sb"),
		Ifname:    topo.RouterIf,
		NetNS:     tcxtest.Path(topo.Router),
		PinDir:    testPinDir,
		Mode:      o.mode,
		ReadGen:   o.readGen,
	}
	d, err := Attach(e.cfg)
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	e.d = d
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("close: %v", err)
		}
		os.RemoveAll(filepath.Join(testPinDir, e.cfg.SandboxID))
	})
	if err := d.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	if o.rules {
		rc := e.rulesConfig()
		if o.untracked {
			rc.Untracked = []netip.Prefix{netip.PrefixFrom(topo.Guest4, 24), netip.PrefixFrom(topo.Guest6, 64)}
		}
		b, err := nfrules.Apply(rc)
		if err != nil {
			t.Fatalf("apply rules: %v", err)
		}
		t.Logf("netfilter backend: %s", b)
		t.Cleanup(func() {
			if err := nfrules.Remove(rc); err != nil {
				t.Errorf("remove rules: %v", err)
			}
		})
	}
	return e
}

func (e *env) rulesConfig() nfrules.Config {
	return nfrules.Config{SandboxID: e.cfg.SandboxID, Iface: e.topo.RouterIf, QueueNum: e.qnum, NetNS: tcxtest.Path(e.topo.Router)}
}

func (e *env) counters(t *testing.T) Counters {
	t.Helper()
	c, err := e.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitCount waits until the program has counted n more packets under r
// since base: the packets have then been decided. The limit is a hang
// guard, not a speed assertion: a frame handed to a veth is processed
// from the receiving CPU's backlog by a softirq, which a loaded machine
// (the first make test after boot: compiling while every package tests)
// can leave waiting for seconds.
func (e *env) waitCount(t *testing.T, base Counters, r Reason, n uint64) {
	t.Helper()
	var got uint64
	start := time.Now()
	if !tcxtest.Eventually(hangGuard, func() bool {
		got = e.counters(t)[r].Packets - base[r].Packets
		return got >= n
	}) {
		t.Fatalf("counter %s moved by %d in %v, want %d; counters now %+v", r, got, hangGuard, n, e.counters(t).Sub(base))
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("counter %s took %v to move by %d", r, d.Round(time.Millisecond), n)
	}
}

// hangGuard bounds the waits for what must happen.
const hangGuard = 60 * time.Second

// settle gives a packet that should not arrive the time it would take to.
func settle() { time.Sleep(200 * time.Millisecond) }

// ipPacket is the little the tests need from a queued packet.
type ipPacket struct {
	proto    uint8
	src, dst netip.Addr
	l4       []byte
	totalLen int
}

func parseIP(b []byte) (ipPacket, bool) {
	if len(b) < 20 {
		return ipPacket{}, false
	}
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0xf) * 4
		if len(b) < ihl {
			return ipPacket{}, false
		}
		return ipPacket{proto: b[9], src: netip.AddrFrom4([4]byte(b[12:16])), dst: netip.AddrFrom4([4]byte(b[16:20])),
			l4: b[ihl:], totalLen: len(b)}, true
	case 6:
		if len(b) < 40 {
			return ipPacket{}, false
		}
		return ipPacket{proto: b[6], src: netip.AddrFrom16([16]byte(b[8:24])), dst: netip.AddrFrom16([16]byte(b[24:40])),
			l4: b[40:], totalLen: len(b)}, true
	}
	return ipPacket{}, false
}

func (e *env) addrs(family int) (guest, world netip.Addr) {
	if family == 6 {
		return e.topo.Guest6, e.topo.World6
	}
	return e.topo.Guest4, e.topo.World4
}

func TestAttachModes(t *testing.T) {
	testutil.RequireTool(t, "bpftool")
	for _, mode := range []Mode{ModeAuto, ModeTCX, ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, envOpt{mode: mode})
			want := mode
			if mode == ModeAuto {
				want = ModeTCX // this kernel (6.18) has TCX: falling back would be a bug
			}
			if e.d.Mode() != want {
				t.Fatalf("attached with %s, want %s", e.d.Mode(), want)
			}
			pins := []string{"prog", "flows", "verdicts", "config", "counters"}
			if want == ModeTCX {
				pins = append(pins, "link")
			}
			for _, p := range pins {
				if _, err := os.Stat(filepath.Join(e.d.PinDir(), p)); err != nil {
					t.Errorf("pin %s: %v", p, err)
				}
			}
			id, err := e.d.ProgramID()
			if err != nil {
				t.Fatal(err)
			}
			if got := attachedIDs(t, e, want); len(got) != 1 || got[0] != id {
				t.Fatalf("programs on %s ingress: %v, want only %d", e.topo.RouterIf, got, id)
			}

			if _, err := Attach(e.cfg); !errors.Is(err, ErrExists) {
				t.Errorf("second attach: %v, want ErrExists", err)
			}

			if err := e.d.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(e.d.PinDir()); !os.IsNotExist(err) {
				t.Errorf("pin dir after close: %v", err)
			}
			if got := attachedIDs(t, e, want); len(got) != 0 {
				t.Errorf("programs on %s ingress after close: %v", e.topo.RouterIf, got)
			}
			if err := e.d.RenewLease(time.Second); !errors.Is(err, ErrClosed) {
				t.Errorf("renew after close: %v, want ErrClosed", err)
			}
			if _, err := Adopt(e.cfg); !errors.Is(err, ErrNotPinned) {
				t.Errorf("adopt after close: %v, want ErrNotPinned", err)
			}
		})
	}
}

// attachedIDs lists the programs on the router interface's ingress, as
// the kernel reports them: BPF_PROG_QUERY for TCX, bpftool (tc filters)
// for the legacy path.
func attachedIDs(t *testing.T, e *env, mode Mode) []ebpf.ProgramID {
	t.Helper()
	if mode == ModeTCX {
		var res *link.QueryResult
		err := tcxtest.Do(e.topo.Router, func() (err error) {
			res, err = link.QueryPrograms(link.QueryOptions{Target: e.d.Ifindex(), Attach: ebpf.AttachTCXIngress})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var ids []ebpf.ProgramID
		for _, p := range res.Programs {
			ids = append(ids, p.ID)
		}
		return ids
	}
	out := testutil.Run(t, "ip", "netns", "exec", e.topo.Router, "bpftool", "-j", "net", "show", "dev", e.topo.RouterIf)
	var res []struct {
		TC []struct {
			Kind string `json:"kind"`
			ID   uint32 `json:"id"`
		} `json:"tc"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("bpftool output %q: %v", out, err)
	}
	var ids []ebpf.ProgramID
	for _, r := range res {
		for _, f := range r.TC {
			if f.Kind == "clsact/ingress" {
				ids = append(ids, ebpf.ProgramID(f.ID))
			}
		}
	}
	return ids
}

// dropQueue starts a queue listener that records and drops everything.
func (e *env) dropQueue(t *testing.T) *tcxtest.Queue {
	return tcxtest.StartQueue(t, e.topo.Router, e.qnum, func(tcxtest.QueuedPacket) (int, uint32) { return nfqueue.NfDrop, 0 })
}

// queuedFrom returns the queued packets of proto from src to dst.
func queuedFrom(q *tcxtest.Queue, proto uint8, src, dst netip.Addr) []ipPacket {
	var out []ipPacket
	for _, p := range q.Packets() {
		ip, ok := parseIP(p.Payload)
		if ok && ip.proto == proto && ip.src == src && ip.dst == dst {
			out = append(out, ip)
		}
	}
	return out
}

// TestUndecidedIsQueued: with nothing decided, TCP, UDP and ICMP echo of
// both families reach the queue with the queue mark, and nothing reaches
// the world.
func TestUndecidedIsQueued(t *testing.T) {
	e := newEnv(t, envOpt{rules: true})
	var marks sync.Map
	q := tcxtest.StartQueue(t, e.topo.Router, e.qnum, func(p tcxtest.QueuedPacket) (int, uint32) {
		marks.Store(p.Mark&MarkMask, true)
		return nfqueue.NfDrop, 0
	})
	for _, fam := range []int{4, 6} {
		guest, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			l := tcxtest.Listen(t, e.topo.World, netip.AddrPortFrom(world, 8080))
			var accepted atomic.Int32
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					c.Close()
				}
			}()
			sink := tcxtest.UDPSink(t, e.topo.World, netip.AddrPortFrom(world, 9000))
			base := e.counters(t)

			if c, err := tcxtest.Dial(e.topo.Guest, "tcp", netip.AddrPortFrom(world, 8080), netip.AddrPort{}, time.Second); err == nil {
				c.Close()
				t.Fatal("TCP connect succeeded though its SYN was queued and dropped")
			}
			uc, err := tcxtest.Dial(e.topo.Guest, "udp", netip.AddrPortFrom(world, 9000), netip.AddrPort{}, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, err := uc.Write([]byte("undecided")); err != nil {
					t.Fatal(err)
				}
			}
			uc.Close()
			if tcxtest.Ping(e.topo.Guest, world, 1, 1) {
				t.Error("ping got a reply though its echo request was queued and dropped")
			}

			e.waitCount(t, base, QueueUndecided, 1+3+1)
			settle()
			if n := accepted.Load(); n != 0 {
				t.Errorf("world accepted %d TCP connections", n)
			}
			if n := sink.Packets.Load(); n != 0 {
				t.Errorf("world received %d UDP datagrams", n)
			}
			icmp := ProtoICMP
			if fam == 6 {
				icmp = ProtoICMPv6
			}
			for _, proto := range []uint8{ProtoTCP, ProtoUDP, icmp} {
				if len(queuedFrom(q, proto, guest, world)) == 0 {
					t.Errorf("no %s packet reached the queue", protoName(proto))
				}
			}
			if c := e.counters(t).Sub(base); c[PassFast].Packets != 0 {
				t.Errorf("%d packets passed on the fast path", c[PassFast].Packets)
			}
		})
	}
	marks.Range(func(k, _ any) bool {
		if k.(uint32) != MarkQueue {
			t.Errorf("a queued packet had mark %#x, want %#x", k, MarkQueue)
		}
		return true
	})
}

// TestReleasedPassesRefusedDrops: released flows cross on the fast path
// with nothing queued; refused flows are dropped in the program and the
// world sees none of their bytes, even with a queue that accepts all.
func TestReleasedPassesRefusedDrops(t *testing.T) {
	e := newEnv(t, envOpt{rules: true})
	// The queue accepts whatever reaches it: a refused packet that got
	// past the program would reach the world.
	q := tcxtest.StartQueue(t, e.topo.Router, e.qnum, func(tcxtest.QueuedPacket) (int, uint32) { return nfqueue.NfAccept, 0 })
	for _, fam := range []int{4, 6} {
		guest, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			// UDP.
			sink := tcxtest.UDPSink(t, e.topo.World, netip.AddrPortFrom(world, 9000))
			rel := FlowKey{Src: guest, Dst: world, SrcPort: 41000, DstPort: 9000, Proto: ProtoUDP}
			ref := FlowKey{Src: guest, Dst: world, SrcPort: 41001, DstPort: 9000, Proto: ProtoUDP}
			if err := e.d.Release(rel, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.d.Refuse(ref); err != nil {
				t.Fatal(err)
			}
			base := e.counters(t)
			sendUDP(t, e.topo.Guest, rel, 5, 100)
			if !tcxtest.Eventually(5*time.Second, func() bool { return sink.Packets.Load() == 5 }) {
				t.Fatalf("world got %d of 5 released datagrams", sink.Packets.Load())
			}
			sendUDP(t, e.topo.Guest, ref, 5, 100)
			e.waitCount(t, base, DropRefused, 5)
			settle()
			if n := sink.Packets.Load(); n != 5 {
				t.Errorf("world got %d datagrams, want the 5 released ones only", n)
			}
			if got := queuedFrom(q, ProtoUDP, guest, world); len(got) != 0 {
				t.Errorf("%d UDP packets were queued", len(got))
			}
			c := e.counters(t).Sub(base)
			if c[PassFast].Packets != 5 || c[DropRefused].Packets != 5 || c.Total(Queued).Packets != 0 {
				t.Errorf("counters %+v, want 5 passed fast, 5 refused, none queued", c)
			}

			// TCP: a wholly released flow connects and carries data with
			// nothing queued; a refused one never connects.
			l := tcxtest.Listen(t, e.topo.World, netip.AddrPortFrom(world, 8081))
			received := make(chan []byte, 4)
			var accepted atomic.Int32
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					go func() { b, _ := io.ReadAll(c); received <- b; c.Close() }()
				}
			}()
			relT := FlowKey{Src: guest, Dst: world, SrcPort: 42000, DstPort: 8081, Proto: ProtoTCP}
			refT := FlowKey{Src: guest, Dst: world, SrcPort: 42001, DstPort: 8081, Proto: ProtoTCP}
			if err := e.d.ReleaseFlow(relT); err != nil {
				t.Fatal(err)
			}
			if err := e.d.Refuse(refT); err != nil {
				t.Fatal(err)
			}
			base = e.counters(t)
			c1, err := tcxtest.Dial(e.topo.Guest, "tcp", netip.AddrPortFrom(world, 8081), netip.AddrPortFrom(guest, relT.SrcPort), 3*time.Second)
			if err != nil {
				t.Fatalf("released TCP flow: %v", err)
			}
			payload := strings.Repeat("released bytes ", 1000)
			if _, err := c1.Write([]byte(payload)); err != nil {
				t.Fatal(err)
			}
			c1.Close()
			select {
			case b := <-received:
				if string(b) != payload {
					t.Errorf("world received %d bytes, want %d", len(b), len(payload))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("world received nothing on the released flow")
			}
			if _, err := tcxtest.Dial(e.topo.Guest, "tcp", netip.AddrPortFrom(world, 8081), netip.AddrPortFrom(guest, refT.SrcPort), time.Second); err == nil {
				t.Fatal("refused TCP flow connected")
			}
			if n := accepted.Load(); n != 1 {
				t.Errorf("world accepted %d connections, want 1", n)
			}
			if got := queuedFrom(q, ProtoTCP, guest, world); len(got) != 0 {
				t.Errorf("%d TCP packets were queued", len(got))
			}
			if c := e.counters(t).Sub(base); c[DropRefused].Packets == 0 || c[PassFast].Packets < 3 {
				t.Errorf("counters %+v", c)
			}

			// ICMP echo, released per identifier.
			id := uint16(0x4000 + fam)
			if err := e.d.ReleaseFlow(ICMPEchoKey(guest, world, id)); err != nil {
				t.Fatal(err)
			}
			if !echo(t, e.topo.Guest, world, id, time.Second) {
				t.Error("released echo got no reply")
			}
			if err := e.d.Refuse(ICMPEchoKey(guest, world, id+100)); err != nil {
				t.Fatal(err)
			}
			if echo(t, e.topo.Guest, world, id+100, time.Second) {
				t.Error("refused echo got a reply")
			}
		})
	}
}

func sendUDP(t *testing.T, ns string, k FlowKey, n, size int) {
	t.Helper()
	c, err := tcxtest.Dial(ns, "udp", netip.AddrPortFrom(k.Dst, k.DstPort), netip.AddrPortFrom(k.Src, k.SrcPort), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range n {
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
}

// echo sends one ICMP echo request with identifier id from ns and waits
// for its reply.
func echo(t *testing.T, ns string, dst netip.Addr, id uint16, timeout time.Duration) bool {
	t.Helper()
	network, typ, reply := "ip4:icmp", byte(8), byte(0)
	if dst.Is6() {
		network, typ, reply = "ip6:ipv6-icmp", 128, 129
	}
	var c net.Conn
	if err := tcxtest.Do(ns, func() (err error) { c, err = net.Dial(network, dst.String()); return err }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 16)
	msg[0] = typ
	binary.BigEndian.PutUint16(msg[4:], id)
	binary.BigEndian.PutUint16(msg[6:], 1)
	if !dst.Is6() { // the kernel computes the ICMPv6 checksum itself
		binary.BigEndian.PutUint16(msg[2:], checksum(msg))
	}
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return false
		}
		b := buf[:n]
		if !dst.Is6() && n >= 20 { // raw IPv4 sockets return the IP header
			b = b[int(b[0]&0xf)*4:]
		}
		if len(b) >= 8 && b[0] == reply && binary.BigEndian.Uint16(b[4:]) == id {
			return true
		}
	}
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// verdictLoop is a minimal stand-in for carbd's verdict loop: it decides
// every TCP packet from the guest as released, extending the flow's byte
// range to the end of each request it sees, and accepts with NF_REPEAT and
// the pass mark so the packet runs the host's rules again (as the real
// loop should). It records the requests it decided.
type verdictLoop struct {
	mu       sync.Mutex
	requests []string
}

func (v *verdictLoop) start(t *testing.T, e *env) *tcxtest.Queue {
	return tcxtest.StartQueue(t, e.topo.Router, e.qnum, func(p tcxtest.QueuedPacket) (int, uint32) {
		ip, ok := parseIP(p.Payload)
		if !ok || ip.proto != ProtoTCP || len(ip.l4) < 20 {
			return nfqueue.NfDrop, 0
		}
		th := ip.l4
		k := FlowKey{Src: ip.src, Dst: ip.dst, SrcPort: binary.BigEndian.Uint16(th[0:]), DstPort: binary.BigEndian.Uint16(th[2:]), Proto: ProtoTCP}
		seq := binary.BigEndian.Uint32(th[4:])
		data := th[int(th[12]>>4)*4:]
		end := seq + uint32(len(data))
		if th[13]&tcpSYN != 0 {
			end = seq + 1
		}
		if len(data) > 0 {
			v.mu.Lock()
			v.requests = append(v.requests, string(data))
			v.mu.Unlock()
		}
		if err := e.d.Release(k, end); err != nil {
			t.Errorf("release %v: %v", k, err)
			return nfqueue.NfDrop, 0
		}
		return nfqueue.NfRepeat, p.Mark&^MarkMask | MarkPass
	})
}

func (v *verdictLoop) decided() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.requests...)
}

// TestByteRangeKeepAlive: on a kept-alive HTTP connection, each request
// is queued and decided on its own; the ACKs between them pass fast.
func TestByteRangeKeepAlive(t *testing.T) {
	e := newEnv(t, envOpt{rules: true})
	for _, fam := range []int{4, 6} {
		_, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			loop := &verdictLoop{}
			q := loop.start(t, e)
			l := tcxtest.Listen(t, e.topo.World, netip.AddrPortFrom(world, 8082))
			var remotes sync.Map
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				remotes.Store(r.RemoteAddr, true)
				io.WriteString(w, "ok "+r.URL.Path)
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })

			client := &http.Client{Transport: &http.Transport{
				DisableCompression: true,
				MaxConnsPerHost:    1,
				DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
					return tcxtest.Dial(e.topo.Guest, network, netip.MustParseAddrPort(addr), netip.AddrPort{}, 3*time.Second)
				},
			}, Timeout: 5 * time.Second}
			defer client.CloseIdleConnections()
			base := e.counters(t)
			url := "http://" + netip.AddrPortFrom(world, 8082).String()
			for _, path := range []string{"/one", "/two"} {
				resp, err := client.Get(url + path)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != "ok "+path {
					t.Fatalf("GET %s: %q", path, b)
				}
			}
			n := 0
			remotes.Range(func(any, any) bool { n++; return true })
			if n != 1 {
				t.Fatalf("the two requests came on %d connections, want 1 kept alive", n)
			}
			reqs := loop.decided()
			if len(reqs) != 2 || !strings.HasPrefix(reqs[0], "GET /one ") || !strings.HasPrefix(reqs[1], "GET /two ") {
				t.Fatalf("the loop decided %q, want the two requests, each on its own", reqs)
			}
			c := e.counters(t).Sub(base)
			if c[QueueBeyondRange].Packets != 2 {
				t.Errorf("%d packets queued beyond the released range, want 2 (the requests)", c[QueueBeyondRange].Packets)
			}
			if c[PassFast].Packets == 0 {
				t.Error("no packet passed on the fast path (the ACKs should)")
			}
			t.Logf("queued %d packets, counters %+v", len(q.Packets()), c)
		})
	}
}

// TestLeaseExpiry: when the lease runs out everything is dropped, ARP
// and ND excepted; renewing restores the fast path.
func TestLeaseExpiry(t *testing.T) {
	e := newEnv(t, envOpt{})
	for _, fam := range []int{4, 6} {
		guest, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			sink := tcxtest.UDPSink(t, e.topo.World, netip.AddrPortFrom(world, 9001))
			k := FlowKey{Src: guest, Dst: world, SrcPort: 43000, DstPort: 9001, Proto: ProtoUDP}
			if err := e.d.Release(k, 0); err != nil {
				t.Fatal(err)
			}
			if err := e.d.RenewLease(time.Hour); err != nil {
				t.Fatal(err)
			}
			sendUDP(t, e.topo.Guest, k, 2, 50)
			if !tcxtest.Eventually(5*time.Second, func() bool { return sink.Packets.Load() == 2 }) {
				t.Fatalf("with a lease, world got %d of 2", sink.Packets.Load())
			}

			// Expire it; forget the neighbours so the guest must resolve
			// the router again (ARP / ND) before sending.
			if err := e.d.RenewLease(0); err != nil {
				t.Fatal(err)
			}
			if left, err := e.d.LeaseRemaining(); err != nil || left > 0 {
				t.Fatalf("lease remaining %v, %v", left, err)
			}
			testutil.Run(t, "ip", "-n", e.topo.Guest, "neigh", "flush", "dev", e.topo.GuestIf)
			base := e.counters(t)
			sendUDP(t, e.topo.Guest, k, 5, 50)
			e.waitCount(t, base, DropNoDaemon, 5)
			settle()
			if n := sink.Packets.Load(); n != 2 {
				t.Errorf("world got %d datagrams after the lease ended, want still 2", n-2)
			}
			if c := e.counters(t).Sub(base); c[PassLinkLocal].Packets == 0 {
				t.Errorf("no ARP/ND passed while the lease was out: %+v", c)
			}

			// A short lease lapses by itself.
			if err := e.d.RenewLease(100 * time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			base = e.counters(t)
			sendUDP(t, e.topo.Guest, k, 1, 50)
			e.waitCount(t, base, DropNoDaemon, 1)

			// KeepAlive brings it back.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- e.d.KeepAlive(ctx, 50*time.Millisecond, 200*time.Millisecond) }()
			tcxtest.Eventually(time.Second, func() bool { left, _ := e.d.LeaseRemaining(); return left > 0 })
			sendUDP(t, e.topo.Guest, k, 3, 50)
			if !tcxtest.Eventually(5*time.Second, func() bool { return sink.Packets.Load() == 5 }) {
				t.Errorf("with keepalive, world got %d of 3", sink.Packets.Load()-2)
			}
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestFragmentsReassembledBeforeQueue: every fragment is marked for the
// queue, and netfilter's defragmenter hands the queue the whole datagram,
// with the sandbox's traffic tracked or untracked (the defragmenter runs
// before the raw table).
func TestFragmentsReassembledBeforeQueue(t *testing.T) {
	for _, untracked := range []bool{false, true} {
		t.Run(fmt.Sprint("untracked=", untracked), func(t *testing.T) { testFragmentsReassembled(t, untracked) })
	}
}

func testFragmentsReassembled(t *testing.T, untracked bool) {
	e := newEnv(t, envOpt{rules: true, untracked: untracked})
	q := e.dropQueue(t)
	for _, fam := range []int{4, 6} {
		guest, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			k := FlowKey{Src: guest, Dst: world, SrcPort: 44000, DstPort: 9002, Proto: ProtoUDP}
			// Even released: a fragment has no ports to look up.
			if err := e.d.Release(k, 0); err != nil {
				t.Fatal(err)
			}
			base := e.counters(t)
			const size = 4000 // over the 1500-byte MTU: three fragments
			sendUDP(t, e.topo.Guest, k, 1, size)
			e.waitCount(t, base, QueueFragment, 3)
			var got []ipPacket
			tcxtest.Eventually(5*time.Second, func() bool { got = queuedFrom(q, ProtoUDP, guest, world); return len(got) > 0 })
			settle()
			got = queuedFrom(q, ProtoUDP, guest, world)
			if len(got) != 1 {
				t.Fatalf("queue got %d UDP packets, want 1 reassembled datagram", len(got))
			}
			hdr := 20
			if fam == 6 {
				hdr = 40
			}
			if got[0].totalLen != hdr+8+size {
				t.Errorf("queued packet of %d bytes, want %d (whole datagram)", got[0].totalLen, hdr+8+size)
			}
			if c := e.counters(t).Sub(base); c[PassFast].Packets != 0 {
				t.Errorf("%d fragments passed on the fast path", c[PassFast].Packets)
			}
		})
	}
}

// TestOpaqueProtocolQueued: an IP protocol the program does not know
// reaches the queue, never the world directly.
func TestOpaqueProtocolQueued(t *testing.T) {
	e := newEnv(t, envOpt{rules: true})
	q := e.dropQueue(t)
	for _, fam := range []int{4, 6} {
		guest, world := e.addrs(fam)
		t.Run(fmt.Sprint("ipv", fam), func(t *testing.T) {
			sink := tcxtest.RawSink(t, e.topo.World, fam, 253)
			base := e.counters(t)
			for range 3 {
				if err := tcxtest.SendRaw(e.topo.Guest, world, 253, []byte("opaque payload")); err != nil {
					t.Fatal(err)
				}
			}
			e.waitCount(t, base, QueueOpaque, 3)
			settle()
			if n := sink.Packets.Load(); n != 0 {
				t.Errorf("world received %d packets of protocol 253", n)
			}
			if got := queuedFrom(q, 253, guest, world); len(got) != 3 {
				t.Errorf("queue got %d packets of protocol 253, want 3", len(got))
			}
		})
	}
}

// TestLayer2Dropped: tagged frames and non-IP ethertypes from the guest
// are dropped. The receiving stack moves an in-frame 802.1Q tag into the
// skb before TC, so this exercises the program's vlan_present check;
// TestProgram covers the tag left in the frame.
func TestLayer2Dropped(t *testing.T) {
	e := newEnv(t, envOpt{})
	inner := ipv4(17, e.topo.Guest4.String(), e.topo.World4.String(), udp(1000, 2000, bytesN(20)))
	for _, tc := range []struct {
		name  string
		frame []byte
		want  Reason
	}{
		{"802.1q", ether(0x8100, append([]byte{0, 100, 0x08, 0x00}, inner...)), DropVLAN},
		{"802.1ad", ether(0x88a8, append([]byte{0, 100, 0x81, 0x00, 0, 200, 0x08, 0x00}, inner...)), DropVLAN},
		{"lldp", ether(0x88cc, bytesN(46)), DropNonIP},
		{"pppoe", ether(0x8864, bytesN(46)), DropNonIP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := e.counters(t)
			for range 2 {
				if err := tcxtest.SendFrame(e.topo.Guest, e.topo.GuestIf, tc.frame); err != nil {
					t.Fatal(err)
				}
			}
			e.waitCount(t, base, tc.want, 2)
		})
	}
}

// The child side of TestAdoptAfterCrash: attach, decide two flows, renew
// the lease briefly, then exit without closing anything.
func TestAdoptChildProcess(t *testing.T) {
	cfgEnv := os.Getenv("CARBD_TCX_CHILD")
	if cfgEnv == "" {
		t.Skip("helper process for TestAdoptAfterCrash")
	}
	f := strings.Split(cfgEnv, ",")
	mode, _ := strconv.Atoi(f[3])
	d, err := Attach(Config{SandboxID: f[0], Ifname: "r0", NetNS: f[1], PinDir: f[2], Mode: Mode(mode)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child attach:", err)
		os.Exit(3)
	}
	for i, spec := range f[4:] {
		parts := strings.Split(spec, "|")
		port, _ := strconv.Atoi(parts[2])
		k := FlowKey{Src: netip.MustParseAddr(parts[0]), Dst: netip.MustParseAddr(parts[1]), SrcPort: uint16(40000 + i), DstPort: uint16(port), Proto: ProtoUDP}
		if parts[3] == "release" {
			err = d.Release(k, 0)
		} else {
			err = d.Refuse(k)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "child verdict:", err)
			os.Exit(3)
		}
	}
	if err := d.RenewLease(300 * time.Millisecond); err != nil {
		os.Exit(3)
	}
	os.Exit(0) // a crash: no Close, no Leave
}

// TestAdoptAfterCrash: a carbd that dies leaves its program enforcing;
// once its lease lapses everything drops; a new carbd adopts the pins,
// finds the verdicts, renews the lease and swaps the program in place
// with no packet escaping.
func TestAdoptAfterCrash(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			topo := tcxtest.New(t)
			id := testutil.UniqueName("sb")
			cfg := Config{SandboxID: id, Ifname: topo.RouterIf, NetNS: tcxtest.Path(topo.Router), PinDir: testPinDir, Mode: mode}
			t.Cleanup(func() {
				if d, err := Adopt(cfg); err == nil {
					d.Close()
				}
				os.RemoveAll(filepath.Join(testPinDir, id))
			})
			released := FlowKey{Src: topo.Guest4, Dst: topo.World4, SrcPort: 40000, DstPort: 9003, Proto: ProtoUDP}
			refused := FlowKey{Src: topo.Guest4, Dst: topo.World4, SrcPort: 40001, DstPort: 9003, Proto: ProtoUDP}
			relSink := tcxtest.UDPSink(t, topo.World, netip.AddrPortFrom(topo.World4, 9003))

			cmd := exec.Command(os.Args[0], "-test.run=^TestAdoptChildProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(), "CARBD_TCX_CHILD="+strings.Join([]string{
				id, cfg.NetNS, testPinDir, fmt.Sprint(int(mode)),
				fmt.Sprintf("%s|%s|%d|release", released.Src, released.Dst, released.DstPort),
				fmt.Sprintf("%s|%s|%d|refuse", refused.Src, refused.Dst, refused.DstPort),
			}, ","))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			if _, err := os.Stat(filepath.Join(testPinDir, id, "config")); err != nil {
				t.Fatalf("child left no pins: %v", err)
			}
			if _, err := Attach(cfg); !errors.Is(err, ErrExists) {
				t.Fatalf("attach over a crashed carbd's pins: %v, want ErrExists", err)
			}

			// The child's lease lapses: the released flow is dropped. No
			// netfilter rules here, so a detached program would let it
			// through.
			time.Sleep(500 * time.Millisecond)
			sendUDP(t, topo.Guest, released, 5, 20)
			settle()
			if n := relSink.Packets.Load(); n != 0 {
				t.Fatalf("world got %d datagrams with the carbd gone", n)
			}

			d, err := Adopt(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if d.Mode() != mode {
				t.Errorf("adopted mode %s, want %s", d.Mode(), mode)
			}
			c, err := d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if c[DropNoDaemon].Packets < 5 {
				t.Errorf("adopted counters show %d no-daemon drops, want at least 5", c[DropNoDaemon].Packets)
			}
			if v, err := d.Verdict(released); err != nil || v.Action != Released {
				t.Errorf("adopted verdict of the released flow: %+v %v", v, err)
			}
			if err := d.RenewLease(time.Hour); err != nil {
				t.Fatal(err)
			}
			sendUDP(t, topo.Guest, released, 3, 20)
			if !tcxtest.Eventually(5*time.Second, func() bool { return relSink.Packets.Load() == 3 }) {
				t.Fatalf("after adoption world got %d of 3 released datagrams", relSink.Packets.Load())
			}

			// Swap the program while the guest streams the refused flow:
			// every packet must be seen, and dropped, by the old or the new
			// program.
			oldID, _ := d.ProgramID()
			base, _ := d.Counters()
			conn, err := tcxtest.Dial(topo.Guest, "udp", netip.AddrPortFrom(refused.Dst, refused.DstPort), netip.AddrPortFrom(refused.Src, refused.SrcPort), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var sent atomic.Int64
			stop := make(chan struct{})
			streamDone := make(chan struct{})
			go func() {
				defer close(streamDone)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := conn.Write([]byte("must not escape")); err == nil {
						sent.Add(1)
					}
				}
			}()
			tcxtest.Eventually(5*time.Second, func() bool { return sent.Load() > 200 })
			if err := d.ReplaceProgram(); err != nil {
				t.Fatal(err)
			}
			n := sent.Load()
			tcxtest.Eventually(5*time.Second, func() bool { return sent.Load() > n+200 })
			close(stop)
			<-streamDone
			conn.Close()
			total := uint64(sent.Load())
			var got uint64
			tcxtest.Eventually(5*time.Second, func() bool {
				c, _ := d.Counters()
				got = c[DropRefused].Packets - base[DropRefused].Packets
				return got >= total
			})
			if got != total {
				t.Errorf("sent %d refused datagrams across the swap, programs dropped %d", total, got)
			}
			t.Logf("%d refused datagrams streamed across the swap, all dropped", total)
			if n := relSink.Packets.Load(); n != 3 {
				t.Errorf("world got %d datagrams, want the 3 released only", n)
			}
			newID, _ := d.ProgramID()
			if newID == oldID {
				t.Errorf("program id %d unchanged by ReplaceProgram", newID)
			}
			// The new program is the one pinned, and the one attached.
			if d2, err := Adopt(cfg); err != nil {
				t.Error(err)
			} else {
				if id2, _ := d2.ProgramID(); id2 != newID {
					t.Errorf("pinned program %d, want %d", id2, newID)
				}
				d2.Leave()
			}
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRemoveAbandoned: a datapath left behind (Leave, as a crash would)
// is detached and unpinned by Remove from another handle; Remove of
// nothing is no error.
func TestRemoveAbandoned(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, envOpt{mode: mode})
			if err := e.d.Leave(); err != nil {
				t.Fatal(err)
			}
			if got := attachedIDs(t, e, mode); len(got) != 1 {
				t.Fatalf("after Leave: programs %v, want the one left enforcing", got)
			}
			if err := Remove(e.cfg); err != nil {
				t.Fatal(err)
			}
			if got := attachedIDs(t, e, mode); len(got) != 0 {
				t.Errorf("after Remove: programs %v", got)
			}
			if _, err := os.Stat(e.d.PinDir()); !os.IsNotExist(err) {
				t.Errorf("pin dir after Remove: %v", err)
			}
			if err := Remove(e.cfg); err != nil {
				t.Errorf("Remove of nothing: %v", err)
			}
		})
	}
}

// TestCloseAfterInterfaceGone: the guest's interface may vanish first
// (the VM exits and its tap goes); Close still cleans up.
func TestCloseAfterInterfaceGone(t *testing.T) {
	for _, mode := range []Mode{ModeTCX, ModeLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, envOpt{mode: mode})
			testutil.Run(t, "ip", "-n", e.topo.Router, "link", "del", e.topo.RouterIf)
			if err := e.d.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(e.d.PinDir()); !os.IsNotExist(err) {
				t.Errorf("pin dir after close: %v", err)
			}
		})
	}
}

// TestLegacyLeavesForeignFilter: when another filter holds priority 1 on
// the interface, the legacy attach fails and leaves that filter alone.
func TestLegacyLeavesForeignFilter(t *testing.T) {
	topo := tcxtest.New(t)
	// The foreign filter: a cls_bpf filter of another name at priority 1,
	// handle 1 (this kernel has no matchall or u32 to use instead).
	prog, objs, err := load(64, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	defer objs.close()
	var ifindex int
	if err := tcxtest.Do(topo.Router, func() error {
		ifi, err := net.InterfaceByName(topo.RouterIf)
		if err == nil {
			ifindex = ifi.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := attachLegacy(tcxtest.Path(topo.Router), ifindex, prog, "foreign"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{SandboxID: testutil.UniqueName("sb"), Ifname: topo.RouterIf, NetNS: tcxtest.Path(topo.Router), PinDir: testPinDir, Mode: ModeLegacy}
	if d, err := Attach(cfg); err == nil {
		d.Close()
		t.Fatal("attached over a foreign filter")
	}
	out := testutil.Run(t, "ip", "netns", "exec", topo.Router, "tc", "filter", "show", "dev", topo.RouterIf, "ingress")
	if !strings.Contains(out, "foreign") {
		t.Errorf("the foreign filter is gone:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(testPinDir, cfg.SandboxID)); !os.IsNotExist(err) {
		t.Errorf("failed attach left pins: %v", err)
	}
}
