package nfq

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// TestOffloadUDP: datagrams the guest sends with UDP segmentation offload
// (one USO super-packet, several datagrams) and a UFO datagram written
// into the tap as a VMM would (one 8 kB datagram the host fragments).
// Without the queue's GSO flag the kernel segments before queueing and
// each datagram is decided on its own; with it a UDP super-packet is
// queued whole, its datagram boundaries invisible, and it is decided as
// one opaque effect (errUDPSuperPacket): all of it or none. Either way
// released datagrams arrive intact and a secret never does.
func TestOffloadUDP(t *testing.T) {
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			q := &queueLog{}
			e, g := newTapEnv(t, envOpt{cfg: func(c *Config) { c.GSO = gso }, hook: q.hook})
			defer func() { t.Logf("relay guest->host: %s", g.out.String()) }()
			const secret = "SECRET-TOKEN-4242"
			e.dec.on(Refuse, contains(secret))
			e.dec.on(Refuse, func(m Meta, ev *decide.Event) bool { return m.Flow.DstPort == 53 && netparse.IsOpaque(ev) })
			e.dec.on(Release, dstPort(9100))
			e.dec.on(Release, host("ok0000.test"))
			fam := families(e)[0]
			sink := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 9100))
			onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte(secret))
			opaque := func(port uint16) int {
				return len(e.dec.decisions(func(d decision) bool {
					return d.meta.Flow.DstPort == port && netparse.IsOpaque(&d.ev)
				}))
			}

			t.Run("uso", func(t *testing.T) {
				if g.offloads&tunFUSO4 == 0 {
					t.Skip("the kernel's tap has no USO")
				}
				const seg = 1000
				clean := bytes.Repeat([]byte("u"), 4*seg)
				for i := range 4 {
					copy(clean[i*seg:], fmt.Sprintf("datagram %d ", i))
				}
				dirty := bytes.Repeat([]byte("v"), 4*seg)
				for i := range 4 {
					copy(dirty[i*seg:], fmt.Sprintf("dirty %d ", i))
				}
				copy(dirty[2*seg+10:], secret) // only the third datagram carries it
				before := g.out.gsoFrames(vnetGSOUDPL4)
				start := sink.n.Load()
				sendUSO(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 9100), seg, clean, dirty)
				if !tcxtest.Eventually(10*time.Second, func() bool { return g.out.gsoFrames(vnetGSOUDPL4)-before >= 2 }) {
					t.Fatalf("the guest sent %d USO frames, want 2", g.out.gsoFrames(vnetGSOUDPL4)-before)
				}
				// The clean super-packet arrives whole either way.
				if !tcxtest.Eventually(10*time.Second, func() bool { return sink.n.Load()-start >= 4 }) {
					e.dec.log(t)
					t.Fatalf("world got %d of the 4 clean datagrams", sink.n.Load()-start)
				}
				settle()
				got := sink.all()[start:]
				for i := range 4 {
					if !bytes.Equal(got[i], clean[i*seg:(i+1)*seg]) {
						t.Errorf("datagram %d arrived as %.40q..., want %.40q...", i, got[i], clean[i*seg:])
					}
				}
				// Of the dirty one: with the GSO flag nothing (decided
				// whole); without, each datagram is decided on its own and
				// the secret's is refused. (The kernel then also loses the
				// released datagrams between the first and the last of the
				// segmented super-packet: see docs/network.md.)
				var names []string
				for _, d := range got[4:] {
					names = append(names, string(d[:7]))
					if !bytes.Equal(d, dirty[0:seg]) && !bytes.Equal(d, dirty[seg:2*seg]) && !bytes.Equal(d, dirty[3*seg:]) {
						t.Errorf("world got %.40q... of the dirty super-packet", d)
					}
				}
				t.Logf("of the dirty super-packet the world got %q", names)
				if gso && len(got) != 4 {
					t.Errorf("with the GSO flag the world got %d datagrams of the dirty super-packet, want none", len(got)-4)
				}
				withSecret := e.dec.decisions(func(d decision) bool {
					return d.meta.Flow.DstPort == 9100 && strings.Contains(d.ev.Content, secret)
				})
				wantLen := seg // the datagram
				if gso {
					wantLen = 4 * seg // the super-packet
				}
				if len(withSecret) != 1 || len(withSecret[0].ev.Content) != wantLen || withSecret[0].out.Verdict != Refuse {
					e.dec.log(t)
					t.Fatalf("%d decisions saw the secret, want one of %d bytes, refused", len(withSecret), wantLen)
				}
				if n := onWire.frames.Load(); n != 0 {
					t.Fatalf("the secret reached the world's wire in %d frames", n)
				}
				if n := opaque(9100); gso != (n == 2) {
					e.dec.log(t)
					t.Errorf("%d opaque decisions of the super-packets, want 2 with the GSO flag, else 0", n)
				}
			})

			// Four DNS queries in one USO super-packet: the first for a
			// released name, three that carry data in theirs.
			t.Run("uso-dns", func(t *testing.T) {
				if g.offloads&tunFUSO4 == 0 {
					t.Skip("the kernel's tap has no USO")
				}
				dns := newDNSServer(t, e.topo.World, netip.AddrPortFrom(fam.world, 53))
				var buf []byte
				for _, name := range []string{"ok0000.test", "lk0001.test", "lk0002.test", "lk0003.test"} {
					buf = append(buf, dnsQuery(t, name)...) // the same length each
				}
				sendUSO(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 53), len(buf)/4, buf)
				settle()
				settle()
				asked := dns.asked()
				for _, n := range asked {
					if strings.HasPrefix(n, "lk") {
						e.dec.log(t)
						t.Fatalf("the resolver was asked %v: queries hidden behind a released one passed", asked)
					}
				}
				if !gso && (len(asked) != 1 || asked[0] != "ok0000.test") {
					t.Errorf("the resolver was asked %v, want ok0000.test (each query decided)", asked)
				}
				if n := opaque(53); gso != (n == 1) {
					e.dec.log(t)
					t.Errorf("%d opaque DNS decisions, want 1 with the GSO flag, else 0", n)
				}
			})

			t.Run("ufo", func(t *testing.T) {
				payload := bytes.Repeat([]byte("w"), 8000)
				start := sink.n.Load()
				if err := g.injectUFO(e, fam.guest, fam.world, 42000, 9100, payload, 1); err != nil {
					t.Fatalf("inject UFO datagram: %v", err)
				}
				if !tcxtest.Eventually(10*time.Second, func() bool { return sink.n.Load()-start >= 1 }) {
					e.dec.log(t)
					t.Fatalf("the released UFO datagram did not arrive")
				}
				if got := sink.all()[start]; !bytes.Equal(got, payload) {
					t.Fatalf("the released UFO datagram arrived as %d bytes, want %d intact", len(got), len(payload))
				}
				dirty := bytes.Repeat([]byte("z"), 8000)
				copy(dirty[5000:], secret)
				start = sink.n.Load()
				if err := g.injectUFO(e, fam.guest, fam.world, 42001, 9100, dirty, 2); err != nil {
					t.Fatalf("inject UFO datagram: %v", err)
				}
				settle()
				settle()
				if n := sink.n.Load() - start; n != 0 || onWire.frames.Load() != 0 {
					t.Fatalf("the UFO datagram with the secret reached the world (%d datagrams, %d frames on its wire)", n, onWire.frames.Load())
				}
				if len(e.dec.decisions(func(d decision) bool { return strings.Contains(d.ev.Content, secret) && d.meta.Flow.SrcPort == 42001 })) == 0 {
					e.dec.log(t)
					t.Fatal("no decision saw the UFO datagram's secret")
				}
			})
			checkQueueSaw(t, e, gso, q)
		})
	}
}

// sendUSO sends each buffer with one sendmsg and UDP_SEGMENT: the guest
// kernel hands the tap one USO super-packet per buffer.
func sendUSO(t *testing.T, ns string, dst netip.AddrPort, seg int, bufs ...[]byte) {
	t.Helper()
	c, err := tcxtest.Dial(ns, "udp", dst, netip.AddrPort{}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, seg) }); err != nil || serr != nil {
		t.Fatalf("UDP_SEGMENT: %v %v", err, serr)
	}
	for _, b := range bufs {
		if _, err := c.Write(b); err != nil {
			t.Fatalf("send USO: %v", err)
		}
	}
}

// injectUFO writes one IPv4 UDP datagram into the host tap as a UFO
// super-packet (VIRTIO_NET_HDR_GSO_UDP, gso_size 1472) with a partial
// checksum (VIRTIO_NET_HDR_F_NEEDS_CSUM: the UDP checksum field holds the
// pseudo-header sum), as a guest that negotiated UFO hands it to its VMM.
func (g *vnetGuest) injectUFO(e *env, src, dst netip.Addr, sport, dport uint16, payload []byte, id uint16) error {
	var hostMAC net.HardwareAddr
	if err := tcxtest.Do(e.topo.Router, func() error {
		ifi, err := net.InterfaceByName(e.topo.RouterIf)
		if err == nil {
			hostMAC = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		return err
	}
	const eth, ip4, udp = 14, 20, 8
	f := make([]byte, eth+ip4+udp+len(payload))
	copy(f[0:6], hostMAC)
	copy(f[6:12], []byte{0x02, 0xcb, 0, 0, 0, 0x09})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[eth:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(ip4+udp+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], id)
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:], ^fold(sum16(ip[:ip4])))
	u := ip[ip4:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(udp+len(payload)))
	copy(u[udp:], payload)
	// Pseudo-header sum, not complemented: what a driver leaves for the
	// device to finish.
	pseudo := sum16(s4[:]) + sum16(d4[:]) + unix.IPPROTO_UDP + uint32(udp+len(payload))
	binary.BigEndian.PutUint16(u[6:], fold(pseudo))
	return g.inject(vnetHdr{
		flags: vnetFNeedsCsum, gsoType: vnetGSOUDP,
		hdrLen: eth + ip4 + udp, gsoSize: 1472,
		csumStart: eth + ip4, csumOffset: 6,
	}, f)
}

func sum16(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}
