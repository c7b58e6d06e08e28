package nfq

import (
	"encoding/binary"
	"errors"
	"net/netip"

	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// errPeek is returned by peek for anything it cannot place.
var errPeek = errors.New("nfq: not an IPv4 or IPv6 packet")

// peeked is the little the loop reads from a packet before the parser
// does: which worker owns it and which flow it belongs to.
type peeked struct {
	src, dst netip.Addr
	// key is the packet's flow as the fast path keys it; valid only when
	// hasKey (not a fragment, ports readable).
	key    tcx.FlowKey
	hasKey bool
	frag   bool
	// tcpFlags and tcpPayload: the TCP flags and payload length (with
	// hasKey and Proto TCP).
	tcpFlags   uint8
	tcpPayload int
}

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// peek reads the addresses, protocol and ports of an IP packet, walking
// the IPv6 extension headers the parser walks (hop-by-hop, routing,
// destination options, at most 8; AH and ESP are upper layers to it, as
// to pkg/hooks/netparse). It never allocates and never trusts a length
// it has not checked.
func peek(b []byte) (peeked, error) {
	var p peeked
	if len(b) < 1 {
		return p, errPeek
	}
	var proto uint8
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		if len(b) < 20 {
			return p, errPeek
		}
		ihl := int(b[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(b[2:]))
		if ihl < 20 || total < ihl || total > len(b) {
			return p, errPeek
		}
		p.src = netip.AddrFrom4([4]byte(b[12:16]))
		p.dst = netip.AddrFrom4([4]byte(b[16:20]))
		proto = b[9]
		fragField := binary.BigEndian.Uint16(b[6:])
		p.frag = fragField&0x3fff != 0 // MF or an offset
		l4 = b[ihl:total]
	case 6:
		if len(b) < 40 {
			return p, errPeek
		}
		p.src = netip.AddrFrom16([16]byte(b[8:24]))
		p.dst = netip.AddrFrom16([16]byte(b[24:40]))
		plen := int(binary.BigEndian.Uint16(b[4:]))
		if 40+plen > len(b) {
			return p, errPeek
		}
		rest := b[40 : 40+plen]
		nh := b[6]
	walk:
		for i := 0; ; i++ {
			if i == 8 {
				return p, nil // addresses only: the parser decides
			}
			switch nh {
			case 0, 43, 60: // hop-by-hop, routing, destination options
				if len(rest) < 8 {
					return p, nil
				}
				n := (int(rest[1]) + 1) * 8
				if n > len(rest) {
					return p, nil
				}
				nh, rest = rest[0], rest[n:]
			case 44: // fragment
				p.frag = true
				return p, nil
			default:
				break walk
			}
		}
		proto, l4 = nh, rest
	default:
		return p, errPeek
	}
	if p.frag {
		return p, nil
	}
	p.key = tcx.FlowKey{Src: p.src, Dst: p.dst, Proto: proto}
	switch proto {
	case tcx.ProtoTCP, tcx.ProtoUDP:
		if len(l4) < 4 {
			return p, nil
		}
		p.key.SrcPort = binary.BigEndian.Uint16(l4[0:])
		p.key.DstPort = binary.BigEndian.Uint16(l4[2:])
		if proto == tcx.ProtoTCP {
			if len(l4) < 20 {
				return p, nil
			}
			doff := int(l4[12]>>4) * 4
			if doff < 20 || doff > len(l4) {
				return p, nil
			}
			p.tcpFlags, p.tcpPayload = l4[13], len(l4)-doff
		}
	case tcx.ProtoICMP, tcx.ProtoICMPv6:
		if len(l4) < 8 {
			return p, nil
		}
		typ, code := l4[0], l4[1]
		p.key.DstPort = uint16(typ)<<8 | uint16(code)
		if echoType(proto, typ) {
			p.key.SrcPort = binary.BigEndian.Uint16(l4[4:])
		}
	}
	p.hasKey = true
	return p, nil
}

// echoType reports whether an ICMP type is an echo request or reply.
func echoType(proto, typ uint8) bool {
	if proto == tcx.ProtoICMP {
		return typ == 8 || typ == 0
	}
	return typ == 128 || typ == 129
}

// shard maps a packet to a worker by its address pair, so that every
// packet of a flow, and every fragment of a datagram, goes to the same
// worker (FNV-1a over the addresses).
func shard(p *peeked, n int) int {
	if n <= 1 {
		return 0
	}
	h := uint32(2166136261)
	mix := func(a netip.Addr) {
		if a.Is4() {
			for _, c := range a.As4() {
				h = (h ^ uint32(c)) * 16777619
			}
			return
		}
		for _, c := range a.As16() {
			h = (h ^ uint32(c)) * 16777619
		}
	}
	mix(p.src)
	mix(p.dst)
	return int(h % uint32(n))
}
