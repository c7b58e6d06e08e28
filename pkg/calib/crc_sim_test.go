package calib

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// population is a known field distribution on the score grid
// {0, 0.01, ..., 1}: a field is violated with probability pViol; benign
// and violated scores are discretised bell curves that overlap, so scores
// tie often and no threshold separates the two.
type population struct {
	pViol       float64
	benign, bad [101]float64 // cumulative distributions over the grid
	badPMF      [101]float64
}

func newPopulation(pViol, benignMean, badMean, width float64) *population {
	p := &population{pViol: pViol}
	var b, v [101]float64
	sb, sv := 0.0, 0.0
	for i := range 101 {
		b[i] = math.Exp(-math.Pow((float64(i)-benignMean)/width, 2))
		v[i] = math.Exp(-math.Pow((float64(i)-badMean)/width, 2))
		sb += b[i]
		sv += v[i]
	}
	cb, cv := 0.0, 0.0
	for i := range 101 {
		cb += b[i] / sb
		cv += v[i] / sv
		p.benign[i], p.bad[i], p.badPMF[i] = cb, cv, v[i]/sv
	}
	p.benign[100], p.bad[100] = 1, 1
	return p
}

func grid(i int) float64 { return float64(i) / 100 }

func (p *population) draw(rng *rand.Rand, role decide.Role) FieldRecord {
	v := rng.Float64() < p.pViol
	cdf := &p.benign
	if v {
		cdf = &p.bad
	}
	i, _ := slices.BinarySearch(cdf[:], rng.Float64())
	return FieldRecord{Role: role, Score: grid(min(i, 100)), Violated: v, Attacked: v}
}

// V is the population violation rate Pr[violated and allowed] at the
// stratum's threshold: what an infinitely large test set would measure.
func (p *population) V(st *Stratum) float64 {
	if st.BlockAll {
		return 0
	}
	m := 0.0
	for i := range 101 {
		if grid(i) <= st.Threshold {
			m += p.badPMF[i]
		}
	}
	return p.pViol * m
}

// TestSimulationExpectedRisk checks Eq. 5's guarantee E[L_test] <= α on
// random calibration/test splits of one exchangeable data set: the mean
// over splits of the test violation rate (fraction of test fields that
// are violated and allowed) must not exceed α beyond Monte Carlo error.
// A deliberately mis-calibrated variant (the threshold of 2α) must be
// caught by the same check, so the check has power.
func TestSimulationExpectedRisk(t *testing.T) {
	splits, size := 500, 4000
	if !testing.Short() {
		splits = 1500
	}
	const nCal, alpha = 300, 0.05
	pop := newPopulation(0.3, 30, 60, 18)
	rng := rand.New(rand.NewPCG(11, 12))
	data := make([]FieldRecord, size)
	for i := range data {
		data[i] = pop.draw(rng, decide.RoleTarget)
	}
	run := func(calAlpha float64) (mean, allowance float64) {
		rates := make([]float64, splits)
		perm := make([]FieldRecord, size)
		for s := range splits {
			copy(perm, data)
			rng.Shuffle(size, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
			cal, test := perm[:nCal], perm[nCal:]
			a, err := Calibrate(cal, Config{Budgets: Budgets{decide.RoleTarget: calAlpha}, Delta: 0.05, Score: score.KindToken})
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			for _, f := range test {
				if f.Violated && a.Allowed(decide.RoleTarget, f.Score) {
					bad++
				}
			}
			rates[s] = float64(bad) / float64(len(test))
		}
		sum, sq := 0.0, 0.0
		for _, r := range rates {
			sum += r
		}
		mean = sum / float64(splits)
		for _, r := range rates {
			sq += (r - mean) * (r - mean)
		}
		sd := math.Sqrt(sq / float64(splits-1))
		// Splits of one data set are not independent, and the mean of
		// the test rate over splits is an estimate: allow 4 standard
		// errors of the mean.
		return mean, 4 * sd / math.Sqrt(float64(splits))
	}
	mean, allow := run(alpha)
	t.Logf("Eq. 5, α=%v, n=%d: mean test violation %.5f over %d splits (allowance %.5f)", alpha, nCal, mean, splits, allow)
	if mean > alpha+allow {
		t.Errorf("mean test violation rate %.5f > α + Monte Carlo allowance = %.5f", mean, alpha+allow)
	}
	if mean < alpha/2 {
		t.Errorf("mean test violation rate %.5f: the calibration is far more conservative than Eq. 5 implies", mean)
	}
	wrong, wallow := run(2 * alpha)
	if wrong <= alpha+wallow {
		t.Errorf("power check: a threshold calibrated at 2α gives mean %.5f, which the check (α + %.5f) did not catch", wrong, wallow)
	}
}

// TestSimulationCertificate checks Theorem 2 on fresh calibration samples
// from a known population with two strata: the event "some certified
// stratum has population violation rate V(g) > α(g)" must happen in at
// most about δ of the repetitions (binomial allowance). Both threshold
// rules are checked; the power check runs the Eq. 6 rule at δ = 0.6
// (six times too large) and must be caught.
func TestSimulationCertificate(t *testing.T) {
	reps := 500
	if !testing.Short() {
		reps = 2000
	}
	const delta, alpha = 0.1, 0.05
	pops := map[decide.Role]*population{
		decide.RoleTarget:  newPopulation(0.25, 30, 62, 15),
		decide.RoleCommand: newPopulation(0.15, 25, 55, 20),
	}
	sizes := map[decide.Role]int{decide.RoleTarget: 600, decide.RoleCommand: 400}
	// Largest count c with P(Bin(reps, δ) >= c) <= 1e-4.
	limit := 0
	for c := reps; c >= 0; c-- {
		if 1-binomCDF(c-1, reps, delta) > 1e-4 {
			limit = c
			break
		}
	}
	rng := rand.New(rand.NewPCG(21, 22))
	run := func(rule Rule, calDelta float64) (failures, certified int) {
		for range reps {
			var cal []FieldRecord
			for _, r := range []decide.Role{decide.RoleTarget, decide.RoleCommand} {
				for range sizes[r] {
					cal = append(cal, pops[r].draw(rng, r))
				}
			}
			a, err := Calibrate(cal, Config{
				Budgets: Budgets{decide.RoleTarget: alpha, decide.RoleCommand: alpha},
				Delta:   calDelta, Score: score.KindToken, Options: Options{Rule: rule}})
			if err != nil {
				t.Fatal(err)
			}
			fail := false
			for _, r := range []decide.Role{decide.RoleTarget, decide.RoleCommand} {
				st := a.Stratum(r.String())
				if st.Certifiable {
					certified++
					fail = fail || pops[r].V(st) > st.Alpha
				}
			}
			if fail {
				failures++
			}
		}
		return failures, certified
	}
	for _, rule := range []Rule{RuleCP, RuleCRC} {
		fails, cert := run(rule, delta)
		t.Logf("rule %s: %d of %d repetitions had a certified stratum over budget (%d certificates; allowance %d)", rule, fails, reps, cert, limit)
		if fails > limit {
			t.Errorf("rule %s: certificate failed in %d of %d repetitions, more than δ=%v allows (%d)", rule, fails, reps, delta, limit)
		}
		if rule == RuleCP && cert < reps {
			t.Errorf("rule cp: only %d certificates in %d repetitions of two strata: the test does not exercise the bound", cert, 2*reps)
		}
	}
	fails, _ := run(RuleCP, 0.6)
	t.Logf("power check, rule cp at δ=0.6: %d failures", fails)
	if fails <= limit {
		t.Errorf("power check: δ=0.6 gave %d failures, within the allowance %d for δ=%v", fails, limit, delta)
	}
}
