package calib

import (
	"math"
	"math/big"
	"testing"
)

// These tests check ClopperPearsonUpper against references computed
// independently of any Beta function: the binomial tail summed exactly
// (up to 256-bit rounding) in big.Float, inverted by bisection on p.

const bigPrec = 256

// bigPow is x^n by repeated squaring at bigPrec bits.
func bigPow(x *big.Float, n int) *big.Float {
	r := new(big.Float).SetPrec(bigPrec).SetInt64(1)
	b := new(big.Float).SetPrec(bigPrec).Set(x)
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			r.Mul(r, b)
		}
		b.Mul(b, b)
	}
	return r
}

// binomTailBig is P(Bin(n, p) <= k) for the float64 p taken exactly:
// sum over i <= k of C(n, i) p^i (1−p)^(n−i), each term from the last by
// the ratio (n−i)/(i+1) · p/(1−p).
func binomTailBig(k, n int, p float64) *big.Float {
	P := new(big.Float).SetPrec(bigPrec).SetFloat64(p)
	Q := new(big.Float).SetPrec(bigPrec).SetInt64(1)
	Q.Sub(Q, P) // exact: p has 53 significant bits
	ratio := new(big.Float).SetPrec(bigPrec).Quo(P, Q)
	term := bigPow(Q, n)
	sum := new(big.Float).SetPrec(bigPrec).Set(term)
	f := new(big.Float).SetPrec(bigPrec)
	for i := 0; i < k; i++ {
		f.SetInt64(int64(n - i))
		term.Mul(term, f)
		f.SetInt64(int64(i + 1))
		term.Quo(term, f)
		term.Mul(term, ratio)
		sum.Add(sum, term)
	}
	return sum
}

// cpExact is the Clopper–Pearson upper bound by bisection on the exact
// binomial tail, to float64 resolution.
func cpExact(k, n int, delta float64) float64 {
	d := new(big.Float).SetPrec(bigPrec).SetFloat64(delta)
	lo, hi := 0.0, 1.0 // tail(lo) > delta >= tail(hi)
	for {
		mid := lo + (hi-lo)/2
		if mid <= lo || mid >= hi {
			return mid
		}
		if binomTailBig(k, n, mid).Cmp(d) > 0 {
			lo = mid
		} else {
			hi = mid
		}
	}
}

func TestClopperPearsonExactTail(t *testing.T) {
	if testing.Short() {
		t.Skip("big.Float references")
	}
	deltas := []float64{0.9, 0.5, 0.05, 1e-3, 5e-6, 1e-9, 1e-12}
	for _, kn := range []struct{ k, n int }{
		{0, 10}, {0, 50_000}, {1, 2}, {1, 10}, {1, 100}, {5, 300}, {3, 50_000}, {10, 1000},
		{40, 4000}, {99, 100}, {200, 400}, {2, 1_000_000}, {1, 10_000_000}, {30, 200_000},
		{1000, 200_000}, {1001, 200_000}, {1500, 3000}, {2000, 100_000}, {5000, 1_000_000}, {3000, 10_000_000},
	} {
		for _, d := range deltas {
			got := ClopperPearsonUpper(kn.k, kn.n, d)
			want := cpExact(kn.k, kn.n, d)
			if rel := math.Abs(got-want) / want; !(rel <= 1e-9) {
				t.Errorf("U(%d, %d; %g) = %.15g, exact %.15g (relative error %.2g)", kn.k, kn.n, d, got, want, rel)
			}
		}
	}
}

// The case that gonum's Beta.Quantile gets wrong (0.0351): the exact
// bound after 3 violations in 50,000 at δ = 5e-6 is 0.000390.
func TestClopperPearsonFarTail(t *testing.T) {
	if got := ClopperPearsonUpper(3, 50_000, 5e-6); math.Abs(got-0.000390) > 0.5e-6 {
		t.Errorf("U(3, 50000; 5e-6) = %.6g, want 0.000390", got)
	}
	// The definition, checked in float64 log space: the tail at the
	// bound is δ.
	for _, d := range []float64{1e-6, 1e-9, 1e-12} {
		u := ClopperPearsonUpper(7, 20_000, d)
		if c := binomCDF(7, 20_000, u); math.Abs(c-d) > 1e-6*d {
			t.Errorf("P(Bin(20000, U) <= 7) = %.10g at U(7, 20000; %g) = %.10g, want δ", c, d, u)
		}
	}
}
