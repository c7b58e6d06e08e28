package calib

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// lstep builds a stoppable proposal; h marks it harmful (and executed).
func lstep(score float64, h bool) LedgerStep {
	return LedgerStep{Score: score, Executed: true, Harmful: h, Stoppable: true}
}

func TestLedgerLossHandComputed(t *testing.T) {
	ep := LedgerEpisode{Steps: []LedgerStep{lstep(.3, false), lstep(.9, true), lstep(.5, false), lstep(1, true)}}
	for _, tc := range []struct {
		lambda float64
		stop   int
		loss   float64
		rate   float64
	}{
		{0, 0, 0, 0},            // stops at the first proposal: nothing executed
		{.3, 0, 0, 0},           // s_0 = .3 reaches λ
		{.31, 1, 0, 0},          // the harmful .9 stops before it executes
		{.9, 1, 0, 0},           //
		{.91, 3, 1, 1.0 / 3},    // the harmful .9 executed; stop at the 1.0
		{1, 3, 1, 1.0 / 3},      //
		{LedgerNever, 4, 1, .5}, // never stops: 2 harmful of 4 executed
	} {
		if k := ep.StopIndex(tc.lambda); k != tc.stop {
			t.Errorf("λ=%v: stop %d, want %d", tc.lambda, k, tc.stop)
		}
		if l := ep.Loss(tc.lambda); l != tc.loss {
			t.Errorf("λ=%v: loss %v, want %v", tc.lambda, l, tc.loss)
		}
		if r := ep.Rate(tc.lambda); math.Abs(r-tc.rate) > 1e-12 {
			t.Errorf("λ=%v: rate %v, want %v", tc.lambda, r, tc.rate)
		}
	}
	// A proposal refused by a rule cannot stop the episode; an
	// unexecuted one does not count in the rate.
	ep = LedgerEpisode{Steps: []LedgerStep{{Score: 1, Stoppable: false}, {Score: .4, Executed: false, Stoppable: true}, lstep(.2, true)}}
	if k := ep.StopIndex(.5); k != 3 || ep.Loss(.5) != 1 || ep.Rate(.5) != 1 {
		t.Errorf("λ=.5: stop %d loss %v rate %v, want 3, 1, 1", ep.StopIndex(.5), ep.Loss(.5), ep.Rate(.5))
	}
	if ep.StopIndex(.4) != 1 || ep.Loss(.4) != 0 {
		t.Errorf("λ=.4: stop %d loss %v, want 1, 0", ep.StopIndex(.4), ep.Loss(.4))
	}
}

func TestCalibrateLedgerHandComputed(t *testing.T) {
	harm := func(s float64) LedgerEpisode {
		return LedgerEpisode{Steps: []LedgerStep{lstep(.05, false), lstep(s, true)}}
	}
	benign := LedgerEpisode{Steps: []LedgerStep{lstep(.42, false), lstep(.89, false)}, Utility: true}
	var eps []LedgerEpisode
	for range 37 {
		eps = append(eps, benign)
	}
	// Harm onsets (L = 1 iff λ > onset): .42, .89, 1.
	eps = append(eps, harm(.42), harm(.89), harm(1))
	// n = 40, α = .05: (k+1)/41 <= .05 -> k <= 1.05: one loss allowed.
	// λ = .89: losses where onset < .89: {.42} -> k = 1, feasible.
	// λ = 1: onsets .42 and .89 below: k = 2, infeasible.
	c, err := CalibrateLedger(eps, LedgerConfig{Alpha: .05, Evidence: "g-carb"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Lambda != .89 || c.N != 40 || math.Abs(c.CorrectedRisk-2.0/41) > 1e-12 || c.LossBound != 1 || c.Scorer != "table1" {
		t.Errorf("got %+v, want λ̂ .89, n 40, corrected risk 2/41", c)
	}
	// α = .1: k <= 3.1 -> 3 losses allowed: every harm may pass: never stop.
	c, err = CalibrateLedger(eps, LedgerConfig{Alpha: .1, Evidence: "g-carb"})
	if err != nil || c.Lambda != LedgerNever || math.Abs(c.CorrectedRisk-4.0/41) > 1e-12 {
		t.Errorf("α=.1: %+v %v, want never (λ̂ %v), corrected risk 4/41", c, err, LedgerNever)
	}
	// α = .025: k <= .025: no loss: λ̂ = .42 (the smallest onset).
	c, err = CalibrateLedger(eps, LedgerConfig{Alpha: .025, Evidence: "g-carb"})
	if err != nil || c.Lambda != .42 {
		t.Errorf("α=.025: %+v %v, want λ̂ .42", c, err)
	}
	// Below the floor: 1/41 > .02.
	if _, err := CalibrateLedger(eps, LedgerConfig{Alpha: .02, Evidence: "g-carb"}); !errors.Is(err, ErrLedgerFloor) {
		t.Errorf("α=.02 with n=40: error %v, want ErrLedgerFloor", err)
	}
	// Executed-step rate: the harm episodes have r = 1/2 once the harm
	// executes (two executed proposals). α = .05: Σ r̃ + 1 <= 2.05 -> Σ <= 1.05:
	// λ = .89 -> only onset .42 has r = .5: Σ = .5; λ = 1 -> 1.0, feasible;
	// never -> 1.5, infeasible. λ̂ = 1.
	c, err = CalibrateLedger(eps, LedgerConfig{Alpha: .05, Objective: ObjectiveExecutedStep, Evidence: "current"})
	if err != nil || c.Lambda != 1 || math.Abs(c.CorrectedRisk-2.0/41) > 1e-12 {
		t.Errorf("executed-step: %+v %v, want λ̂ 1, corrected risk 2/41", c, err)
	}
	for _, bad := range []LedgerConfig{{Alpha: 0, Evidence: "x"}, {Alpha: 1, Evidence: "x"}, {Alpha: .1}, {Alpha: .1, Evidence: "x", Objective: "nope"}} {
		if _, err := CalibrateLedger(eps, bad); err == nil {
			t.Errorf("config %+v accepted", bad)
		}
	}
	bad := append(slices.Clone(eps), LedgerEpisode{ID: "ep-x", Steps: []LedgerStep{{Score: 1.5}}})
	if _, err := CalibrateLedger(bad, LedgerConfig{Alpha: .1, Evidence: "x"}); err == nil || !strings.Contains(err.Error(), "ep-x") {
		t.Errorf("score 1.5: error %v, want one naming the episode", err)
	}
}

// randomEpisode draws an episode whose harm is more likely on high
// scores; scores lie on a grid of .05 so that ties occur.
func randomEpisode(r *rand.Rand) LedgerEpisode {
	m := 1 + r.IntN(8)
	ep := LedgerEpisode{Steps: make([]LedgerStep, m), Utility: r.Float64() < .6}
	for t := range ep.Steps {
		s := math.Round(r.Float64()*20) / 20
		exec := r.Float64() < .85
		ep.Steps[t] = LedgerStep{Score: s, Executed: exec, Harmful: exec && r.Float64() < .15*s*s, Stoppable: r.Float64() < .95,
			Prefix: 2 * t, Evidence: r.IntN(2*t + 1)}
	}
	return ep
}

// reference is CalibrateLedger by brute force: every candidate, every
// episode, the envelope as a maximum over the smaller candidates.
func reference(eps []LedgerEpisode, alpha float64, objective string) float64 {
	var grid []float64
	for _, ep := range eps {
		for _, s := range ep.Steps {
			grid = append(grid, s.Score)
		}
	}
	grid = append(grid, LedgerNever)
	slices.Sort(grid)
	grid = slices.Compact(grid)
	best := math.NaN()
	for ci, c := range grid {
		sum := 0.0
		for i := range eps {
			if objective == ObjectiveLedger {
				sum += eps[i].Loss(c)
				continue
			}
			env := 0.0
			for _, c2 := range grid[:ci+1] {
				env = max(env, eps[i].Rate(c2))
			}
			sum += env
		}
		if (sum+1)/float64(len(eps)+1) <= alpha+1e-12 {
			best = c
		}
	}
	return best
}

func TestCalibrateLedgerMatchesBruteForce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 20 + r.IntN(60)
		eps := make([]LedgerEpisode, n)
		for i := range eps {
			eps[i] = randomEpisode(r)
		}
		alpha := []float64{.05, .1, .2, .3}[trial%4]
		for _, obj := range []string{ObjectiveLedger, ObjectiveExecutedStep} {
			want := reference(eps, alpha, obj)
			c, err := CalibrateLedger(eps, LedgerConfig{Alpha: alpha, Objective: obj, Evidence: "g-carb"})
			if math.IsNaN(want) {
				if err == nil {
					t.Fatalf("trial %d %s: got λ̂ %v, brute force finds none", trial, obj, c.Lambda)
				}
				continue
			}
			if err != nil || c.Lambda != want {
				t.Fatalf("trial %d %s (n %d, α %v): got %+v %v, brute force λ̂ %v", trial, obj, n, alpha, c, err, want)
			}
		}
	}
}

// L is nondecreasing in λ for every episode, and so is the envelope sum
// the rate calibration uses (checked through the brute force above); the
// raw rate is not, which is why it needs the envelope.
func TestLedgerLossMonotone(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	lambdas := []float64{0, .05, .1, .2, .3, .42, .5, .6, .7, .8, .89, .9, .95, 1, LedgerNever}
	rateDrops := 0
	for range 2000 {
		ep := randomEpisode(r)
		for i := 1; i < len(lambdas); i++ {
			if ep.Loss(lambdas[i]) < ep.Loss(lambdas[i-1]) {
				t.Fatalf("L decreased from λ=%v to λ=%v: %+v", lambdas[i-1], lambdas[i], ep)
			}
			if ep.StopIndex(lambdas[i]) < ep.StopIndex(lambdas[i-1]) {
				t.Fatalf("stop index decreased with λ: %+v", ep)
			}
			if ep.Rate(lambdas[i]) < ep.Rate(lambdas[i-1]) {
				rateDrops++
			}
		}
	}
	if rateDrops == 0 {
		t.Error("the raw executed-step rate never decreased in λ: the episodes do not exercise the envelope")
	}
}

// The guarantee itself: on synthetic exchangeable episodes, calibrating on
// n and testing on fresh episodes, the mean test loss over many
// calibrations stays within α plus a Monte Carlo allowance (and is not
// trivially far below it).
func TestLedgerCRCGuaranteeSimulation(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	const (
		trials = 400
		n      = 150
		m      = 150
	)
	for _, tc := range []struct {
		obj   string
		alpha float64
	}{{ObjectiveLedger, .1}, {ObjectiveLedger, .2}, {ObjectiveExecutedStep, .05}} {
		r := rand.New(rand.NewPCG(5, uint64(tc.alpha*1000)))
		var sum, sumSq float64
		for range trials {
			cal := make([]LedgerEpisode, n)
			for i := range cal {
				cal[i] = randomEpisode(r)
			}
			c, err := CalibrateLedger(cal, LedgerConfig{Alpha: tc.alpha, Objective: tc.obj, Evidence: "g-carb"})
			if err != nil {
				t.Fatal(err)
			}
			test := make([]LedgerEpisode, m)
			for i := range test {
				test[i] = randomEpisode(r)
			}
			met := EvaluateLedger(test, c.Lambda)
			x := met.Loss
			if tc.obj == ObjectiveExecutedStep {
				x = met.Rate
			}
			sum += x
			sumSq += x * x
		}
		mean := sum / trials
		sd := math.Sqrt(max(0, sumSq/trials-mean*mean))
		allowance := 3 * sd / math.Sqrt(trials)
		t.Logf("%s α=%v: mean test risk %.4f (allowance %.4f)", tc.obj, tc.alpha, mean, allowance)
		if mean > tc.alpha+allowance {
			t.Errorf("%s α=%v: mean test risk %.4f > α + %.4f", tc.obj, tc.alpha, mean, allowance)
		}
		if mean < tc.alpha/3 {
			t.Errorf("%s α=%v: mean test risk %.4f: the simulation does not make the budget bind", tc.obj, tc.alpha, mean)
		}
	}
}

// The same guarantee over random calibration/test splits of one fixed
// pool of exchangeable episodes (the evaluation's protocol): averaged
// over splits, the test loss stays within α plus the allowance.
func TestLedgerCRCGuaranteeOverSplits(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	const alpha, splits = .1, 400
	r := rand.New(rand.NewPCG(9, 10))
	pool := make([]LedgerEpisode, 600)
	for i := range pool {
		pool[i] = randomEpisode(r)
	}
	var xs []float64
	for range splits {
		perm := r.Perm(len(pool))
		cal := make([]LedgerEpisode, 0, 300)
		test := make([]LedgerEpisode, 0, 300)
		for j, k := range perm {
			if j < 300 {
				cal = append(cal, pool[k])
			} else {
				test = append(test, pool[k])
			}
		}
		c, err := CalibrateLedger(cal, LedgerConfig{Alpha: alpha, Evidence: "g-carb"})
		if err != nil {
			t.Fatal(err)
		}
		xs = append(xs, EvaluateLedger(test, c.Lambda).Loss)
	}
	mean, sd := 0.0, 0.0
	for _, x := range xs {
		mean += x / splits
	}
	for _, x := range xs {
		sd += (x - mean) * (x - mean) / splits
	}
	// Splits of one pool are dependent: the allowance uses the spread of
	// the per-split losses, not an independent-sample standard error.
	allowance := 2 * math.Sqrt(sd)
	t.Logf("mean test loss over %d splits %.4f (allowance %.4f)", splits, mean, allowance)
	if mean > alpha+allowance {
		t.Errorf("mean test loss %.4f > α %v + %.4f", mean, alpha, allowance)
	}
	if mean < alpha/3 {
		t.Errorf("mean test loss %.4f: the budget does not bind", mean)
	}
}

func TestEvaluateLedgerHandComputed(t *testing.T) {
	eps := []LedgerEpisode{
		{Steps: []LedgerStep{{Score: .3, Executed: true, Stoppable: true, Prefix: 1, Evidence: 0}, {Score: 1, Executed: true, Harmful: true, Stoppable: true, Prefix: 3, Evidence: 2}}},
		{Steps: []LedgerStep{{Score: .4, Executed: true, Stoppable: true, Prefix: 2, Evidence: 1}}, Utility: true},
		{Utility: true},
	}
	m := EvaluateLedger(eps, .9)
	// Episode 1 stops at its second proposal (loss 0); 2 and 3 run
	// through; U: episodes 2 and 3. CtxRed over 3 scored proposals:
	// (1 + 1/3 + 1/2)/3.
	want := LedgerMetrics{Episodes: 3, Loss: 0, Rate: 0, Intervention: 1.0 / 3, Success: 2.0 / 3, CtxRed: (1 + 1.0/3 + .5) / 3, Scored: 3}
	if math.Abs(m.CtxRed-want.CtxRed) > 1e-12 {
		t.Errorf("CtxRed %v, want %v", m.CtxRed, want.CtxRed)
	}
	m.CtxRed = want.CtxRed
	if m != want {
		t.Errorf("λ=.9: %+v, want %+v", m, want)
	}
	m = EvaluateLedger(eps, LedgerNever)
	if m.Loss != 1.0/3 || m.Intervention != 0 || m.Success != 2.0/3 || math.Abs(m.Rate-1.0/6) > 1e-12 {
		t.Errorf("never: %+v", m)
	}
}

// BenchmarkCalibrateLedger calibrates λ̂ on 10,000 episodes of up to 8
// proposals.
func BenchmarkCalibrateLedger(b *testing.B) {
	r := rand.New(rand.NewPCG(11, 12))
	eps := make([]LedgerEpisode, 10000)
	for i := range eps {
		eps[i] = randomEpisode(r)
	}
	for _, obj := range []string{ObjectiveLedger, ObjectiveExecutedStep} {
		b.Run(obj, func(b *testing.B) {
			for b.Loop() {
				if _, err := CalibrateLedger(eps, LedgerConfig{Alpha: .1, Objective: obj, Evidence: "g-carb"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
