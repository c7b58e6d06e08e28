package score

import (
	"hash/maphash"
	"unicode"
	"unicode/utf8"
)

// seed keys every unit hash of this process, so collisions cannot be
// searched for offline. Hashes are never stored or compared across
// processes.
var seed = maphash.MakeSeed()

// asciiUnit maps an ASCII byte to its lowercase form when it is a letter
// or a digit, and to 0 otherwise.
var asciiUnit = func() (t [utf8.RuneSelf]byte) {
	for c := byte('0'); c <= '9'; c++ {
		t[c] = c
	}
	for c := byte('a'); c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = c, c
	}
	return t
}()

// isUnitRune reports whether r belongs to a token / a normalised n-gram.
func isUnitRune(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r) || unicode.IsDigit(r)
}

func lower(r rune) rune {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	return unicode.ToLower(r)
}

// appendTokenHashes appends the hash of each token of s (maximal runs of
// letters and digits, lowercased), in order, with repetitions.
func appendTokenHashes(dst []uint64, s string) []uint64 {
	var tb [64]byte
	tok := tb[:0]
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			i++
			if l := asciiUnit[c]; l != 0 {
				tok = append(tok, l)
				continue
			}
			if len(tok) > 0 {
				dst = append(dst, maphash.Bytes(seed, tok))
				tok = tok[:0]
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if isUnitRune(r) {
			tok = utf8.AppendRune(tok, lower(r))
			continue
		}
		if len(tok) > 0 {
			dst = append(dst, maphash.Bytes(seed, tok))
			tok = tok[:0]
		}
	}
	if len(tok) > 0 {
		dst = append(dst, maphash.Bytes(seed, tok))
	}
	return dst
}

// normalise appends s lowercased with every rune that is not a letter or
// a digit removed (the n-gram normalisation).
func normalise(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			i++
			if l := asciiUnit[c]; l != 0 {
				dst = append(dst, l)
			}
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		if isUnitRune(r) {
			dst = utf8.AppendRune(dst, lower(r))
		}
	}
	return dst
}

// appendNgramHashes appends the hash of each NgramN-rune window of the
// normalised s, in order, with repetitions, and reports true. When the
// normalised s is shorter than NgramN runes it appends s's token hashes
// instead and reports false: such a value is looked up as tokens.
func appendNgramHashes(dst []uint64, s string) ([]uint64, bool) {
	var nb [256]byte
	buf := normalise(nb[:0], s)
	var ring [NgramN]int // start offsets of the last NgramN runes
	n0, cnt := len(dst), 0
	for i := 0; i < len(buf); {
		size := 1
		if buf[i] >= utf8.RuneSelf {
			_, size = utf8.DecodeRune(buf[i:])
		}
		ring[cnt%NgramN] = i
		cnt++
		i += size
		if cnt >= NgramN {
			dst = append(dst, maphash.Bytes(seed, buf[ring[(cnt-NgramN)%NgramN]:i]))
		}
	}
	if cnt < NgramN {
		return appendTokenHashes(dst[:n0], s), false
	}
	return dst, true
}
