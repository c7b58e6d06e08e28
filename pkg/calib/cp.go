package calib

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat/distuv"
)

// ClopperPearsonUpper is the exact one-sided Clopper–Pearson upper
// confidence bound at level 1−delta for a binomial proportion after k
// successes in n trials: the p with P(Bin(n, p) <= k) = delta, which is
// the (1−delta) quantile of Beta(k+1, n−k). It is 1 when k >= n (and for
// n = 0: no data bounds nothing). It panics if k < 0 or delta is not in
// (0, 1).
func ClopperPearsonUpper(k, n int, delta float64) float64 {
	if k < 0 || !(delta > 0 && delta < 1) {
		panic(fmt.Sprintf("calib: ClopperPearsonUpper(k=%d, n=%d, delta=%v) out of domain", k, n, delta))
	}
	if k >= n {
		return 1
	}
	if k == 0 {
		// Beta(1, n) has the closed-form quantile 1 − (1−q)^(1/n); use it
		// for accuracy at large n.
		return -math.Expm1(math.Log(delta) / float64(n))
	}
	return distuv.Beta{Alpha: float64(k + 1), Beta: float64(n - k)}.Quantile(1 - delta)
}

// MaxAllowedViolations is the largest number K of violated calibration
// units a stratum of n units may allow at its threshold under rule:
//
//   - RuleCRC (Eq. 5): (K+1)/(n+1) <= alpha, i.e. K = floor(alpha(n+1)) − 1;
//   - RuleCP (Eq. 6): ClopperPearsonUpper(K, n, delta) <= alpha.
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
	case RuleCP:
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
