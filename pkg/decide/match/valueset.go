package match

import (
	"fmt"
	"iter"
	"strings"
)

// ValueSet is T_i, the trusted values: the values of the principal's task
// and of results from trusted sources, each with the origin it was first
// added from. Membership is Kairos' derivability D(x, T): equality after
// Norm. Values of any length are kept (see docs/provenance.md for why T,
// unlike S, has no minimum length); the empty value is never a member.
//
// The zero value is an empty set ready to use. A ValueSet is not safe for
// concurrent mutation; Contains, Origin and Len may run concurrently with
// each other when no Add or Truncate does.
type ValueSet struct {
	idx    map[string]int32 // normalised value -> position in vals
	vals   []string         // normalised values, in order of first Add
	origin []string         // origin of vals[i]
	// hide, when positive, hides every value at position hide-1 or
	// later from Contains, Origin and All (see Hide).
	hide int
}

// Hide makes the set answer as if it held only its first n values until
// Hide(-1): values added meanwhile are kept but not seen. The engine uses
// it while a speculative scope is being resolved, so effects decided in
// the meantime cannot build on values the scope may still roll back.
func (v *ValueSet) Hide(n int) {
	if n < 0 {
		v.hide = 0
		return
	}
	v.hide = n + 1
}

// visible reports whether the value at position i is seen.
func (v *ValueSet) visible(i int32) bool {
	return v.hide == 0 || int(i) < v.hide-1
}

// Add adds values with their origin. A value already in the set keeps its
// first origin. It returns how many values were new.
func (v *ValueSet) Add(origin string, values ...string) int {
	added := 0
	for _, val := range values {
		same := IsNorm(val)
		n := val
		if !same {
			n = Norm(val)
		}
		if n == "" {
			continue
		}
		if _, ok := v.idx[n]; ok {
			continue
		}
		if same {
			n = strings.Clone(n) // do not pin the caller's backing array
		}
		if v.idx == nil {
			v.idx = make(map[string]int32)
		}
		if len(v.vals) == 1<<31-1 {
			panic("match: value set full")
		}
		v.idx[n] = int32(len(v.vals))
		v.vals = append(v.vals, n)
		v.origin = append(v.origin, origin)
		added++
	}
	return added
}

// lookup finds Norm(x), normalising short values on the stack.
func (v *ValueSet) lookup(x string) (int32, bool) {
	if len(v.vals) == 0 {
		return 0, false
	}
	if IsNorm(x) {
		i, ok := v.idx[x]
		return i, ok
	}
	if len(x) <= 192 {
		var buf [256 + fillSlack]byte
		n, j := normFill(buf[:], 0, 256, x, 0)
		if j == len(x) {
			i, ok := v.idx[string(buf[:n])] // no allocation for the key
			return i, ok
		}
	}
	i, ok := v.idx[Norm(x)]
	return i, ok
}

// Contains reports D(x, T): whether Norm(x) is a value of the set.
func (v *ValueSet) Contains(x string) bool {
	i, ok := v.lookup(x)
	return ok && v.visible(i)
}

// Origin returns the origin the value equal to x after Norm was first
// added from.
func (v *ValueSet) Origin(x string) (string, bool) {
	i, ok := v.lookup(x)
	if !ok || !v.visible(i) {
		return "", false
	}
	return v.origin[i], true
}

// Len returns the number of distinct values; Truncate(Len()) later rolls
// back every Add made since.
func (v *ValueSet) Len() int { return len(v.vals) }

// All yields every value (normalised) with its origin, in order of first
// Add.
func (v *ValueSet) All() iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		for i, val := range v.vals {
			if !v.visible(int32(i)) || !yield(val, v.origin[i]) {
				return
			}
		}
	}
}

// Truncate removes every value first added after the set had n values. It
// panics if n is negative or larger than Len.
func (v *ValueSet) Truncate(n int) {
	if n < 0 || n > len(v.vals) {
		panic(fmt.Sprintf("match: truncate value set to %d, have %d values", n, len(v.vals)))
	}
	for _, val := range v.vals[n:] {
		delete(v.idx, val)
	}
	clear(v.vals[n:])
	clear(v.origin[n:])
	v.vals, v.origin = v.vals[:n], v.origin[:n]
}
