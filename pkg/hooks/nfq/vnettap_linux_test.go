package nfq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// The tap offload flags (linux/if_tun.h) and the virtio-net header
// (linux/virtio_net.h) a VMM's virtio-net backend uses.
const (
	tunFCsum = 0x01
	tunFTSO4 = 0x02
	tunFTSO6 = 0x04
	tunFUFO  = 0x10
	tunFUSO4 = 0x20
	tunFUSO6 = 0x40

	vnetHdrLen        = 12 // virtio_net_hdr_v1 (with num_buffers), as Cloud Hypervisor sets it
	vnetFNeedsCsum    = 1
	vnetGSONone       = 0
	vnetGSOTCPv4      = 1
	vnetGSOUDP        = 3 // UFO
	vnetGSOTCPv6      = 4
	vnetGSOUDPL4      = 5 // USO
	vnetGSOECN        = 0x80
	cloudHypervisorOf = tunFCsum | tunFTSO4 | tunFTSO6 | tunFUFO
)

// vnetHdr is struct virtio_net_hdr_v1 (little endian: the legacy
// host-endian layout on x86 and what a modern virtio device uses).
type vnetHdr struct {
	flags, gsoType                         uint8
	hdrLen, gsoSize, csumStart, csumOffset uint16
}

func (h vnetHdr) put(b []byte) {
	b[0], b[1] = h.flags, h.gsoType
	binary.LittleEndian.PutUint16(b[2:], h.hdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.gsoSize)
	binary.LittleEndian.PutUint16(b[6:], h.csumStart)
	binary.LittleEndian.PutUint16(b[8:], h.csumOffset)
	binary.LittleEndian.PutUint16(b[10:], 0) // num_buffers: unused on transmit
}

func parseVnetHdr(b []byte) vnetHdr {
	return vnetHdr{
		flags: b[0], gsoType: b[1],
		hdrLen: binary.LittleEndian.Uint16(b[2:]), gsoSize: binary.LittleEndian.Uint16(b[4:]),
		csumStart: binary.LittleEndian.Uint16(b[6:]), csumOffset: binary.LittleEndian.Uint16(b[8:]),
	}
}

// openVnetTap creates tap name in namespace ns the way Cloud Hypervisor's
// virtio-net backend opens it (net_util::Tap): IFF_TAP|IFF_NO_PI|
// IFF_VNET_HDR, a 12-byte vnet header, and TUNSETOFFLOAD with the
// offloads the guest negotiated. It returns the offloads the kernel
// took (USO is tried when asked and dropped where the kernel lacks it).
// The tap lives as long as the file.
func openVnetTap(ns, name string, offloads int) (*os.File, int, error) {
	var f *os.File
	took := offloads
	err := tcxtest.Do(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap %s: TUNSETIFF: %w", name, err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetHdrLen); err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap %s: TUNSETVNETHDRSZ: %w", name, err)
		}
		err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, took)
		if err != nil && took&(tunFUSO4|tunFUSO6) != 0 {
			took &^= tunFUSO4 | tunFUSO6
			err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, took)
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap %s: TUNSETOFFLOAD %#x: %w", name, took, err)
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return err
		}
		f = os.NewFile(uintptr(fd), "/dev/net/tun:"+name)
		return nil
	})
	return f, took, err
}

// relayStats is what the relay forwarded from the guest to the host tap.
type relayStats struct {
	mu       sync.Mutex
	frames   int
	gso      map[uint8]int // frames by gso_type (ECN bit cleared)
	csum     int           // frames with VIRTIO_NET_HDR_F_NEEDS_CSUM
	maxFrame int           // largest frame (without the vnet header)
	maxGSO   uint16        // largest gso_size
}

func (s *relayStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("%d frames, by gso_type %v, %d with NEEDS_CSUM, largest %d bytes, largest gso_size %d",
		s.frames, s.gso, s.csum, s.maxFrame, s.maxGSO)
}

func (s *relayStats) gsoFrames(typ uint8) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gso[typ]
}

func (s *relayStats) largest() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxFrame
}

// vnetGuest is the fake guest of these tests: a guest namespace whose
// kernel sends through tap g0 (offloads on, so its TCP and UDP stacks
// hand GSO super-packets with partial checksums to the tap's reader),
// and a relay that writes each frame, virtio-net header and all, into
// the host's tap r0 opened with IFF_VNET_HDR: what Cloud Hypervisor's
// virtio-net backend does with what the guest's virtio-net driver
// queues. The host side sees exactly what it sees in production; the
// guest's stack is Linux's, as in a Linux guest.
type vnetGuest struct {
	host     *os.File // r0 in the router namespace
	guest    *os.File // g0 in the guest namespace
	offloads int      // what the host tap took
	out      relayStats
	wmu      sync.Mutex // serialises writes into host
}

// inject writes one frame (after its virtio-net header) into the host
// tap, as the VMM would.
func (g *vnetGuest) inject(h vnetHdr, frame []byte) error {
	b := make([]byte, vnetHdrLen+len(frame))
	h.put(b)
	copy(b[vnetHdrLen:], frame)
	g.wmu.Lock()
	defer g.wmu.Unlock()
	_, err := g.host.Write(b)
	return err
}

// newTapEnv is newEnv with the guest behind vnet-header taps instead of
// a veth pair: the topology's g0/r0 veth is replaced by the taps g0
// (guest) and r0 (host, where the TC program and rules go), with the
// same addresses and routes.
func newTapEnv(t testing.TB, o envOpt) (*env, *vnetGuest) {
	t.Helper()
	testutil.RequireRoot(t)
	topo := tcxtest.New(t)
	testutil.Run(t, "ip", "-n", topo.Guest, "link", "del", topo.GuestIf)
	g := &vnetGuest{out: relayStats{gso: map[uint8]int{}}}
	var err error
	if g.guest, _, err = openVnetTap(topo.Guest, topo.GuestIf, tunFCsum|tunFTSO4|tunFTSO6|tunFUSO4|tunFUSO6); err != nil {
		t.Fatal(err)
	}
	// The host tap as Cloud Hypervisor opens it; USO where the kernel
	// has it (its default set is CSUM|TSO4|TSO6|UFO).
	if g.host, g.offloads, err = openVnetTap(topo.Router, topo.RouterIf, cloudHypervisorOf|tunFUSO4|tunFUSO6); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	t.Cleanup(func() {
		stop.Store(true)
		g.guest.Close()
		g.host.Close()
		wg.Wait()
	})
	for _, a := range []struct {
		ns, dev string
		v4, v6  string
	}{
		{topo.Guest, topo.GuestIf, topo.Guest4.String(), topo.Guest6.String()},
		{topo.Router, topo.RouterIf, topo.Router4.String(), topo.Router6.String()},
	} {
		testutil.Run(t, "ip", "-n", a.ns, "addr", "add", a.v4+"/24", "dev", a.dev)
		testutil.Run(t, "ip", "-n", a.ns, "addr", "add", a.v6+"/64", "dev", a.dev, "nodad")
		testutil.Run(t, "ip", "-n", a.ns, "link", "set", a.dev, "up")
	}
	// Autocorking would merge a write into a super-packet still queued
	// in the tap: the tests choose where super-packets end.
	testutil.Run(t, "ip", "netns", "exec", topo.Guest, "sysctl", "-q", "-w", "net.ipv4.tcp_autocorking=0")
	testutil.Run(t, "ip", "-n", topo.Guest, "route", "add", "default", "via", topo.Router4.String())
	testutil.Run(t, "ip", "-n", topo.Guest, "-6", "route", "add", "default", "via", topo.Router6.String())
	relay := func(from, to *os.File, count bool) {
		defer wg.Done()
		buf := make([]byte, vnetHdrLen+65536)
		for !stop.Load() {
			n, err := from.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrClosed) {
					return
				}
				continue
			}
			if n < vnetHdrLen {
				continue
			}
			if count {
				h := parseVnetHdr(buf)
				g.out.mu.Lock()
				g.out.frames++
				g.out.gso[h.gsoType&^vnetGSOECN]++
				if h.flags&vnetFNeedsCsum != 0 {
					g.out.csum++
				}
				g.out.maxFrame = max(g.out.maxFrame, n-vnetHdrLen)
				g.out.maxGSO = max(g.out.maxGSO, h.gsoSize)
				g.out.mu.Unlock()
				g.wmu.Lock()
			}
			// A write the kernel refuses (EINVAL for a header it cannot
			// take) is a frame the guest loses, as under a VMM.
			to.Write(buf[:n])
			if count {
				g.wmu.Unlock()
			}
		}
	}
	wg.Add(2)
	go relay(g.guest, g.host, true)
	go relay(g.host, g.guest, false)
	testutil.WaitTapReady(t, topo.Guest, topo.GuestIf)
	testutil.WaitTapReady(t, topo.Router, topo.RouterIf)
	return envOn(t, topo, o), g
}
