package nfq

import (
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// rstSender answers the client of a refused TCP flow with a RST, sent
// straight back out of the interface the client's packets came in on.
//
// It writes a whole Ethernet frame with an AF_PACKET socket opened in the
// queue's namespace: destination MAC = the source MAC of the client's
// packets (NFQA_HWADDR), source MAC = the interface's own, IP source =
// the server the client was talking to. The frame bypasses routing and
// netfilter (it is the host speaking for the refused server on the
// guest's link), so it needs no route, no rule, and reaches the guest
// even when the host's firewall would filter its own output. Nothing of
// it goes towards the world.
type rstSender struct {
	fd    int
	netns string

	mu   sync.Mutex
	macs map[uint32]net.HardwareAddr
}

func newRSTSender(netns string) (*rstSender, error) {
	s := &rstSender{fd: -1, netns: netns, macs: map[uint32]net.HardwareAddr{}}
	err := inNetNS(netns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("nfq: rst sender: %w", err)
	}
	return s, nil
}

func (s *rstSender) close() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// mac returns the hardware address of interface ifindex in the queue's
// namespace.
func (s *rstSender) mac(ifindex uint32) (net.HardwareAddr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.macs[ifindex]; ok {
		return m, nil
	}
	var m net.HardwareAddr
	err := inNetNS(s.netns, func() error {
		ifi, err := net.InterfaceByIndex(int(ifindex))
		if err != nil {
			return err
		}
		m = ifi.HardwareAddr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("interface %d: %w", ifindex, err)
	}
	if len(m) != 6 {
		return nil, fmt.Errorf("interface %d has no Ethernet address", ifindex)
	}
	s.macs[ifindex] = m
	return m, nil
}

// send writes the RST.
func (s *rstSender) send(r rstInfo) error {
	if r.ifindex == 0 {
		return errors.New("nfq: rst: no input interface")
	}
	src, err := s.mac(r.ifindex)
	if err != nil {
		return fmt.Errorf("nfq: rst: %w", err)
	}
	frame, err := rstFrame(r, src)
	if err != nil {
		return err
	}
	return s.write(frame, r.ifindex, r.hw, r.client.Addr().Is6())
}

func (s *rstSender) write(frame []byte, ifindex uint32, dst [6]byte, v6 bool) error {
	proto := uint16(unix.ETH_P_IP)
	if v6 {
		proto = unix.ETH_P_IPV6
	}
	sa := &unix.SockaddrLinklayer{Ifindex: int(ifindex), Halen: 6, Protocol: htons(proto)}
	copy(sa.Addr[:], dst[:])
	if err := unix.Sendto(s.fd, frame, 0, sa); err != nil {
		return fmt.Errorf("nfq: reject: send on ifindex %d: %w", ifindex, err)
	}
	return nil
}

// sendUnreachable answers a refused datagram with an ICMP destination
// unreachable, "administratively prohibited" (ICMP 3/13, ICMPv6 1/1),
// quoting the datagram as RFC 792 and RFC 4443 ask, from the address it
// was sent to: the client's socket reports the error at once.
func (s *rstSender) sendUnreachable(u unreachInfo) error {
	if u.ifindex == 0 {
		return errors.New("nfq: unreachable: no input interface")
	}
	src, err := s.mac(u.ifindex)
	if err != nil {
		return fmt.Errorf("nfq: unreachable: %w", err)
	}
	if u.dns {
		if frame, v6, err := nxdomainFrame(u, src); err == nil {
			return s.write(frame, u.ifindex, u.hw, v6)
		}
		// Not a DNS message carbd can answer: the ICMP error.
	}
	frame, v6, err := unreachFrame(u, src)
	if err != nil {
		return err
	}
	return s.write(frame, u.ifindex, u.hw, v6)
}

func unreachFrame(u unreachInfo, srcMAC net.HardwareAddr) ([]byte, bool, error) {
	p, err := peek(u.orig)
	if err != nil {
		return nil, false, fmt.Errorf("nfq: unreachable: %w", err)
	}
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: net.HardwareAddr(u.hw[:])}
	var ls []gopacket.SerializableLayer
	if p.src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ihl := int(u.orig[0]&0x0f) * 4
		quote := u.orig[:min(len(u.orig), ihl+8)]
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolICMPv4, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
		icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeDestinationUnreachable, 13)}
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(quote)}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		quote := u.orig[:min(len(u.orig), 1280-40-8)]
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolICMPv6, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeDestinationUnreachable, 1)}
		if err := icmp.SetNetworkLayerForChecksum(ip); err != nil {
			return nil, false, fmt.Errorf("nfq: unreachable: %w", err)
		}
		// ICMPv6 destination unreachable: 4 unused bytes, then the quote.
		ls = []gopacket.SerializableLayer{eth, ip, icmp, gopacket.Payload(append(make([]byte, 4), quote...))}
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, false, fmt.Errorf("nfq: unreachable: serialize: %w", err)
	}
	return buf.Bytes(), p.src.Is6(), nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// rstFrame builds the Ethernet frame of a RST from the server to the
// client: sequence number = what the client acknowledged last (its
// RCV.NXT, the only value RFC 5961 accepts without a challenge), ACK of
// every byte the client sent.
func rstFrame(r rstInfo, srcMAC net.HardwareAddr) ([]byte, error) {
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: net.HardwareAddr(r.hw[:])}
	tcp := &layers.TCP{
		SrcPort: layers.TCPPort(r.server.Port()), DstPort: layers.TCPPort(r.client.Port()),
		Seq: r.seq, Ack: r.ack, RST: true, ACK: true,
	}
	var ip gopacket.SerializableLayer
	if r.client.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP,
			SrcIP: r.server.Addr().AsSlice(), DstIP: r.client.Addr().AsSlice(), Flags: layers.IPv4DontFragment}
		if err := tcp.SetNetworkLayerForChecksum(ip4); err != nil {
			return nil, fmt.Errorf("nfq: rst: %w", err)
		}
		ip = ip4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: r.server.Addr().AsSlice(), DstIP: r.client.Addr().AsSlice()}
		if err := tcp.SetNetworkLayerForChecksum(ip6); err != nil {
			return nil, fmt.Errorf("nfq: rst: %w", err)
		}
		ip = ip6
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, tcp); err != nil {
		return nil, fmt.Errorf("nfq: rst: serialize: %w", err)
	}
	return buf.Bytes(), nil
}
