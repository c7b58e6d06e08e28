package score

import "fmt"

// Kind names a similarity function.
type Kind string

const (
	KindToken Kind = "token" // exact-token containment
	KindNgram Kind = "ngram" // character n-gram containment after normalisation
	KindMax   Kind = "max"   // the larger of token and n-gram
)

// Kinds lists every similarity kind.
var Kinds = []Kind{KindToken, KindNgram, KindMax}

// ParseKind parses "token", "ngram" or "max".
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("score: unknown similarity kind %q (want token, ngram or max)", s)
}

// NgramN is the length, in runes, of the character n-grams of KindNgram.
const NgramN = 4

// Score returns the annotation-free score of value x (Eq. 4):
// (sim(x, untrusted) − sim(x, trusted) + 1) / 2, in [0, 1], larger meaning
// more untrusted influence. A nil context is empty. For KindMax it is the
// larger of the token and the n-gram scores. An unknown kind scores 1,
// the most suspicious value: callers validate kinds with ParseKind.
func Score(kind Kind, x string, untrusted, trusted *Context) float64 {
	var buf [64]uint64
	switch kind {
	case KindToken:
		hs := appendTokenHashes(buf[:0], x)
		return rescale(untrusted.containment(hs, false), trusted.containment(hs, false))
	case KindNgram:
		hs, grams := appendNgramHashes(buf[:0], x)
		return rescale(untrusted.containment(hs, grams), trusted.containment(hs, grams))
	case KindMax:
		hs := appendTokenHashes(buf[:0], x)
		t := rescale(untrusted.containment(hs, false), trusted.containment(hs, false))
		hs, grams := appendNgramHashes(hs[:0], x)
		if !grams {
			return t // no n-gram: the n-gram score is the token score
		}
		return max(t, rescale(untrusted.containment(hs, true), trusted.containment(hs, true)))
	}
	return 1
}

// rescale maps a similarity difference in [-1, 1] to [0, 1].
func rescale(u, t float64) float64 { return (u - t + 1) / 2 }
