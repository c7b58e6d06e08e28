package netparse

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// IP protocol numbers the parser knows.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58

	protoHopByHop = 0
	protoRouting  = 43
	protoFragment = 44
	protoESP      = 50
	protoAH       = 51
	protoNoNext   = 59
	protoDestOpts = 60
)

// TCPFlags are the TCP header flags, in wire order.
type TCPFlags uint8

const (
	FlagFIN TCPFlags = 1 << iota
	FlagSYN
	FlagRST
	FlagPSH
	FlagACK
	FlagURG
	FlagECE
	FlagCWR
)

// Fragment describes an IP fragment.
type Fragment struct {
	ID     uint32 // IPv4 identification or IPv6 fragment header identification
	Offset int    // byte offset of this fragment's data in the datagram
	More   bool   // more fragments follow
}

// FragKey names a datagram under reassembly: every fragment of a datagram
// has the same key. Proto is the IPv4 protocol; it is 0 for IPv6, whose
// fragments are keyed by addresses and identification only (RFC 8200).
type FragKey struct {
	Src, Dst netip.Addr
	Proto    uint8
	ID       uint32
}

// Packet is a decoded view of one IP packet. Its slices point into the
// packet (or into the parser's reassembly buffer): valid until the next
// call that reuses the decoder.
type Packet struct {
	Family   uint8 // 4 or 6
	Src, Dst netip.Addr
	TTL      uint8 // IPv4 TTL or IPv6 hop limit
	// Proto is the upper-layer protocol: after the IPv6 extension headers,
	// or the fragment's protocol for a fragment.
	Proto            uint8
	SrcPort, DstPort uint16 // TCP and UDP
	Seq, Ack         uint32 // TCP
	Flags            TCPFlags
	ICMPType         uint8
	ICMPCode         uint8
	ICMPID, ICMPSeq  uint16 // echo request and reply
	// Payload is the TCP or UDP data, the ICMP body (after the echo id and
	// sequence for echo messages), the IP payload for other protocols, or
	// the fragment's data for a fragment.
	Payload []byte
	// IsFragment says this packet is a fragment of a bigger datagram;
	// Frag tells which part.
	IsFragment bool
	Frag       Fragment
	// Reassembled says the transport fields were decoded from a datagram
	// reassembled from fragments.
	Reassembled bool
	// Datagram names the datagram of a fragment or of a reassembled
	// packet: a verdict on it applies to all its fragments.
	Datagram FragKey
	// Len is the IP packet's length.
	Len int
}

// SrcAddrPort and DstAddrPort return the endpoints (port 0 without ports).
func (p *Packet) SrcAddrPort() netip.AddrPort { return netip.AddrPortFrom(p.Src, p.SrcPort) }
func (p *Packet) DstAddrPort() netip.AddrPort { return netip.AddrPortFrom(p.Dst, p.DstPort) }

// Decoder decodes IP packets with gopacket's DecodingLayerParser. It
// reuses its layers: not safe for concurrent use, and the Packet it
// returns is valid until the next Decode.
type Decoder struct {
	ip4   layers.IPv4
	ip6   layers.IPv6
	tcp   layers.TCP
	udp   layers.UDP
	icmp4 layers.ICMPv4
	icmp6 layers.ICMPv6
	echo6 layers.ICMPv6Echo

	p4, p6                 *gopacket.DecodingLayerParser
	pTCP, pUDP, pIC4, pIC6 *gopacket.DecodingLayerParser
	decoded                []gopacket.LayerType
	pkt                    Packet
	l4                     []byte // the transport bytes, for checksums
	checksums              bool
	csumNotReady           bool
}

// NewDecoder returns a decoder. With checksums, TCP, UDP and ICMP
// checksums are verified; the IPv4 header checksum always is.
func NewDecoder(checksums bool) *Decoder {
	d := &Decoder{checksums: checksums, decoded: make([]gopacket.LayerType, 0, 8)}
	mk := func(first gopacket.LayerType, ls ...gopacket.DecodingLayer) *gopacket.DecodingLayerParser {
		p := gopacket.NewDecodingLayerParser(first)
		p.SetDecodingLayerContainer(gopacket.DecodingLayerSparse(nil))
		for _, l := range ls {
			p.AddDecodingLayer(l)
		}
		p.IgnoreUnsupported = true
		return p
	}
	d.p4 = mk(layers.LayerTypeIPv4, &d.ip4, &d.tcp, &d.udp, &d.icmp4)
	d.p6 = mk(layers.LayerTypeIPv6, &d.ip6, &d.tcp, &d.udp, &d.icmp6, &d.echo6)
	d.pTCP = mk(layers.LayerTypeTCP, &d.tcp)
	d.pUDP = mk(layers.LayerTypeUDP, &d.udp)
	d.pIC4 = mk(layers.LayerTypeICMPv4, &d.icmp4)
	d.pIC6 = mk(layers.LayerTypeICMPv6, &d.icmp6, &d.echo6)
	return d
}

// Decode decodes one packet. A fragment is returned with IsFragment set
// and its data as Payload; DecodeTransport decodes the reassembled
// datagram.
func (d *Decoder) Decode(b []byte) (*Packet, error) {
	return d.decode(b, false)
}

func (d *Decoder) decode(b []byte, csumNotReady bool) (*Packet, error) {
	d.pkt = Packet{}
	d.csumNotReady = csumNotReady
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty packet", ErrTruncated)
	}
	switch b[0] >> 4 {
	case 4:
		return d.decode4(b)
	case 6:
		return d.decode6(b)
	}
	return nil, fmt.Errorf("%w: version nibble %d", ErrNotIP, b[0]>>4)
}

func (d *Decoder) decode4(b []byte) (*Packet, error) {
	if len(b) < 20 {
		return nil, fmt.Errorf("%w: ipv4 header needs 20 bytes, have %d", ErrTruncated, len(b))
	}
	ihl := int(b[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(b[2:4]))
	switch {
	case ihl < 20:
		return nil, fmt.Errorf("%w: ipv4 header length %d", ErrMalformed, ihl)
	case total == 0:
		return nil, fmt.Errorf("%w: ipv4 total length 0 (segmentation offload packet not handled)", ErrMalformed)
	case total < ihl:
		return nil, fmt.Errorf("%w: ipv4 total length %d below header length %d", ErrMalformed, total, ihl)
	case total > len(b):
		return nil, fmt.Errorf("%w: ipv4 total length %d, have %d bytes", ErrTruncated, total, len(b))
	}
	b = b[:total]
	if foldChecksum(sum16(b[:ihl], 0)) != 0xffff {
		return nil, fmt.Errorf("%w: ipv4 header", ErrChecksum)
	}
	for o := b[20:ihl]; len(o) > 0; {
		switch o[0] {
		case 0: // end of options: the rest is padding
			o = nil
		case 1: // no-operation
			o = o[1:]
		default:
			return nil, fmt.Errorf("%w: type %d", ErrIPv4Option, o[0])
		}
	}
	err := d.p4.DecodeLayers(b, &d.decoded)
	if d.p4.Truncated {
		return nil, fmt.Errorf("%w: %s", ErrTruncated, d.failedLayer(layers.LayerTypeIPv4))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, d.failedLayer(layers.LayerTypeIPv4), err)
	}
	p := &d.pkt
	p.Family = 4
	p.Src = netip.AddrFrom4([4]byte(b[12:16]))
	p.Dst = netip.AddrFrom4([4]byte(b[16:20]))
	p.TTL = b[8]
	p.Proto = b[9]
	p.Len = total
	flags := binary.BigEndian.Uint16(b[6:8])
	if off, more := int(flags&0x1fff)*8, flags&0x2000 != 0; off != 0 || more {
		p.IsFragment = true
		p.Frag = Fragment{ID: uint32(binary.BigEndian.Uint16(b[4:6])), Offset: off, More: more}
		p.Datagram = FragKey{Src: p.Src, Dst: p.Dst, Proto: p.Proto, ID: p.Frag.ID}
		p.Payload = b[ihl:]
		return p, nil
	}
	d.l4 = b[ihl:]
	return p, d.fillTransport(p, 1)
}

// decode6 decodes the fixed header with gopacket and walks the extension
// header chain itself (gopacket v1.1.19 decodes neither the routing nor
// the fragment header as a DecodingLayer).
func (d *Decoder) decode6(b []byte) (*Packet, error) {
	if len(b) < 40 {
		return nil, fmt.Errorf("%w: ipv6 header needs 40 bytes, have %d", ErrTruncated, len(b))
	}
	plen := int(binary.BigEndian.Uint16(b[4:6]))
	if plen == 0 {
		return nil, fmt.Errorf("%w: ipv6 payload length 0 (jumbogram or offload packet not handled)", ErrMalformed)
	}
	if 40+plen > len(b) {
		return nil, fmt.Errorf("%w: ipv6 payload length %d, have %d bytes", ErrTruncated, plen, len(b)-40)
	}
	b = b[:40+plen]
	p := &d.pkt
	p.Family = 6
	p.Src = netip.AddrFrom16([16]byte(b[8:24]))
	p.Dst = netip.AddrFrom16([16]byte(b[24:40]))
	p.TTL = b[7]
	p.Len = len(b)
	nh := b[6]
	if nh == ProtoTCP || nh == ProtoUDP || nh == ProtoICMPv6 {
		// The common case: no extension headers, one pass of the parser.
		err := d.p6.DecodeLayers(b, &d.decoded)
		if d.p6.Truncated {
			return nil, fmt.Errorf("%w: %s", ErrTruncated, d.failedLayer(layers.LayerTypeIPv6))
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, d.failedLayer(layers.LayerTypeIPv6), err)
		}
		p.Proto = nh
		d.l4 = b[40:]
		return p, d.fillTransport(p, 1)
	}
	rest, proto, frag, err := walkExt6(nh, b[40:], true)
	if err != nil {
		return nil, err
	}
	p.Proto = proto
	if frag != nil {
		if frag.Offset == 0 && !frag.More {
			// An atomic fragment (RFC 6946): a whole datagram.
			rest, proto, _, err = walkExt6(proto, rest, false)
			if err != nil {
				return nil, err
			}
			p.Proto = proto
		} else {
			p.IsFragment = true
			p.Frag = *frag
			p.Datagram = FragKey{Src: p.Src, Dst: p.Dst, ID: frag.ID}
			p.Payload = rest
			return p, nil
		}
	}
	d.l4 = rest
	return p, d.decodeTransport(p)
}

// walkExt6 walks IPv6 extension headers starting with next header nh.
// With fragOK, a fragment header ends the walk (its data is returned with
// the fragment's next header). It refuses what it cannot vouch for:
// options other than padding and router alert, routing headers that still
// have segments to visit, over-long chains.
func walkExt6(nh uint8, b []byte, fragOK bool) (rest []byte, proto uint8, frag *Fragment, err error) {
	for i := 0; ; i++ {
		if i > 8 {
			return nil, 0, nil, fmt.Errorf("%w: more than 8 extension headers", ErrExtChain)
		}
		switch nh {
		case protoHopByHop, protoDestOpts:
			if nh == protoHopByHop && (i > 0 || !fragOK) {
				return nil, 0, nil, fmt.Errorf("%w: hop-by-hop header not first", ErrExtChain)
			}
			if len(b) < 8 {
				return nil, 0, nil, fmt.Errorf("%w: ipv6 option header", ErrTruncated)
			}
			n := (int(b[1]) + 1) * 8
			if n > len(b) {
				return nil, 0, nil, fmt.Errorf("%w: ipv6 option header length %d, have %d", ErrTruncated, n, len(b))
			}
			if err := checkOptions6(b[2:n]); err != nil {
				return nil, 0, nil, err
			}
			nh, b = b[0], b[n:]
		case protoRouting:
			if len(b) < 8 {
				return nil, 0, nil, fmt.Errorf("%w: ipv6 routing header", ErrTruncated)
			}
			n := (int(b[1]) + 1) * 8
			if n > len(b) {
				return nil, 0, nil, fmt.Errorf("%w: ipv6 routing header length %d, have %d", ErrTruncated, n, len(b))
			}
			if b[2] == 0 || b[3] != 0 {
				return nil, 0, nil, fmt.Errorf("%w: type %d, %d segments left", ErrRouting, b[2], b[3])
			}
			nh, b = b[0], b[n:]
		case protoFragment:
			if !fragOK {
				return nil, 0, nil, fmt.Errorf("%w: fragment header inside a reassembled datagram", ErrExtChain)
			}
			if len(b) < 8 {
				return nil, 0, nil, fmt.Errorf("%w: ipv6 fragment header", ErrTruncated)
			}
			v := binary.BigEndian.Uint16(b[2:4])
			f := &Fragment{ID: binary.BigEndian.Uint32(b[4:8]), Offset: int(v>>3) * 8, More: v&1 != 0}
			return b[8:], b[0], f, nil
		default:
			// An upper-layer protocol, or one the parser leaves opaque
			// (ESP, AH, no next header, mobility, HIP, shim6, experiments).
			return b, nh, nil, nil
		}
	}
}

// checkOptions6 accepts Pad1, all-zero PadN and Router Alert options.
func checkOptions6(o []byte) error {
	for len(o) > 0 {
		if o[0] == 0 { // Pad1
			o = o[1:]
			continue
		}
		if len(o) < 2 || 2+int(o[1]) > len(o) {
			return fmt.Errorf("%w: ipv6 option %#x length", ErrTruncated, o[0])
		}
		n := 2 + int(o[1])
		switch o[0] {
		case 1: // PadN: carries nothing, so it must be zeros
			for _, c := range o[2:n] {
				if c != 0 {
					return fmt.Errorf("%w: PadN with non-zero bytes", ErrIPv6Option)
				}
			}
		case 5: // Router Alert
			if n != 4 {
				return fmt.Errorf("%w: router alert length %d", ErrIPv6Option, n)
			}
		default:
			return fmt.Errorf("%w: type %#x", ErrIPv6Option, o[0])
		}
		o = o[n:]
	}
	return nil
}

// DecodeTransport decodes the transport header of a reassembled datagram:
// p is the first fragment's packet, payload the reassembled IP payload.
func (d *Decoder) DecodeTransport(p *Packet, payload []byte) (*Packet, error) {
	q := &d.pkt
	if q != p {
		*q = *p
	}
	q.IsFragment = false
	q.Reassembled = true
	q.Len = len(payload)
	if q.Family == 6 {
		rest, proto, _, err := walkExt6(q.Proto, payload, false)
		if err != nil {
			return nil, err
		}
		q.Proto = proto
		payload = rest
	}
	d.l4 = payload
	return q, d.decodeTransport(q)
}

func (d *Decoder) decodeTransport(p *Packet) error {
	var dp *gopacket.DecodingLayerParser
	switch {
	case p.Proto == ProtoTCP:
		dp = d.pTCP
	case p.Proto == ProtoUDP:
		dp = d.pUDP
	case p.Proto == ProtoICMP && p.Family == 4:
		dp = d.pIC4
	case p.Proto == ProtoICMPv6 && p.Family == 6:
		dp = d.pIC6
	default:
		p.Payload = d.l4
		return nil
	}
	err := dp.DecodeLayers(d.l4, &d.decoded)
	if dp.Truncated {
		return fmt.Errorf("%w: %s", ErrTruncated, d.failedLayer(gopacket.LayerTypeZero))
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, d.failedLayer(gopacket.LayerTypeZero), err)
	}
	return d.fillTransport(p, 0)
}

// failedLayer names the layer after the last one decoded.
func (d *Decoder) failedLayer(first gopacket.LayerType) string {
	if len(d.decoded) == 0 {
		if first == gopacket.LayerTypeZero {
			return "transport header"
		}
		return first.String() + " header"
	}
	return "header after " + d.decoded[len(d.decoded)-1].String()
}

// fillTransport copies the transport fields out of the decoded layers.
// skip is how many leading entries of d.decoded are IP layers.
func (d *Decoder) fillTransport(p *Packet, skip int) error {
	var last gopacket.LayerType
	if len(d.decoded) > skip {
		last = d.decoded[skip]
	}
	switch p.Proto {
	case ProtoTCP:
		if last != layers.LayerTypeTCP {
			return fmt.Errorf("%w: tcp header not decoded", ErrMalformed)
		}
		t := &d.tcp
		p.SrcPort, p.DstPort = uint16(t.SrcPort), uint16(t.DstPort)
		p.Seq, p.Ack = t.Seq, t.Ack
		p.Flags = TCPFlags(d.l4[13])
		p.Payload = t.Payload
	case ProtoUDP:
		if last != layers.LayerTypeUDP {
			return fmt.Errorf("%w: udp header not decoded", ErrMalformed)
		}
		u := &d.udp
		if int(u.Length) != len(d.l4) {
			return fmt.Errorf("%w: udp length %d, datagram has %d bytes", ErrMalformed, u.Length, len(d.l4))
		}
		p.SrcPort, p.DstPort = uint16(u.SrcPort), uint16(u.DstPort)
		p.Payload = u.Payload
		if u.Checksum == 0 {
			if p.Family == 6 && d.checksums && !d.csumNotReady {
				return fmt.Errorf("%w: udp checksum 0 over ipv6", ErrChecksum)
			}
			return nil
		}
	case ProtoICMP:
		if p.Family != 4 {
			p.Payload = d.l4
			return nil
		}
		if last != layers.LayerTypeICMPv4 {
			return fmt.Errorf("%w: icmp header not decoded", ErrMalformed)
		}
		c := &d.icmp4
		p.ICMPType, p.ICMPCode = c.TypeCode.Type(), c.TypeCode.Code()
		p.ICMPID, p.ICMPSeq = c.Id, c.Seq
		p.Payload = c.Payload
		if d.checksums && !d.csumNotReady && foldChecksum(sum16(d.l4, 0)) != 0xffff {
			return fmt.Errorf("%w: icmp", ErrChecksum)
		}
		return nil
	case ProtoICMPv6:
		if p.Family != 6 {
			p.Payload = d.l4
			return nil
		}
		if last != layers.LayerTypeICMPv6 {
			return fmt.Errorf("%w: icmpv6 header not decoded", ErrMalformed)
		}
		c := &d.icmp6
		p.ICMPType, p.ICMPCode = c.TypeCode.Type(), c.TypeCode.Code()
		p.Payload = c.Payload
		if p.ICMPType == layers.ICMPv6TypeEchoRequest || p.ICMPType == layers.ICMPv6TypeEchoReply {
			if len(c.Payload) < 4 {
				return fmt.Errorf("%w: icmpv6 echo", ErrTruncated)
			}
			p.ICMPID = binary.BigEndian.Uint16(c.Payload[0:2])
			p.ICMPSeq = binary.BigEndian.Uint16(c.Payload[2:4])
			p.Payload = c.Payload[4:]
		}
	default:
		p.Payload = d.l4
		return nil
	}
	if d.checksums && !d.csumNotReady && !transportChecksumOK(p, d.l4) {
		return fmt.Errorf("%w: %s", ErrChecksum, protoName(p.Proto, p.Family))
	}
	return nil
}

// protoName is the name of an IP protocol as carbd's Dest.Proto spells it.
func protoName(proto, family uint8) string {
	switch proto {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		if family == 4 {
			return "icmp"
		}
	case ProtoICMPv6:
		if family == 6 {
			return "icmpv6"
		}
	}
	return protoNumbers[proto]
}

var protoNumbers = func() (t [256]string) {
	for i := range t {
		t[i] = fmt.Sprint(i)
	}
	return
}()
