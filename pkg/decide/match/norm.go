package match

import (
	"encoding/binary"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Norm is Kairos' normalisation: lowercase, whitespace removed. It is
// idempotent: Norm(Norm(s)) == Norm(s).
//
// Exactly: s is read rune by rune as a Go range loop reads it (an invalid
// byte is one utf8.RuneError); runes for which unicode.IsSpace holds are
// dropped, every other rune r is written as unicode.ToLower(r). A string
// that is already normalised is returned as is, without allocating.
func Norm(s string) string {
	k := normalPrefix(s)
	if k == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	b.WriteString(s[:k])
	var buf [256 + fillSlack]byte
	for i := k; i < len(s); {
		var n int
		n, i = normFill(buf[:], 0, 256, s, i)
		b.Write(buf[:n])
	}
	return b.String()
}

// IsNorm reports whether s is already normalised (Norm(s) == s).
func IsNorm(s string) bool { return normalPrefix(s) == len(s) }

const (
	lo7 = 0x7f7f7f7f7f7f7f7f
	hi1 = 0x8080808080808080
	rep = 0x0101010101010101
)

// load64 reads s[i:i+8] little-endian (one load on amd64 and arm64).
func load64(s string, i int) uint64 {
	s = s[i : i+8]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// classify returns, for the eight bytes of w, a mask with the high bit of
// each byte set where the byte is non-ASCII (hb), an ASCII upper-case
// letter (upper) or ASCII whitespace as Norm's ASCII path defines it:
// space, \t, \n, \v, \f, \r (ws). upper and ws are meaningless for
// non-ASCII bytes. No carry crosses a byte: every sum stays below 0x100.
func classify(w uint64) (hb, upper, ws uint64) {
	x := w & lo7
	hb = w & hi1
	ge41 := (x + 0x3f*rep) & hi1 // x >= 'A'
	ge5b := (x + 0x25*rep) & hi1 // x >  'Z'
	upper = ge41 &^ ge5b
	eq20 := ^((x ^ 0x20*rep) + lo7) & hi1 // x == ' '
	ge09 := (x + 0x77*rep) & hi1          // x >= '\t'
	ge0e := (x + 0x72*rep) & hi1          // x >  '\r'
	ws = eq20 | (ge09 &^ ge0e)
	return
}

// fillSlack is the room normFill needs past limit in its buffer.
const fillSlack = 16

// normFill writes Norm(s[i:]) to b[n:] until at least limit bytes are in
// b or s is exhausted, and returns the new fill level and the position in
// s where it stopped (always a rune boundary as a range loop over s sees
// it). b must have len(b) >= limit+fillSlack. Bytes of b past the
// returned fill level may be overwritten.
func normFill(b []byte, n, limit int, s string, i int) (int, int) {
	for n < limit && i < len(s) {
		if i+16 <= len(s) {
			k, c := normFast(b[n:limit+fillSlack], s[i:])
			n += k
			i += c
			if c > 0 {
				continue
			}
		}
		if i+8 <= len(s) {
			w := load64(s, i)
			hb, upper, ws := classify(w)
			if hb == 0 {
				binary.LittleEndian.PutUint64(b[n:], compress(w|upper>>2, ws))
				n += 8 - bits.OnesCount64(ws)
				i += 8
				continue
			}
			// The ASCII bytes before the first non-ASCII one.
			if a := bits.TrailingZeros64(hb) >> 3; a > 0 {
				m := uint64(1)<<(uint(a)*8) - 1
				binary.LittleEndian.PutUint64(b[n:], compress((w|upper>>2)&m, ws&m))
				n += a - bits.OnesCount64(ws&m)
				i += a
				continue
			}
		}
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			switch c {
			case ' ', '\t', '\n', '\r', '\v', '\f':
				continue
			}
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b[n] = c
			n++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if unicode.IsSpace(r) {
			continue
		}
		n += utf8.EncodeRune(b[n:], unicode.ToLower(r))
	}
	return n, i
}

// compress removes from w the bytes marked (bit 7) in ws and packs the
// others into the low bytes, in order, without a branch: each kept byte
// moves down by the number of removed bytes before it, in three steps of
// 1, 2 and 4 bytes. A byte never overtakes or lands on another: two kept
// bytes i < j move by c_i <= c_j with j-i > c_j-c_i.
func compress(w, ws uint64) uint64 {
	d := ws >> 7          // 1 in each removed byte
	c := (d * rep) << 8   // removed bytes before each byte
	w &^= d * 0xff        // zero the removed bytes
	m := (c & rep) * 0xff // bytes that move by 1
	w = w&^m | (w&m)>>8
	c = c&^m | (c&m)>>8       // their counts move with them
	m = (c >> 1 & rep) * 0xff // by 2
	w = w&^m | (w&m)>>16
	c = c&^m | (c&m)>>16
	m = (c >> 2 & rep) * 0xff // by 4
	return w&^m | (w&m)>>32
}

// normalPrefix returns the length of the longest prefix of s that Norm
// leaves unchanged and that ends on a rune boundary.
func normalPrefix(s string) int {
	i := 0
	for i < len(s) {
		if i+8 <= len(s) {
			hb, upper, ws := classify(load64(s, i))
			sp := hb | upper | ws
			if sp == 0 {
				i += 8
				continue
			}
			i += bits.TrailingZeros64(sp) >> 3
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' || c == ' ' || '\t' <= c && c <= '\r' {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || unicode.IsSpace(r) || unicode.ToLower(r) != r {
			return i
		}
		i += size
	}
	return i
}

// normRune reports how many bytes Norm writes for the rune of s at i and
// the width of that rune in s.
func normRune(s string, i int) (out, size int) {
	c := s[i]
	if c < utf8.RuneSelf {
		switch c {
		case ' ', '\t', '\n', '\r', '\v', '\f':
			return 0, 1
		}
		return 1, 1
	}
	r, size := utf8.DecodeRuneInString(s[i:])
	if unicode.IsSpace(r) {
		return 0, size
	}
	return utf8.RuneLen(unicode.ToLower(r)), size
}
