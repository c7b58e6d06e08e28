package match

import (
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// normRef is the original, obviously correct Norm: the reference every
// optimised path is checked against.
func normRef(s string) string {
	var b strings.Builder
	for _, r := range s {
		if unicode.IsSpace(r) {
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// refRecord is one token of the reference model of an Index.
type refRecord struct {
	text, origin string
	level        uint8
}

// refIndex is the obviously correct model of Index: a list of records with
// the same admission rule, and a scan by strings.Index on the normalised
// content.
type refIndex struct{ recs []refRecord }

func (r *refIndex) add(origin string, level uint8, toks ...string) int {
	added := 0
	for _, tok := range toks {
		t := normRef(tok)
		if len(t) < MinTokenLen {
			continue
		}
		if c, ok := r.current(t); ok && c.level >= level {
			continue
		}
		r.recs = append(r.recs, refRecord{t, origin, level})
		added++
	}
	return added
}

func (r *refIndex) current(t string) (refRecord, bool) {
	for i := len(r.recs) - 1; i >= 0; i-- {
		if r.recs[i].text == t {
			return r.recs[i], true
		}
	}
	return refRecord{}, false
}

// scan returns the hits the Index must report, in order of first
// occurrence (ties: in any order, so the caller sorts by token too).
func (r *refIndex) scan(content string) (uint8, []Hit) {
	norm := normRef(content)
	type occ struct {
		pos int
		h   Hit
	}
	var occs []occ
	done := map[string]bool{}
	for i := len(r.recs) - 1; i >= 0; i-- {
		rec := r.recs[i]
		if done[rec.text] {
			continue
		}
		done[rec.text] = true
		if p := strings.Index(norm, rec.text); p >= 0 {
			occs = append(occs, occ{p, Hit{Token: rec.text, Level: rec.level, Origin: rec.origin, Offset: rawOffsetRef(content, p)}})
		}
	}
	sortStable(occs, func(a, b occ) bool {
		if a.pos != b.pos {
			return a.pos < b.pos
		}
		return a.h.Token < b.h.Token
	})
	var max uint8
	hits := make([]Hit, len(occs))
	for i, o := range occs {
		hits[i] = o.h
		if i == 0 || o.h.Level > max {
			max = o.h.Level
		}
	}
	return max, hits
}

// rawOffsetRef maps position p of normRef(s) to the offset of the rune of
// s that produced it.
func rawOffsetRef(s string, p int) int {
	at := 0
	for i, r := range s {
		if unicode.IsSpace(r) {
			continue
		}
		n := utf8.RuneLen(unicode.ToLower(r))
		if at+n > p {
			return i
		}
		at += n
	}
	return len(s)
}

func sortStable[T any](s []T, less func(a, b T) bool) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && less(s[j], s[j-1]); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// Pieces the random generators build text from: ASCII, upper case,
// every kind of whitespace Norm removes, multi-byte runes whose lower case
// changes length, and invalid UTF-8.
var (
	spaces = []string{" ", "\t", "\n", "\r", "\v", "\f", "\u00a0", "\u0085", "\u2028", "\u3000", "  \n "}
	exotic = []string{"é", "É", "İ", "K", "Ⱥ", "ß", "ẞ", "Σ", "ς", "日本", "\xff", "\xe2\x82", "\xc0\xaf", "\ufffd", "€", "\x00"}
)

// randText returns n pieces drawn from alphabet, with random whitespace,
// case changes and exotic runes mixed in.
func randText(rng *rand.Rand, alphabet string, n int) string {
	var b strings.Builder
	for range n {
		switch k := rng.IntN(20); {
		case k < 2:
			b.WriteString(spaces[rng.IntN(len(spaces))])
		case k < 3:
			b.WriteString(exotic[rng.IntN(len(exotic))])
		case k < 6:
			b.WriteString(strings.ToUpper(string(alphabet[rng.IntN(len(alphabet))])))
		default:
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
	}
	return b.String()
}

// sprinkle inserts whitespace into s at random rune boundaries and
// randomly upper-cases ASCII letters, so that Norm(sprinkle(s)) == Norm(s).
func sprinkle(rng *rand.Rand, s string) string {
	var b strings.Builder
	for _, r := range s {
		if rng.IntN(4) == 0 {
			b.WriteString(spaces[rng.IntN(len(spaces))])
		}
		if r < utf8.RuneSelf && rng.IntN(2) == 0 {
			r = unicode.ToUpper(r)
		}
		b.WriteRune(r)
	}
	if rng.IntN(4) == 0 {
		b.WriteString(spaces[rng.IntN(len(spaces))])
	}
	return b.String()
}
