package calib

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/mathext"
)

// ClopperPearsonUpper is the exact one-sided Clopper–Pearson upper
// confidence bound at level 1−delta for a binomial proportion after k
// successes in n trials: the p with P(Bin(n, p) <= k) = delta (the
// (1−delta) quantile of Beta(k+1, n−k)). It is 1 when k >= n (and for
// n = 0: no data bounds nothing). It panics if k < 0 or delta is not in
// (0, 1).
//
// The bound is found by bisection on the binomial tail written as a
// regularized incomplete beta function, P(Bin(n, p) <= k) =
// I_{1−p}(n−k, k+1), evaluated directly (not as one minus its
// complement), so it stays exact far in the tail: within 1e-9 relative
// for delta down to 1e-12 and n up to 10^7 (the tests compare it with
// exact binomial sums). A quantile routine that inverts the complement
// loses the tail: gonum's Beta.Quantile gives U(3, 50000; 5e-6) = 0.0351
// where the bound is 0.000390.
func ClopperPearsonUpper(k, n int, delta float64) float64 {
	if k < 0 || !(delta > 0 && delta < 1) {
		panic(fmt.Sprintf("calib: ClopperPearsonUpper(k=%d, n=%d, delta=%v) out of domain", k, n, delta))
	}
	if k >= n {
		return 1
	}
	if k == 0 {
		// (1−p)^n = delta has the closed form 1 − delta^(1/n).
		return -math.Expm1(math.Log(delta) / float64(n))
	}
	return bisectBinomialTail(k, n, delta)
}

// summedTailMaxK is the largest k whose binomial tail is summed term by
// term; above it the tail is gonum's regularized incomplete beta.
const summedTailMaxK = 1000

// bisectBinomialTail is the p in (0, 1) with P(Bin(n, p) <= k) = delta,
// for 0 < k < n. The tail is strictly decreasing in p: bisection keeps
// tail(lo) > delta >= tail(hi) until the interval cannot shrink in
// floating point or is narrower than 1e-15 of its upper end.
//
// The tail is evaluated as I_{1−p}(n−k, k+1) (mathext.RegIncBeta, which
// beyond the mean computes the small tail itself, not one minus its
// complement) when k > summedTailMaxK, and otherwise summed term by
// term (binomialLowerTail). The incomplete beta's prefactor carries
// log B(a, b) as a difference of log-gamma values of size n log n,
// whose rounding alone is a relative error of ~n log n · 1e-16 in the
// tail: 2e-8 at n = 10^7. For large k the tail is steep enough in p
// (d ln tail / d ln p grows as √k) that this error shrinks below 1e-9
// in p; for small k it does not, and the sum is exact to ~k · 1e-16.
func bisectBinomialTail(k, n int, delta float64) float64 {
	tail := func(p float64) float64 { return binomialLowerTail(k, n, p) }
	if k > summedTailMaxK {
		a, b := float64(n-k), float64(k+1)
		tail = func(p float64) float64 { return mathext.RegIncBeta(a, b, 1-p) }
	}
	lo, hi := 0.0, 1.0
	for range 2100 { // ample: each step halves, and the loop ends at float64 resolution
		mid := lo + (hi-lo)/2
		if mid <= lo || mid >= hi || hi-lo <= 1e-15*hi {
			break
		}
		if tail(mid) > delta {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo + (hi-lo)/2
}

// binomialLowerTail is P(Bin(n, p) <= k) for 0 <= k < n, summed from
// (1−p)^n by the term ratio (n−i)/(i+1) · p/(1−p), rescaled by powers
// of two so that neither the terms nor the sum overflow.
func binomialLowerTail(k, n int, p float64) float64 {
	if p <= 0 {
		return 1
	}
	if p >= 1 {
		return 0
	}
	r := p / (1 - p)
	sum, t, logScale := 1.0, 1.0, 0.0
	for i := range k {
		t *= float64(n-i) / float64(i+1) * r
		sum += t
		if sum > 0x1p900 {
			sum, t = math.Ldexp(sum, -900), math.Ldexp(t, -900)
			logScale += 900 * math.Ln2
		}
	}
	return math.Exp(float64(n)*math.Log1p(-p) + logScale + math.Log(sum))
}

// MaxAllowedViolations is the largest number K of violated calibration
// units a stratum of n units may allow at its threshold under rule:
//
//   - RuleCRC (Eq. 5): (K+1)/(n+1) <= alpha, i.e. K = floor(alpha(n+1)) − 1;
//   - RuleCP (Eq. 6): ClopperPearsonUpper(K, n, delta) <= alpha;
//   - RuleTransfer: the same with n the violated units only.
//
// It is −1 when not even K = 0 qualifies: the stratum is below its floor
// (1/(n+1) for RuleCRC) and no threshold keeps the budget. Budgets are
// read as the decimals they were written as: the product alpha(n+1) is
// rounded to the nearest integer when it is within 1e-15 (relative) of
// it, so 0.29 with n+1 = 100 gives K = 28, not 27.
func MaxAllowedViolations(rule Rule, n int, alpha, delta float64) int {
	if n < 0 {
		return -1
	}
	switch rule {
	case RuleCP, RuleTransfer:
		if n == 0 || ClopperPearsonUpper(0, n, delta) > alpha {
			return -1
		}
		// U is increasing in k and U(n) = 1 > alpha: binary search for
		// the last k with U(k) <= alpha.
		lo, hi := 0, n // U(lo) <= alpha < U(hi)
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if ClopperPearsonUpper(mid, n, delta) <= alpha {
				lo = mid
			} else {
				hi = mid
			}
		}
		return lo
	default:
		x := alpha * float64(n+1)
		k := int(math.Floor(x+x*1e-15)) - 1
		return min(k, n)
	}
}
