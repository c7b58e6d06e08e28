// Package benchstat holds the order statistics carbd's benchmarks report:
// one definition of a median and of a quantile for every benchmark, so
// that figures measured in different packages mean the same thing.
package benchstat

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Number is what the statistics take: rates, ratios and durations.
type Number interface {
	~int64 | ~float64
}

// Median is the middle of v, or the mean of its two middle values when
// len(v) is even (the median of two runs is their mean, not the larger).
// It is 0 for an empty v; v is not reordered.
func Median[T Number](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}

// Quantile is v's q-quantile by the nearest-rank definition: the smallest
// value at least a fraction q of the values are no larger than
// (s[ceil(q·n)-1] of the sorted values; q ≤ 0 gives the minimum, q ≥ 1 the
// maximum). A p99 of 100 values is the 99th smallest, not the largest.
// It is 0 for an empty v; v is not reordered.
func Quantile[T cmp.Ordered](v []T, q float64) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[rank(len(s), q)]
}

// SortedQuantile is Quantile of values already sorted in increasing order,
// for callers that take several quantiles of one large sample.
func SortedQuantile[T any](sorted []T, q float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	return sorted[rank(len(sorted), q)]
}

func rank(n int, q float64) int {
	k := int(math.Ceil(q*float64(n))) - 1
	return min(max(k, 0), n-1)
}

// Micros is d in microseconds, the unit latency figures are reported in.
func Micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
