package netparse

import (
	"encoding/binary"
	"math/bits"
)

// sum16 adds b to a one's complement sum (RFC 1071). Summing 64-bit words
// with end-around carry and folding at the end gives the same result as
// summing 16-bit words. b must start at an even offset of the checksummed
// data.
func sum16(b []byte, acc uint64) uint64 {
	var c uint64
	for len(b) >= 32 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[0:8]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[8:16]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[16:24]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[24:32]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	acc, c = bits.Add64(acc, c, 0)
	acc += c
	for len(b) >= 2 {
		acc, c = bits.Add64(acc, uint64(binary.BigEndian.Uint16(b)), 0)
		acc += c
		b = b[2:]
	}
	if len(b) == 1 {
		acc, c = bits.Add64(acc, uint64(b[0])<<8, 0)
		acc += c
	}
	return acc
}

// foldChecksum folds a sum to 16 bits. A correct checksummed region
// folds to 0xffff.
func foldChecksum(acc uint64) uint16 {
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	return uint16(acc)
}

// pseudoSum is the sum of the IPv4 or IPv6 pseudo-header.
func pseudoSum(p *Packet, proto uint8, length int) uint64 {
	var acc uint64
	if p.Family == 4 {
		s, d := p.Src.As4(), p.Dst.As4()
		acc = sum16(s[:], acc)
		acc = sum16(d[:], acc)
	} else {
		s, d := p.Src.As16(), p.Dst.As16()
		acc = sum16(s[:], acc)
		acc = sum16(d[:], acc)
	}
	return acc + uint64(proto) + uint64(length)
}

// transportChecksumOK verifies a TCP, UDP or ICMPv6 checksum over l4.
func transportChecksumOK(p *Packet, l4 []byte) bool {
	return foldChecksum(sum16(l4, pseudoSum(p, p.Proto, len(l4)))) == 0xffff
}
