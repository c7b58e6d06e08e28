package calib

import (
	"fmt"
	"math"
	"testing"
)

// binomCDF is P(Bin(n, p) <= k), summed in log space from first
// principles (no Beta function involved).
func binomCDF(k, n int, p float64) float64 {
	if p <= 0 {
		return 1
	}
	if p >= 1 {
		if k >= n {
			return 1
		}
		return 0
	}
	lgN, _ := math.Lgamma(float64(n + 1))
	s := 0.0
	for i := 0; i <= k; i++ {
		a, _ := math.Lgamma(float64(i + 1))
		b, _ := math.Lgamma(float64(n - i + 1))
		s += math.Exp(lgN - a - b + float64(i)*math.Log(p) + float64(n-i)*math.Log1p(-p))
	}
	return s
}

// cpByBisection is the Clopper–Pearson upper bound as its definition
// states it: the p at which P(Bin(n, p) <= k) falls to delta.
func cpByBisection(k, n int, delta float64) float64 {
	lo, hi := 0.0, 1.0 // cdf(lo) > delta >= cdf(hi)
	for range 200 {
		mid := (lo + hi) / 2
		if binomCDF(k, n, mid) > delta {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

func TestClopperPearsonZeroSuccesses(t *testing.T) {
	for _, n := range []int{1, 2, 10, 100, 299, 300, 10_000, 1_000_000} {
		for _, d := range []float64{0.01, 0.05, 0.05 / 3, 0.1, 0.5} {
			got := ClopperPearsonUpper(0, n, d)
			want := 1 - math.Pow(d, 1/float64(n))
			if math.Abs(got-want) > 1e-12*math.Max(want, 1e-3) {
				t.Errorf("U(0, %d; %v) = %.17g, want 1-δ^(1/n) = %.17g", n, d, got, want)
			}
			if c := math.Pow(1-got, float64(n)); math.Abs(c-d) > 1e-9 {
				t.Errorf("U(0, %d; %v): (1-U)^n = %v, want δ", n, d, c)
			}
		}
	}
	// The numbers docs/calibration.md quotes: 300 clean fields certify 1%
	// at δ = 0.05, 298 do not, 299 just do.
	for _, tc := range []struct {
		n    int
		want float64
	}{{298, 0.010002}, {299, 0.0099691}, {300, 0.0099361}} {
		if got := ClopperPearsonUpper(0, tc.n, 0.05); math.Abs(got-tc.want) > 5e-7 {
			t.Errorf("U(0, %d; 0.05) = %.7f, want %.7f", tc.n, got, tc.want)
		}
	}
}

func TestClopperPearsonAgainstBinomialBisection(t *testing.T) {
	for _, tc := range []struct {
		k, n  int
		delta float64
	}{
		{1, 10, 0.05}, {2, 20, 0.05}, {5, 100, 0.05}, {3, 50, 0.1}, {10, 1000, 0.01},
		{1, 2, 0.05}, {49, 50, 0.05}, {99, 100, 0.025}, {7, 300, 0.05 / 3}, {40, 4000, 0.05},
		{150, 10_000, 0.01},
	} {
		got := ClopperPearsonUpper(tc.k, tc.n, tc.delta)
		want := cpByBisection(tc.k, tc.n, tc.delta)
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("U(%d, %d; %v) = %.12f, bisection on the binomial CDF gives %.12f", tc.k, tc.n, tc.delta, got, want)
		}
	}
}

func TestClopperPearsonTabulated(t *testing.T) {
	// Published one-sided 95% upper limits (equal to the upper end of the
	// two-sided 90% exact interval).
	for _, tc := range []struct {
		k, n int
		want float64
	}{
		{0, 10, 0.2589}, // 1 - 0.05^(1/10)
		{1, 10, 0.3942},
		{0, 20, 0.1391},
		{1, 20, 0.2161},
	} {
		if got := ClopperPearsonUpper(tc.k, tc.n, 0.05); math.Abs(got-tc.want) > 1e-4 {
			t.Errorf("U(%d, %d; 0.05) = %.5f, tabulated %.4f", tc.k, tc.n, got, tc.want)
		}
	}
}

func TestClopperPearsonShape(t *testing.T) {
	if ClopperPearsonUpper(5, 5, 0.05) != 1 || ClopperPearsonUpper(0, 0, 0.05) != 1 {
		t.Error("U(n, n) or U(0, 0) is not 1")
	}
	for n := 1; n <= 60; n++ {
		prev := 0.0
		for k := 0; k <= n; k++ {
			u := ClopperPearsonUpper(k, n, 0.05)
			if u <= prev || u > 1 || u < float64(k)/float64(n) {
				t.Fatalf("U(%d, %d) = %v: not increasing in k, or below k/n", k, n, u)
			}
			prev = u
			if k < n && ClopperPearsonUpper(k, n+1, 0.05) >= u {
				t.Fatalf("U(%d, %d) not decreasing in n", k, n)
			}
			if k < n && ClopperPearsonUpper(k, n, 0.01) <= u {
				t.Fatalf("U(%d, %d) not decreasing in delta", k, n)
			}
		}
	}
	for _, d := range []float64{0, 1, -0.1, math.NaN()} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("ClopperPearsonUpper with delta %v did not panic", d)
				}
			}()
			ClopperPearsonUpper(1, 10, d)
		}()
	}
}

func TestMaxAllowedViolations(t *testing.T) {
	for _, tc := range []struct {
		n     int
		alpha float64
		want  int
	}{
		{9, 0.2, 1},    // (k+1)/10 <= 0.2
		{99, 0.29, 28}, // 0.29*100 is 28.999999999999996 in floating point
		{99, 0.07, 6},
		{99, 0.01, 0}, // exactly at the floor
		{98, 0.01, -1},
		{0, 0.5, -1},
		{1, 0.5, 0},
		{10, 0, -1},
		{1_000_000, 0.01, 9999},
	} {
		if got := MaxAllowedViolations(RuleCRC, tc.n, tc.alpha, 0); got != tc.want {
			t.Errorf("MaxAllowedViolations(crc, %d, %v) = %d, want %d", tc.n, tc.alpha, got, tc.want)
		}
	}
	// RuleCP against a linear scan of the definition.
	for _, n := range []int{0, 1, 5, 50, 298, 299, 1000, 5000} {
		for _, al := range []float64{0.001, 0.01, 0.05, 0.2} {
			for _, d := range []float64{0.05, 0.0125} {
				want := -1
				for k := 0; k < n; k++ {
					if ClopperPearsonUpper(k, n, d) <= al {
						want = k
					}
				}
				if got := MaxAllowedViolations(RuleCP, n, al, d); got != want {
					t.Errorf("MaxAllowedViolations(cp, %d, %v, %v) = %d, want %d", n, al, d, got, want)
				}
			}
		}
	}
}

func ExampleClopperPearsonUpper() {
	// No violation among 300 fields: at 95% confidence the rate is below
	// 1 - 0.05^(1/300), just under 1%.
	fmt.Printf("%.5f\n", ClopperPearsonUpper(0, 300, 0.05))
	// 3 violations among 1000 fields.
	fmt.Printf("%.5f\n", ClopperPearsonUpper(3, 1000, 0.05))
	// Output:
	// 0.00994
	// 0.00774
}

func ExampleMaxAllowedViolations() {
	// Eq. 5 with n = 299 and α = 0.01: (k+1)/300 <= 0.01 allows k <= 2.
	fmt.Println(MaxAllowedViolations(RuleCRC, 299, 0.01, 0))
	// 98 fields are below the 1% floor 1/(n+1).
	fmt.Println(MaxAllowedViolations(RuleCRC, 98, 0.01, 0))
	// Output:
	// 2
	// -1
}
