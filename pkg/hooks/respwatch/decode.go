package respwatch

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// TCP flags.
const (
	flagFIN = 0x01
	flagSYN = 0x02
	flagRST = 0x04
	flagACK = 0x10
)

const (
	protoTCP = 6
	protoUDP = 17
)

var (
	errNotIP     = errors.New("respwatch: frame is not ipv4 or ipv6")
	errMalformed = errors.New("respwatch: malformed frame")
)

// pkt is the decoded view of one captured frame; its slices point into
// the frame.
type pkt struct {
	ip          []byte // from the IP header to the end of the captured frame
	src, dst    netip.AddrPort
	proto       uint8
	seq, ack    uint32
	flags       uint8
	payload     []byte
	missing     int  // TCP payload bytes the frame lacks (shorter capture than the IP length)
	frag        bool // an IP fragment other than a whole datagram
	truncatedIP bool // the IP datagram is longer than the frame
}

// decodeFrame decodes an Ethernet frame (with up to two VLAN tags) down
// to TCP. It never fails on a short capture: what the frame lacks of
// the TCP payload is reported in missing. Checksums are not checked: the
// host side of a veth or tap sees offloaded, unfinished ones.
func decodeFrame(b []byte, p *pkt) error {
	*p = pkt{}
	if len(b) < 14 {
		return errMalformed
	}
	et := binary.BigEndian.Uint16(b[12:14])
	off := 14
	for i := 0; i < 2 && (et == 0x8100 || et == 0x88a8); i++ {
		if len(b) < off+4 {
			return errMalformed
		}
		et = binary.BigEndian.Uint16(b[off+2 : off+4])
		off += 4
	}
	ip := b[off:]
	switch et {
	case 0x0800:
		return decode4(ip, p)
	case 0x86dd:
		return decode6(ip, p)
	}
	return errNotIP
}

func decode4(b []byte, p *pkt) error {
	if len(b) < 20 || b[0]>>4 != 4 {
		return errMalformed
	}
	ihl := int(b[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if total == 0 {
		// Large segmentation-offload packets (BIG TCP) leave it 0.
		total = len(b)
	}
	if ihl < 20 || total < ihl || len(b) < ihl {
		return errMalformed
	}
	if total > len(b) {
		p.truncatedIP = true
	} else {
		b = b[:total]
	}
	p.ip = b
	flags := binary.BigEndian.Uint16(b[6:8])
	p.frag = flags&0x3fff != 0 // more fragments, or an offset
	p.proto = b[9]
	src := netip.AddrFrom4([4]byte(b[12:16]))
	dst := netip.AddrFrom4([4]byte(b[16:20]))
	return transport(b[ihl:], total-ihl, src, dst, p)
}

func decode6(b []byte, p *pkt) error {
	if len(b) < 40 || b[0]>>4 != 6 {
		return errMalformed
	}
	plen := int(binary.BigEndian.Uint16(b[4:6]))
	total := 40 + plen
	if plen == 0 {
		total = len(b) // jumbo or offload packet
	}
	if total > len(b) {
		p.truncatedIP = true
	} else {
		b = b[:total]
	}
	p.ip = b
	src := netip.AddrFrom16([16]byte(b[8:24]))
	dst := netip.AddrFrom16([16]byte(b[24:40]))
	nh := b[6]
	rest := b[40:]
	restLen := total - 40
	for i := 0; i < 8; i++ {
		switch nh {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(rest) < 8 {
				return errMalformed
			}
			n := (int(rest[1]) + 1) * 8
			if n > len(rest) {
				return errMalformed
			}
			nh, rest, restLen = rest[0], rest[n:], restLen-n
			continue
		case 44: // fragment
			if len(rest) < 8 {
				return errMalformed
			}
			v := binary.BigEndian.Uint16(rest[2:4])
			if v&0xfff9 != 0 {
				p.frag = true
			}
			nh, rest, restLen = rest[0], rest[8:], restLen-8
			continue
		}
		break
	}
	p.proto = nh
	return transport(rest, restLen, src, dst, p)
}

// transport decodes the TCP or UDP header of l4 (captured bytes; full is
// the length the IP header declares).
func transport(l4 []byte, full int, src, dst netip.Addr, p *pkt) error {
	if p.frag {
		p.src, p.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
		return nil
	}
	switch p.proto {
	case protoTCP:
		if len(l4) < 20 {
			return errMalformed
		}
		doff := int(l4[12]>>4) * 4
		if doff < 20 || doff > len(l4) || doff > full {
			return errMalformed
		}
		p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:2]))
		p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:4]))
		p.seq = binary.BigEndian.Uint32(l4[4:8])
		p.ack = binary.BigEndian.Uint32(l4[8:12])
		p.flags = l4[13]
		p.payload = l4[doff:]
		if full > len(l4) {
			p.missing = full - len(l4)
		}
	case protoUDP:
		if len(l4) < 8 {
			return errMalformed
		}
		p.src = netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:2]))
		p.dst = netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:4]))
		p.payload = l4[8:]
	default:
		p.src, p.dst = netip.AddrPortFrom(src, 0), netip.AddrPortFrom(dst, 0)
	}
	return nil
}

// seqLT and friends compare TCP sequence numbers modulo 2^32.
func seqLT(a, b uint32) bool  { return int32(a-b) < 0 }
func seqLEQ(a, b uint32) bool { return int32(a-b) <= 0 }
func seqGT(a, b uint32) bool  { return int32(a-b) > 0 }
