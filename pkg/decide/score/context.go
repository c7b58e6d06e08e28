package score

import "math/bits"

// Config bounds the memory of a Context. Zero fields take the defaults.
type Config struct {
	// MaxEntries is the number of exact unit hashes each of the two sets
	// (tokens, n-grams) keeps before new units go to the overflow filter.
	MaxEntries int
	// OverflowBits is the size of each overflow Bloom filter, rounded up
	// to a power of two (at least 64, at most 1<<32).
	OverflowBits int
}

const (
	defaultMaxEntries   = 1 << 18
	defaultOverflowBits = 1 << 21
)

// Context is a growing body of text (the untrusted context u or the
// trusted prompt t of Eq. 4) kept as hashed token and n-gram sets. The
// zero value is an empty context with the default Config.
type Context struct {
	cfg     Config
	tokens  unitSet
	ngrams  unitSet
	scratch []uint64
}

// NewContext returns an empty context with the given bounds.
func NewContext(cfg Config) *Context {
	return &Context{cfg: cfg}
}

// Add appends text to the context: its tokens and n-grams become present.
// Adding "ab" then "cd" is not the same as adding "abcd": n-grams do not
// span two Add calls, as they would not span two documents.
func (c *Context) Add(text string) {
	maxEntries, bitsN := c.bounds()
	c.scratch = appendTokenHashes(c.scratch[:0], text)
	for _, h := range c.scratch {
		c.tokens.add(h, maxEntries, bitsN)
	}
	var grams bool
	c.scratch, grams = appendNgramHashes(c.scratch[:0], text)
	if grams { // a text shorter than NgramN has tokens only
		for _, h := range c.scratch {
			c.ngrams.add(h, maxEntries, bitsN)
		}
	}
	if cap(c.scratch) > 1<<16 {
		c.scratch = nil // do not pin a large buffer after one big document
	}
}

// Sim returns the containment similarity of x in the context, in [0, 1]:
// the fraction of x's units (tokens or n-grams, per kind) present in it.
// For KindMax it is the larger of the two. A nil context, or an unknown
// kind, gives 0.
func (c *Context) Sim(kind Kind, x string) float64 {
	var buf [64]uint64
	switch kind {
	case KindToken:
		return c.containment(appendTokenHashes(buf[:0], x), false)
	case KindNgram:
		hs, grams := appendNgramHashes(buf[:0], x)
		return c.containment(hs, grams)
	case KindMax:
		t := c.containment(appendTokenHashes(buf[:0], x), false)
		hs, grams := appendNgramHashes(buf[:0], x)
		return max(t, c.containment(hs, grams))
	}
	return 0
}

// Len reports how many distinct token and n-gram hashes the context holds
// exactly (units in the overflow filters are not counted).
func (c *Context) Len() (tokens, ngrams int) {
	if c == nil {
		return 0, 0
	}
	return len(c.tokens.exact), len(c.ngrams.exact)
}

// Overflowed reports whether a set reached Config.MaxEntries, so that
// later units live in a Bloom filter (over-reporting similarity only).
func (c *Context) Overflowed() bool {
	return c != nil && (c.tokens.bloom != nil || c.ngrams.bloom != nil)
}

func (c *Context) bounds() (maxEntries int, bitsN uint64) {
	maxEntries = c.cfg.MaxEntries
	if maxEntries <= 0 {
		maxEntries = defaultMaxEntries
	}
	b := c.cfg.OverflowBits
	if b <= 0 {
		b = defaultOverflowBits
	}
	b = min(max(b, 64), 1<<32)
	return maxEntries, uint64(1) << bits.Len64(uint64(b-1))
}

// containment is the fraction of hs present in the token set, or in the
// n-gram set when grams is true. No unit gives 0.
func (c *Context) containment(hs []uint64, grams bool) float64 {
	if c == nil || len(hs) == 0 {
		return 0
	}
	set := &c.tokens
	if grams {
		set = &c.ngrams
	}
	if set.exact == nil && set.bloom == nil {
		return 0
	}
	hit := 0
	for _, h := range hs {
		if set.has(h) {
			hit++
		}
	}
	return float64(hit) / float64(len(hs))
}

// unitSet is an exact hash set bounded to maxEntries, then a Bloom filter.
type unitSet struct {
	exact map[uint64]struct{}
	bloom []uint64 // bit array, len*64 a power of two; nil until overflow
}

func (s *unitSet) add(h uint64, maxEntries int, bitsN uint64) {
	if s.exact == nil {
		s.exact = make(map[uint64]struct{}, 64)
	}
	if _, ok := s.exact[h]; ok {
		return
	}
	if len(s.exact) < maxEntries {
		s.exact[h] = struct{}{}
		return
	}
	if s.bloom == nil {
		s.bloom = make([]uint64, bitsN/64)
	}
	i, j := s.probes(h)
	s.bloom[i/64] |= 1 << (i % 64)
	s.bloom[j/64] |= 1 << (j % 64)
}

func (s *unitSet) has(h uint64) bool {
	if _, ok := s.exact[h]; ok {
		return true
	}
	if s.bloom == nil {
		return false
	}
	i, j := s.probes(h)
	return s.bloom[i/64]&(1<<(i%64)) != 0 && s.bloom[j/64]&(1<<(j%64)) != 0
}

// probes derives the two Bloom positions from the two halves of the hash.
func (s *unitSet) probes(h uint64) (uint64, uint64) {
	mask := uint64(len(s.bloom))*64 - 1
	return h & mask, (h >> 32) & mask
}
