package intercept

import (
	"encoding/binary"
	"net/netip"
)

// TCP flags of synthetic segments.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpPSH = 0x08
	tcpACK = 0x10
)

// segmenter builds the Ethernet frames of a synthetic TCP connection
// between two addresses: the handshake that opens the connection in
// respwatch's tracker (the response tap then gives it the requests as
// parsed and the server's bytes without frames). It is not safe for
// concurrent use.
type segmenter struct {
	client, server netip.AddrPort
	buf            []byte
}

func newSegmenter(client, server netip.AddrPort) *segmenter {
	c, s := client.Addr().Unmap(), server.Addr().Unmap()
	if c.Is4() != s.Is4() { // one family for both ends
		c, s = netip.AddrFrom16(c.As16()), netip.AddrFrom16(s.As16())
	}
	return &segmenter{client: netip.AddrPortFrom(c, client.Port()), server: netip.AddrPortFrom(s, server.Port())}
}

// frame returns an Ethernet frame carrying one TCP segment; out says the
// client sends it. The result is valid until the next call. Checksums
// are left zero: both consumers are told to ignore them.
func (sg *segmenter) frame(out bool, seq, ack uint32, flags uint8, payload []byte) []byte {
	src, dst := sg.client, sg.server
	if !out {
		src, dst = dst, src
	}
	v4 := src.Addr().Is4()
	ipLen := 40
	if v4 {
		ipLen = 20
	}
	n := 14 + ipLen + 20 + len(payload)
	if cap(sg.buf) < n {
		sg.buf = make([]byte, n, max(n, 2048))
	}
	b := sg.buf[:n]
	clear(b[:14+ipLen+20])
	// Ethernet: locally administered MACs, the EtherType.
	b[0], b[6] = 0x02, 0x02
	b[5], b[11] = 2, 1
	if !out {
		b[5], b[11] = 1, 2
	}
	ip := b[14:]
	if v4 {
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+20+len(payload)))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8], ip[9] = 64, 6
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip[:20]))
	} else {
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(20+len(payload)))
		ip[6], ip[7] = 6, 64
		s16, d16 := src.Addr().As16(), dst.Addr().As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
	}
	tcp := ip[ipLen:]
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	copy(tcp[20:], payload)
	return b
}

func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
