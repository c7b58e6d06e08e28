package tcx

import (
	"encoding/binary"
	"net/netip"
)

// Raw packet builders for BPF_PROG_TEST_RUN. They write exactly the bytes
// asked for, so malformed packets are as easy as good ones; the program
// does not verify checksums, so they are left zero.

var be = binary.BigEndian

const (
	ethIPv4 = 0x0800
	ethIPv6 = 0x86dd
	ethARP  = 0x0806
)

func ether(typ uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(b[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	be.PutUint16(b[12:], typ)
	return append(b, payload...)
}

type ip4opt func(h []byte) []byte

// ipv4 builds an IPv4 header (20 bytes, TTL 64) before payload; opts may
// rewrite the header (it is re-measured afterwards unless an option fixes
// the length itself).
func ipv4(proto uint8, src, dst string, payload []byte, opts ...ip4opt) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	h[8] = 64
	h[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	for _, o := range opts {
		h = o(h)
	}
	if be.Uint16(h[2:]) == 0 && !fixedLen(h) {
		be.PutUint16(h[2:], uint16(len(h)+len(payload)))
	}
	return append(h, payload...)
}

// fixedLen marks a header whose total length an option set on purpose
// (byte 1, the TOS, carries the flag: tests do not use TOS otherwise).
func fixedLen(h []byte) bool { return h[1] == 0xff }

// withOptions appends n 4-byte words of IPv4 options (NOPs and an EOL).
func withOptions(words int) ip4opt {
	return func(h []byte) []byte {
		o := make([]byte, 4*words)
		for i := range o {
			o[i] = 1 // NOP
		}
		o[len(o)-1] = 0 // EOL
		h = append(h, o...)
		h[0] = 0x40 | byte(len(h)/4)
		return h
	}
}

func withFrag(mf bool, offset8 uint16) ip4opt {
	return func(h []byte) []byte {
		v := offset8 & 0x1fff
		if mf {
			v |= 0x2000
		}
		be.PutUint16(h[6:], v)
		return h
	}
}

func withTotLen(n uint16) ip4opt {
	return func(h []byte) []byte { be.PutUint16(h[2:], n); h[1] = 0xff; return h }
}

func withIHL(words byte) ip4opt {
	return func(h []byte) []byte { h[0] = 0x40 | words; return h }
}

func withVersion(v byte) ip4opt {
	return func(h []byte) []byte { h[0] = v<<4 | h[0]&0xf; return h }
}

// ipv6 builds an IPv6 header before payload (payload length filled in).
func ipv6(next uint8, src, dst string, hop uint8, payload []byte) []byte {
	h := make([]byte, 40, 40+len(payload))
	h[0] = 0x60
	be.PutUint16(h[4:], uint16(len(payload)))
	h[6] = next
	h[7] = hop
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	return append(h, payload...)
}

// ext6 is a generic IPv6 extension header of 8*(len8+1) bytes.
func ext6(next uint8, len8 uint8, payload []byte) []byte {
	h := make([]byte, 8*(int(len8)+1))
	h[0] = next
	h[1] = len8
	return append(h, payload...)
}

// ah6 is an authentication header with a 12-byte ICV (24 bytes: its
// length field counts 4-byte words minus 2).
func ah6(next uint8, payload []byte) []byte {
	h := make([]byte, 24)
	h[0] = next
	h[1] = 4
	return append(h, payload...)
}

func frag6(next uint8, offset8 uint16, more bool, payload []byte) []byte {
	h := make([]byte, 8)
	h[0] = next
	v := offset8 << 3
	if more {
		v |= 1
	}
	be.PutUint16(h[2:], v)
	be.PutUint32(h[4:], 0x1234)
	return append(h, payload...)
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

func tcp(sport, dport uint16, seq uint32, flags uint8, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	be.PutUint16(h[0:], sport)
	be.PutUint16(h[2:], dport)
	be.PutUint32(h[4:], seq)
	h[12] = 5 << 4
	h[13] = flags
	be.PutUint16(h[14:], 65535)
	return append(h, payload...)
}

func udp(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	be.PutUint16(h[0:], sport)
	be.PutUint16(h[2:], dport)
	be.PutUint16(h[4:], uint16(8+len(payload)))
	return append(h, payload...)
}

func icmp(typ, code uint8, id uint16) []byte {
	h := make([]byte, 8)
	h[0], h[1] = typ, code
	be.PutUint16(h[4:], id)
	be.PutUint16(h[6:], 1)
	return h
}

func arp() []byte {
	b := make([]byte, 28)
	be.PutUint16(b[0:], 1)      // Ethernet
	be.PutUint16(b[2:], 0x0800) // IPv4
	b[4], b[5] = 6, 4
	be.PutUint16(b[6:], 1) // request
	return b
}

func bytesN(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}
