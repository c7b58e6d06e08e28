package calib

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

func transferCfg(b string, delta float64) Config {
	c := cfg(b, delta)
	c.Options.Rule = RuleTransfer
	c.Options.AllowMissing = true
	return c
}

// nFields repeats a recs token n times.
func nFields(n int, tok string) string {
	return strings.Repeat(tok+" ", n)
}

// TestTransferHandComputed: the rule certifies the fraction of violated
// units allowed, on the role's own violated units.
func TestTransferHandComputed(t *testing.T) {
	// 400 violated target fields: 398 at 0.9, two at 0.3; benign fields
	// at 0.1, 0.2, 0.5 and 0.95. U(0, 400; 0.05) = 0.00746 <= 0.01 and
	// U(1, 400; 0.05) = 0.0118 > 0.01: K = 0, so the threshold stays
	// under the lowest violated score 0.3: the largest calibration score
	// below it is 0.2.
	f := recs(tgt, nFields(398, "0.9:v")+"0.3:v 0.3:v 0.1 0.2 0.5 0.95")
	if k := MaxAllowedViolations(RuleTransfer, 400, 0.01, 0.05); k != 0 {
		t.Fatalf("K = %d, want 0", k)
	}
	a := mustCalibrate(t, f, transferCfg("target=0.01", 0.05))
	st := a.Strata[0]
	if st.Name != "target" || st.BlockAll || st.Threshold != 0.2 || st.K != 0 || st.Violated != 400 || !st.Certifiable {
		t.Fatalf("stratum %+v", st)
	}
	if want := ClopperPearsonUpper(0, 400, 0.05); math.Abs(st.CPUpper-want) > 1e-15 {
		t.Errorf("cp_upper %v, want %v", st.CPUpper, want)
	}
	// Eq. 5 on the same data lets ⌊0.01·405⌋−1 = 3 violated fields
	// through: the two at 0.3 and beyond; its threshold is 0.5.
	c := cfg("target=0.01", 0.05)
	if a := mustCalibrate(t, f, c); a.Strata[0].Threshold != 0.5 {
		t.Errorf("Eq. 5 threshold %v, want 0.5", a.Strata[0].Threshold)
	}
}

// TestTransferTooFewViolationsIsStrict: a role whose violated units
// cannot certify even K = 0 blocks every field, however many benign
// fields it has and however loose Eq. 5 would be; and it is not pooled.
func TestTransferTooFewViolationsIsStrict(t *testing.T) {
	// A rarely fooled model: 5000 benign target fields and 20 violated
	// ones. Eq. 5 allows ⌊0.01·5021⌋−1 = 49 violated: every one, τ̂ = 1.
	f := recs(tgt, nFields(5000, "0.4")+nFields(20, "0.8:v"))
	f = append(f, recs(cred, "0.1 0.2 0.9:v")...)
	if a := mustCalibrate(t, f, cfg("target=0.01,credential=0.01", 0.05)); a.Strata[0].Threshold != 1 {
		t.Fatalf("Eq. 5 threshold %v, want 1 (every violated field allowed)", a.Strata[0].Threshold)
	}
	a := mustCalibrate(t, f, transferCfg("target=0.01,credential=0.01", 0.05))
	if len(a.Strata) != 2 {
		t.Fatalf("%d strata, want one per role (no pool)", len(a.Strata))
	}
	for _, st := range a.Strata {
		if !st.BlockAll || st.Certifiable || st.Pooled != nil || st.Name == PooledStratum {
			t.Errorf("stratum %s: %+v, want block-all and its own", st.Name, st)
		}
		if a.RoleStratum[st.Roles[0]] != st.Name {
			t.Errorf("role %s mapped to %q", st.Roles[0], a.RoleStratum[st.Roles[0]])
		}
	}
	cal := a.Engine()
	if !math.IsInf(cal.Threshold[tgt], -1) || !math.IsInf(cal.Threshold[cred], -1) {
		t.Errorf("engine thresholds %v, want -Inf (strict)", cal.Threshold)
	}
	// δ_g is split over the budgeted roles.
	if a.Strata[0].Delta != 0.025 {
		t.Errorf("delta_g %v, want 0.025", a.Strata[0].Delta)
	}
}

// TestTransferPrevalenceInvariant: adding benign fields (a model fooled
// less often) never loosens the threshold's effect on violated units:
// the violated units allowed are the same, whatever the prevalence.
func TestTransferPrevalenceInvariant(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for rep := range 100 {
		viol := randomFields(rng, 2000, []decide.Role{tgt}, 1)
		base := mustCalibrate(t, viol, transferCfg("target=0.02", 0.05)).Strata[0]
		more := slices.Clone(viol)
		for range rng.IntN(20000) {
			more = append(more, FieldRecord{Role: tgt, Score: math.Round(rng.Float64()*100) / 100})
		}
		st := mustCalibrate(t, more, transferCfg("target=0.02", 0.05)).Strata[0]
		if st.BlockAll != base.BlockAll || st.K != base.K || lossCount(viol, st.Threshold) != lossCount(viol, base.Threshold) {
			t.Fatalf("rep %d: with benign fields %+v, without %+v", rep, st, base)
		}
	}
}

// TestTransferOptimality: on random tied data, τ̂ keeps the bound within
// α and no larger calibration score does (field and episode units).
func TestTransferOptimality(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for rep := range 300 {
		episode := rep%2 == 1
		f := randomFields(rng, 200+rng.IntN(3000), []decide.Role{tgt}, 0.1+0.8*rng.Float64())
		alpha := []float64{0.01, 0.02, 0.05, 0.1}[rng.IntN(4)]
		c := transferCfg("target=0.5", 0.1)
		c.Budgets[tgt] = alpha
		c.Options.Episode = episode
		st := mustCalibrate(t, f, c).Strata[0]
		m := len(collect(f, setOf(tgt), episode).viol)
		ok := func(tau float64) bool {
			return ClopperPearsonUpper(episodeLoss(f, tau, episode), m, st.Delta) <= alpha
		}
		if st.BlockAll {
			if ClopperPearsonUpper(0, m, st.Delta) <= alpha && ok(0) {
				t.Fatalf("rep %d: blocked, but τ = 0 is certifiable (m = %d)", rep, m)
			}
			continue
		}
		if !ok(st.Threshold) || !st.Certifiable {
			t.Fatalf("rep %d: τ̂ = %v not certified: %+v", rep, st.Threshold, st)
		}
		// The loss count is nondecreasing in τ: checking the next
		// calibration score above τ̂ checks every larger one.
		next := math.Inf(1)
		for _, x := range f {
			if x.Score > st.Threshold {
				next = min(next, x.Score)
			}
		}
		if !math.IsInf(next, 1) && ok(next) {
			t.Fatalf("rep %d: score %v > τ̂ = %v is also certified", rep, next, st.Threshold)
		}
	}
}

// TestTransferSimulationShift: Theorem 2's argument for the attacker-
// release rate under a prevalence shift. Calibrated on a population
// where 5 % of target fields are violated, the thresholds are tested on
// one where every field is violated (a model fooled every time): the
// population rate V = Pr[violated and allowed] exceeds α in at most
// about δ of the calibrations. Eq. 5 calibrated on the same data fails
// that test almost always (it spends its budget on the rare violations),
// so the check has power.
func TestTransferSimulationShift(t *testing.T) {
	reps := 400
	if testing.Short() {
		reps = 150
	}
	const alpha, delta = 0.05, 0.1
	cal := newPopulation(0.05, 30, 70, 15)
	shifted := *cal
	shifted.pViol = 1
	rng := rand.New(rand.NewPCG(5, 6))
	overT, overE := 0, 0
	for range reps {
		f := make([]FieldRecord, 8000)
		for i := range f {
			f[i] = cal.draw(rng, tgt)
		}
		c := transferCfg("target=0.05", delta)
		st := mustCalibrate(t, f, c).Strata[0]
		if shifted.V(&st) > alpha {
			overT++
		}
		c.Options.Rule = RuleCRC
		st = mustCalibrate(t, f, c).Strata[0]
		if shifted.V(&st) > alpha {
			overE++
		}
	}
	// Binomial(reps, δ) allowance: mean + 4 sd.
	allow := float64(reps)*delta + 4*math.Sqrt(float64(reps)*delta*(1-delta))
	if float64(overT) > allow {
		t.Errorf("transfer rule over budget after the shift in %d of %d calibrations (allowance %.0f)", overT, reps, allow)
	}
	if overE < reps/2 {
		t.Errorf("Eq. 5 over budget after the shift in only %d of %d calibrations: the check has no power", overE, reps)
	}
	t.Logf("over budget after a prevalence shift 5%% -> 100%%: transfer %d, Eq. 5 %d of %d", overT, overE, reps)
}

// The transfer rule on a role with 400 violated fields: a 5 % bound on the
// fraction of them allowed, at 1−δ, lets through at most K of them
// (U(K, 400; 0.05) <= 0.05); the threshold stays below the (K+1)-th
// smallest violated score, and which violated fields it allows does not
// depend on the benign ones.
func ExampleCalibrate_transfer() {
	budgets, _ := ParseBudgets("target=0.05")
	var fields []FieldRecord
	for i := range 400 { // violated scores 0.600, 0.601, ..., 0.999
		fields = append(fields, FieldRecord{Role: decide.RoleTarget, Score: 0.6 + float64(i)/1000, Violated: true, Attacked: true})
	}
	for i := range 1000 { // benign scores 0.000 .. 0.999
		fields = append(fields, FieldRecord{Role: decide.RoleTarget, Score: float64(i) / 1000})
	}
	a, err := Calibrate(fields, Config{Budgets: budgets, Delta: 0.05, Score: score.KindNgram,
		Options: Options{Rule: RuleTransfer}})
	if err != nil {
		panic(err)
	}
	st := a.Strata[0]
	fmt.Printf("violated=%d k=%d threshold=%.3f bound=%.4f certifiable=%v\n", st.Violated, st.K, st.Threshold, st.CPUpper, st.Certifiable)
	// Output:
	// violated=400 k=12 threshold=0.611 bound=0.0482 certifiable=true
}
