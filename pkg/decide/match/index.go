package match

import (
	"fmt"
	"math/bits"
	"strings"
)

// MinTokenLen is the shortest normalised token, in bytes, that an Index
// keeps. Shorter tokens are ignored (and counted in IndexStats.Short):
// they occur by chance in unrelated text far too often (see
// docs/provenance.md), and the scan's stride depends on it.
const MinTokenLen = 8

const (
	gramLen  = 5                         // q: bytes of a probed q-gram
	stride   = MinTokenLen - gramLen + 1 // k: probe every k-th position
	gramMask = 1<<(8*gramLen) - 1        // a q-gram's bytes in a little-endian word
	hashQ    = 0xD6E8FEB86659FD93        // multiplicative hash of a q-gram
	hashP    = 0x9E3779B97F4A7C15        // multiplicative hash of a prefix
	minBits  = 10                        // smallest table: 1 Ki entries
	gramPer  = 128                       // gram-filter bits per token
	prefPer  = 32                        // prefix-filter bits per token
)

// Index is S_i, the sensitive tokens: every token is a normalised string
// of at least MinTokenLen bytes with the sensitivity level and the origin
// of the content it came from. Scan reports which tokens occur anywhere in
// an effect after normalisation.
//
// Add is incremental (amortised O(len(token))), Truncate rolls back to an
// earlier Len. The zero value is an empty index ready to use.
//
// An Index is not safe for concurrent mutation: Add and Truncate need
// exclusive access, while any number of Scan, ScanFunc and MaxLevel calls
// may run at once when no mutation does.
type Index struct {
	// Ignore, when set, drops every token (normalised) for which it
	// returns true, e.g. a policy's list of words too common to mean
	// anything; they are counted in IndexStats.Ignored. Set it before the
	// first Add.
	Ignore func(token string) bool

	// Per token (record), indexed by its id = position of the Add.
	toks   []string // normalised token
	pre    []uint64 // its first 8 bytes, little-endian
	next   []int32  // next record in the same prefix-hash chain, or -1
	prev   []int32  // older record with the same token, or -1
	levels []uint8
	origin []string

	byText map[string]int32 // token -> newest record with that text
	heads  []int32          // prefix hash -> newest record of the chain, or -1
	hshift uint8            // 64 - log2(len(heads))
	gbits  []uint64         // q-gram hash -> some record has it at an offset 0..k-1 (a bitset)
	gshift uint8            // 64 - log2(64*len(gbits))
	pbits  []uint64         // prefix hash -> some record may have it (a bitset)
	pshift uint8            // 64 - log2(64*len(pbits))
	top    uint8            // highest level of any record
	stale  int              // records removed since the filters were built

	short, dup, ignored int // tokens dropped since creation
}

// IndexStats describes an Index.
type IndexStats struct {
	Tokens     int // records (Len)
	Short      int // tokens ignored as shorter than MinTokenLen after Norm
	Duplicates int // tokens ignored because already present at a level at least as high
	Ignored    int // tokens dropped by Ignore
	TableBytes int // size of the hash tables
}

// Hit is one sensitive token found in an effect.
type Hit struct {
	Token  string // the normalised token
	Level  uint8  // its sensitivity level
	Origin string // where it was read, as given to Add
	// Offset is where the first occurrence starts in the scanned content:
	// the byte offset of the rune whose normalised form holds the first
	// byte of the match.
	Offset int
}

// Len returns the number of tokens in the index; Truncate(Len()) later
// rolls back every Add made since.
func (x *Index) Len() int { return len(x.toks) }

// Top returns the highest level of any token, and false when the index is
// empty.
func (x *Index) Top() (uint8, bool) { return x.top, len(x.toks) > 0 }

// Stats returns counts about the index.
func (x *Index) Stats() IndexStats {
	return IndexStats{
		Tokens:     len(x.toks),
		Short:      x.short,
		Duplicates: x.dup,
		Ignored:    x.ignored,
		TableBytes: 4*len(x.heads) + 8*len(x.gbits) + 8*len(x.pbits),
	}
}

// Add adds tokens read from origin at level. Each token is normalised;
// tokens shorter than MinTokenLen after normalisation are ignored, and so
// is a token already present at the same or a higher level (a token added
// again at a higher level is added again and takes over). It returns how
// many tokens were added.
func (x *Index) Add(origin string, level uint8, tokens ...string) int {
	added := 0
	for _, tok := range tokens {
		same := IsNorm(tok)
		t := tok
		if !same {
			t = Norm(tok)
		}
		if len(t) < MinTokenLen {
			x.short++
			continue
		}
		if x.Ignore != nil && x.Ignore(t) {
			x.ignored++
			continue
		}
		if x.byText == nil {
			x.byText = make(map[string]int32)
		}
		older := int32(-1)
		if id, ok := x.byText[t]; ok {
			if x.levels[id] >= level {
				x.dup++
				continue
			}
			older = id
		}
		if same {
			// Do not keep the caller's (possibly much larger) backing
			// array alive.
			t = strings.Clone(t)
		}
		x.add(t, origin, level, older)
		added++
	}
	return added
}

func (x *Index) add(t, origin string, level uint8, older int32) {
	id := int32(len(x.toks))
	if id == 1<<31-1 {
		panic("match: index full")
	}
	p := load64(t, 0)
	x.toks = append(x.toks, t)
	x.pre = append(x.pre, p)
	x.prev = append(x.prev, older)
	x.levels = append(x.levels, level)
	x.origin = append(x.origin, origin)
	x.byText[t] = id
	if level > x.top || id == 0 {
		x.top = level
	}
	if 2*len(x.toks) > len(x.heads) || gramPer*len(x.toks) > 64*len(x.gbits) || prefPer*len(x.toks) > 64*len(x.pbits) {
		x.next = append(x.next, -1)
		x.rebuild()
		return
	}
	h := p * hashP >> x.hshift
	x.next = append(x.next, x.heads[h])
	x.heads[h] = id
	x.addFilters(t, p)
}

// addFilters records a token in the gram filter and the prefix filter.
func (x *Index) addFilters(t string, p uint64) {
	for j := 0; j < stride; j++ {
		g := gramHash(p>>(8*j), x.gshift)
		x.gbits[g>>6] |= 1 << (g & 63)
	}
	f := p * hashP >> x.pshift
	x.pbits[f>>6] |= 1 << (f & 63)
}

// rebuild sizes the tables for the current number of records and fills
// them. Chains are built in ascending id order, so every chain's head is
// its newest record, which Truncate relies on.
func (x *Index) rebuild() {
	n := len(x.toks)
	hb := max(minBits, bits.Len(uint(2*n)))
	gb := max(minBits, bits.Len(uint(gramPer*n)))
	pb := max(minBits, bits.Len(uint(prefPer*n)))
	if hb > 30 || gb > 36 || pb > 36 {
		panic("match: index too large")
	}
	if len(x.heads) != 1<<hb {
		x.heads = make([]int32, 1<<hb)
		x.hshift = uint8(64 - hb)
	}
	for i := range x.heads {
		x.heads[i] = -1
	}
	for id := range n {
		h := x.pre[id] * hashP >> x.hshift
		x.next[id] = x.heads[h]
		x.heads[h] = int32(id)
	}
	x.rebuildFilters(gb, pb)
}

// rebuildFilters sizes the gram filter to 2^gb bits and the prefix
// filter to 2^pb bits and fills them from the records.
func (x *Index) rebuildFilters(gb, pb int) {
	if 64*len(x.gbits) != 1<<gb {
		x.gbits = make([]uint64, 1<<gb/64)
		x.gshift = uint8(64 - gb)
	} else {
		clear(x.gbits)
	}
	if 64*len(x.pbits) != 1<<pb {
		x.pbits = make([]uint64, 1<<pb/64)
		x.pshift = uint8(64 - pb)
	} else {
		clear(x.pbits)
	}
	x.stale = 0
	for id, t := range x.toks {
		x.addFilters(t, x.pre[id])
	}
}

// Truncate removes every token added after the index had n tokens, so an
// aborted speculative scope leaves nothing behind. It panics if n is
// negative or larger than Len.
func (x *Index) Truncate(n int) {
	if n < 0 || n > len(x.toks) {
		panic(fmt.Sprintf("match: truncate index to %d, have %d tokens", n, len(x.toks)))
	}
	if n == len(x.toks) {
		return
	}
	for id := len(x.toks) - 1; id >= n; id-- {
		// The newest record is the head of its chain (pushed last, or
		// placed last by rebuild).
		h := x.pre[id] * hashP >> x.hshift
		x.heads[h] = x.next[id]
		t := x.toks[id]
		if o := x.prev[id]; o >= 0 {
			x.byText[t] = o
		} else {
			delete(x.byText, t)
		}
	}
	clear(x.toks[n:])
	clear(x.origin[n:])
	x.stale += len(x.toks) - n
	x.toks, x.origin = x.toks[:n], x.origin[:n]
	x.pre, x.next, x.prev, x.levels = x.pre[:n], x.next[:n], x.prev[:n], x.levels[:n]
	x.top = 0
	for _, l := range x.levels {
		x.top = max(x.top, l)
	}
	// The filters only ever gain bits. A removed token's bits are
	// harmless (its candidates fail the exact checks) but cost probes:
	// rebuild once they are a quarter of what is left.
	if 4*x.stale > n {
		x.rebuildFilters(bits.Len(uint(64*len(x.gbits)))-1, bits.Len(uint(64*len(x.pbits)))-1)
	}
}

// gramHash returns the gram filter's bit for the q-gram in the low
// gramLen bytes of w (the rest of w is ignored).
func gramHash(w uint64, shift uint8) uint64 {
	return (w & gramMask) * hashQ >> (shift & 63)
}
