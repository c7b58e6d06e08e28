//go:build linux

package tcxtest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	nfqueue "github.com/florianl/go-nfqueue/v2"
	"golang.org/x/sys/unix"
)

// Topology is the guest, router and world namespaces.
type Topology struct {
	Guest, Router, World string // namespace names (ip netns)

	GuestIf, RouterIf, RouterWorldIf, WorldIf string

	Guest4, Router4, RouterWorld4, World4 netip.Addr
	Guest6, Router6, RouterWorld6, World6 netip.Addr
}

// Path returns the bind-mount path of a namespace made by ip netns.
func Path(ns string) string { return "/run/netns/" + ns }

// New builds the topology. The links are up, ready to transmit (see
// testutil.WaitLinkReady) and routed, IPv6 duplicate address detection is
// off, and the router forwards both families.
func New(tb testing.TB) *Topology {
	tb.Helper()
	testutil.RequireRoot(tb)
	testutil.RequireTool(tb, "ip")
	t := &Topology{
		Guest: testutil.NewNetNS(tb), Router: testutil.NewNetNS(tb), World: testutil.NewNetNS(tb),
		GuestIf: "g0", RouterIf: "r0", RouterWorldIf: "r1", WorldIf: "w0",
		Guest4: netip.MustParseAddr("10.77.1.2"), Router4: netip.MustParseAddr("10.77.1.1"),
		RouterWorld4: netip.MustParseAddr("10.77.2.1"), World4: netip.MustParseAddr("10.77.2.2"),
		Guest6: netip.MustParseAddr("fd77:1::2"), Router6: netip.MustParseAddr("fd77:1::1"),
		RouterWorld6: netip.MustParseAddr("fd77:2::1"), World6: netip.MustParseAddr("fd77:2::2"),
	}
	for _, ns := range []string{t.Guest, t.Router, t.World} {
		sysctl(tb, ns, "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0",
			"net.ipv6.conf.default.router_solicitations=0")
	}
	sysctl(tb, t.Router, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	testutil.Run(tb, "ip", "link", "add", t.GuestIf, "netns", t.Guest, "type", "veth", "peer", "name", t.RouterIf, "netns", t.Router)
	testutil.Run(tb, "ip", "link", "add", t.RouterWorldIf, "netns", t.Router, "type", "veth", "peer", "name", t.WorldIf, "netns", t.World)
	for _, a := range []struct {
		ns, dev string
		v4, v6  netip.Addr
	}{
		{t.Guest, t.GuestIf, t.Guest4, t.Guest6},
		{t.Router, t.RouterIf, t.Router4, t.Router6},
		{t.Router, t.RouterWorldIf, t.RouterWorld4, t.RouterWorld6},
		{t.World, t.WorldIf, t.World4, t.World6},
	} {
		testutil.Run(tb, "ip", "-n", a.ns, "addr", "add", a.v4.String()+"/24", "dev", a.dev)
		testutil.Run(tb, "ip", "-n", a.ns, "addr", "add", a.v6.String()+"/64", "dev", a.dev, "nodad")
		testutil.Run(tb, "ip", "-n", a.ns, "link", "set", a.dev, "up")
	}
	// Until the kernel has activated a link's qdisc, frames sent on it
	// are dropped silently (TestLayer2Dropped lost its first 802.1Q
	// frames to the guest link's noop qdisc on a busy machine).
	for _, l := range [][2]string{{t.Guest, t.GuestIf}, {t.Router, t.RouterIf}, {t.Router, t.RouterWorldIf}, {t.World, t.WorldIf}} {
		testutil.WaitLinkReady(tb, l[0], l[1])
	}
	testutil.Run(tb, "ip", "-n", t.Guest, "route", "add", "default", "via", t.Router4.String())
	testutil.Run(tb, "ip", "-n", t.Guest, "-6", "route", "add", "default", "via", t.Router6.String())
	testutil.Run(tb, "ip", "-n", t.World, "route", "add", "default", "via", t.RouterWorld4.String())
	testutil.Run(tb, "ip", "-n", t.World, "-6", "route", "add", "default", "via", t.RouterWorld6.String())
	return t
}

func sysctl(tb testing.TB, ns string, kv ...string) {
	tb.Helper()
	testutil.Run(tb, "ip", append([]string{"netns", "exec", ns, "sysctl", "-q", "-w"}, kv...)...)
}

// Do runs fn inside namespace ns (see internal/netnsx). Sockets fn opens
// stay in ns; commands it starts run in ns. fn runs on its own goroutine:
// it must return errors rather than call t.Fatal.
func Do(ns string, fn func() error) error { return netnsx.DoNamed(ns, fn) }

// Listen opens a TCP listener in ns, closed when the test ends.
func Listen(tb testing.TB, ns string, addr netip.AddrPort) net.Listener {
	tb.Helper()
	var l net.Listener
	if err := Do(ns, func() (err error) { l, err = net.Listen("tcp", addr.String()); return err }); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}

// Dial connects from ns with a timeout.
func Dial(ns, network string, addr netip.AddrPort, local netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := Do(ns, func() (err error) {
		d := net.Dialer{Timeout: timeout}
		if local.IsValid() {
			switch network {
			case "tcp":
				d.LocalAddr = net.TCPAddrFromAddrPort(local)
			case "udp":
				d.LocalAddr = net.UDPAddrFromAddrPort(local)
			}
		}
		c, err = d.Dial(network, addr.String())
		return err
	})
	return c, err
}

// Counter counts what arrives at a listener in the world namespace.
type Counter struct {
	Packets, Bytes atomic.Int64
}

// UDPSink counts the datagrams arriving at addr in ns until the test ends.
func UDPSink(tb testing.TB, ns string, addr netip.AddrPort) *Counter {
	tb.Helper()
	var pc net.PacketConn
	if err := Do(ns, func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return err }); err != nil {
		tb.Fatal(err)
	}
	c := &Counter{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			c.Packets.Add(1)
			c.Bytes.Add(int64(n))
		}
	}()
	tb.Cleanup(func() { pc.Close(); <-done })
	return c
}

// RawSink counts the packets of IP protocol proto arriving in ns for
// family 4 or 6 until the test ends.
func RawSink(tb testing.TB, ns string, family int, proto int) *Counter {
	return RawSinkFunc(tb, ns, family, proto, nil)
}

// RawSinkFunc is RawSink counting only the packets match accepts (given
// what the raw socket reads: IPv4 with its header, IPv6 without).
func RawSinkFunc(tb testing.TB, ns string, family int, proto int, match func([]byte) bool) *Counter {
	tb.Helper()
	network := fmt.Sprintf("ip4:%d", proto)
	if family == 6 {
		network = fmt.Sprintf("ip6:%d", proto)
	}
	var pc net.PacketConn
	if err := Do(ns, func() (err error) { pc, err = net.ListenPacket(network, ""); return err }); err != nil {
		tb.Fatal(err)
	}
	c := &Counter{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if match != nil && !match(buf[:n]) {
				continue
			}
			c.Packets.Add(1)
			c.Bytes.Add(int64(n))
		}
	}()
	tb.Cleanup(func() { pc.Close(); <-done })
	return c
}

// SendRaw sends one packet of IP protocol proto with payload from ns.
func SendRaw(ns string, dst netip.Addr, proto int, payload []byte) error {
	network := fmt.Sprintf("ip4:%d", proto)
	if dst.Is6() {
		network = fmt.Sprintf("ip6:%d", proto)
	}
	return Do(ns, func() error {
		c, err := net.Dial(network, dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(payload)
		return err
	})
}

// SendFrame writes one raw Ethernet frame on interface dev in ns (an
// AF_PACKET socket: the frame goes out exactly as given).
func SendFrame(ns, dev string, frame []byte) error {
	return Do(ns, func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}})
	})
}

// Ping sends count ICMP echo requests from ns and reports whether any
// reply came back within timeout seconds.
func Ping(ns string, dst netip.Addr, count, timeoutSec int) bool {
	args := []string{"netns", "exec", ns, "ping", "-n", "-q", "-c", fmt.Sprint(count), "-W", fmt.Sprint(timeoutSec), "-i", "0.2"}
	if dst.Is6() {
		args = append(args, "-6")
	}
	return exec.Command("ip", append(args, dst.String())...).Run() == nil
}

var queueSeq atomic.Uint32

// QueueNum returns a queue number unlikely to be used by another test
// process: queue numbers are per namespace in recent kernels but were
// global before.
func QueueNum() uint16 {
	return uint16(1000 + (os.Getpid()*37+int(queueSeq.Add(1)))%60000)
}

// QueuedPacket is a packet the queue listener received.
type QueuedPacket struct {
	Payload []byte // from the IP header
	Mark    uint32
}

// Queue is an NFQUEUE listener in a namespace: a stand-in for the verdict
// loop. Decide is called for each packet and returns the nfqueue verdict
// (nfqueue.NfAccept, NfDrop, NfRepeat) and, when not zero, a new mark.
type Queue struct {
	mu      sync.Mutex
	packets []QueuedPacket
}

// Packets returns what the queue has received so far.
func (q *Queue) Packets() []QueuedPacket {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]QueuedPacket(nil), q.packets...)
}

// StartQueue listens on queue num in ns until the test ends.
func StartQueue(tb testing.TB, ns string, num uint16, decide func(QueuedPacket) (verdict int, mark uint32)) *Queue {
	tb.Helper()
	fd, err := unix.Open(Path(ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(fd)
	nf, err := nfqueue.Open(&nfqueue.Config{
		NetNS:        fd,
		NfQueue:      num,
		MaxQueueLen:  1024,
		MaxPacketLen: 0xffff,
		Copymode:     nfqueue.NfQnlCopyPacket,
		WriteTimeout: time.Second,
	})
	if err != nil {
		tb.Fatalf("open nfqueue %d: %v", num, err)
	}
	q := &Queue{}
	ctx, cancel := context.WithCancel(context.Background())
	err = nf.RegisterWithErrorFunc(ctx, func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			return 0
		}
		p := QueuedPacket{}
		if a.Payload != nil {
			p.Payload = append([]byte(nil), (*a.Payload)...)
		}
		if a.Mark != nil {
			p.Mark = *a.Mark
		}
		q.mu.Lock()
		q.packets = append(q.packets, p)
		q.mu.Unlock()
		v, mark := decide(p)
		if mark != 0 {
			_ = nf.SetVerdictWithOption(*a.PacketID, v, nfqueue.WithMark(uint32(mark)))
		} else {
			_ = nf.SetVerdict(*a.PacketID, v)
		}
		return 0
	}, func(err error) int {
		if ctx.Err() != nil {
			return 1
		}
		tb.Logf("nfqueue %d: %v", num, err)
		return 0
	})
	if err != nil {
		cancel()
		nf.Close()
		tb.Fatalf("register nfqueue %d: %v", num, err)
	}
	tb.Cleanup(func() { cancel(); nf.Close() })
	return q
}

// Eventually polls cond every 20 ms until it holds or timeout passes. It is
// for waiting on asynchronous effects (a packet crossing namespaces), not
// for asserting how fast they are.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
