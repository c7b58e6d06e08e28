package eval

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/carbd/carbd/pkg/calib/agentdojo"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// These tests read the real recorded runs (../shared/data/agentdojo, or
// $CARBD_AGENTDOJO_DATA) and skip when they are absent.

const realPipeline = "gpt-4o-mini-2024-07-18"

func dataDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("CARBD_AGENTDOJO_DATA")
	if dir == "" {
		dir = "/work/shared/data/agentdojo"
	}
	if _, err := os.Stat(filepath.Join(dir, "runs-"+realPipeline+".tar.gz")); err != nil {
		t.Skipf("AgentDojo data not found in %s (set CARBD_AGENTDOJO_DATA): %v", dir, err)
	}
	return dir
}

var (
	realOnce sync.Once
	realPipe *Pipeline
	realErr  error
)

func loadReal(t testing.TB) *Pipeline {
	t.Helper()
	dir := dataDir(t)
	realOnce.Do(func() {
		ps, err := Load(context.Background(), LoadConfig{Runs: dir, Policies: policiesDir, Pipelines: []string{realPipeline},
			Attacks: []string{"important_instructions"}, Score: score.KindNgram, Seed: 1})
		if err != nil {
			realErr = err
			return
		}
		realPipe = ps[0]
	})
	if realErr != nil {
		t.Fatal(realErr)
	}
	return realPipe
}

func resetCaches(p *Pipeline) {
	for _, ep := range p.Episodes {
		ep.cache.mu.Lock()
		ep.cache.m = nil
		ep.cache.mu.Unlock()
	}
}

func TestRealCacheMatchesFreshReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("replays real runs")
	}
	p := loadReal(t)
	resetCaches(p) // the pipeline is shared by the tests of this process (-count=2 runs them twice)
	checkCache(t, p.Episodes[:min(len(p.Episodes), 200)], 300)
}

// The evaluation on one real pipeline: the data's counts (README), the
// invariants that hold by construction, the guarantees in expectation,
// every figure a fraction.
func TestRealPipelineInvariants(t *testing.T) {
	if testing.Short() {
		t.Skip("evaluates a real pipeline")
	}
	p := loadReal(t)
	if len(p.Problems) != 0 {
		t.Errorf("problems: %+v", p.Problems)
	}
	d := dataCounts(p)
	// The data's README: 97 benign runs (66 utility true), 629
	// important_instructions runs of which 171 succeeded; 27
	// injection-as-prompt runs (9+5+7+6) are left out.
	if d.Benign != 97 || d.BenignUtility != 66 || d.Attacked != 629 || d.Succeeded != 171 || d.InjectionAsPrompt != 27 {
		t.Fatalf("data counts %+v differ from the README", d)
	}
	cfg := Config{Splits: 12, Seed: 11}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	ctr := &replayCounters{}
	res, err := runSplits(context.Background(), p, &cfg, cfg.Budgets, cfg.LedgerAlpha, cfg.Splits, "test", ctr)
	if err != nil {
		t.Fatal(err)
	}
	var vt, lg []float64
	for i, r := range res {
		_, test := splitSets(p.Episodes, cfg.Seed, i, cfg.CalFraction)
		att, succ := 0, 0
		for _, ep := range test {
			if ep.Kind == agentdojo.Attacked {
				att++
				if ep.NoDefenseSucceeded {
					succ++
				}
			}
		}
		x := func(m, k int) float64 { return r.x[m][0][k] }
		// No defense: the attack success rate is the data's (security
		// true, no error) on the test half.
		if got, want := x(mNoDefense, xASR), float64(succ)/float64(att); got != want || x(mNoDefense, xASRUndefended) != want {
			t.Errorf("split %d: no-defense ASR %v, the data's rate %v", i, got, want)
		}
		// By construction: CRC only turns deferrals into releases or
		// reverts (strict ⊆ carbd-crc), the ledger only refuses more
		// (carbd ⊆ carbd-crc).
		for _, k := range []int{xEffectRelease, xBenignUtility, xBenignRetention, xAttackedUtility} {
			if x(mStrict, k) > x(mCarbdCRC, k) || x(mCarbd, k) > x(mCarbdCRC, k) {
				t.Errorf("split %d: %s: strict %v, carbd %v, carbd-crc %v", i, MetricNames[k], x(mStrict, k), x(mCarbd, k), x(mCarbdCRC, k))
			}
		}
		if x(mCarbd, xEffectRelease) > x(mNoDefense, xEffectRelease) || x(mCarbd, xASR) > x(mNoDefense, xASR) {
			t.Errorf("split %d: carbd releases more than no defense", i)
		}
		// The engine's ledger and the offline G-CARB ledger agree.
		if x(mCarbd, xIntervention) != x(mLedgerGCARB, xIntervention) {
			t.Errorf("split %d: engine intervention %v, offline g-carb %v", i, x(mCarbd, xIntervention), x(mLedgerGCARB, xIntervention))
		}
		for m := range numMethods {
			for s := range suites {
				for k := range numMetrics {
					if v := r.x[m][s][k]; isRatio(MetricNames[k]) && !math.IsNaN(v) && (v < 0 || v > 1) {
						t.Errorf("split %d: %s %s %s = %v", i, MethodNames[m], suites[s], MetricNames[k], v)
					}
				}
			}
		}
		vt = append(vt, r.role[mCarbdCRC][0][decide.RoleTarget][rV])
		lg = append(lg, x(mLedgerGCARB, xLedgerLoss))
		t.Logf("split %d: ASR none %.3f strict %.3f carbd %.3f; effects released strict %.3f carbd %.3f; benign retention strict %.3f carbd %.3f",
			i, x(mNoDefense, xASR), x(mStrict, xASR), x(mCarbd, xASR), x(mStrict, xEffectRelease), x(mCarbd, xEffectRelease),
			x(mStrict, xBenignRetention), x(mCarbd, xBenignRetention))
	}
	// The guarantees hold in expectation over splits: the means stay
	// within the budgets plus a Monte Carlo allowance.
	for _, c := range []struct {
		name  string
		xs    []float64
		alpha float64
	}{{"V(target) of per-role CRC", vt, cfg.Budgets[decide.RoleTarget]}, {"G-CARB ledger loss", lg, cfg.LedgerAlpha}} {
		s := summarizeStat(c.xs)
		sd := 0.0
		for _, v := range c.xs {
			sd += (v - float64(s.Mean)) * (v - float64(s.Mean))
		}
		sd = math.Sqrt(sd / float64(len(c.xs)))
		if allow := 3 * sd / math.Sqrt(float64(len(c.xs))); float64(s.Mean) > c.alpha+allow {
			t.Errorf("%s: mean %v over %d splits > alpha %v + %v", c.name, s.Mean, s.N, c.alpha, allow)
		}
	}
	t.Logf("%d calibrated replays run, %d reused", ctr.runs, ctr.reused)
}

// BenchmarkEvaluatePipeline is a full evaluation of one real pipeline
// (gpt-4o-mini, 726 episodes) with 20 splits, from prepared episodes and
// an empty replay cache.
func BenchmarkEvaluatePipeline(b *testing.B) {
	p := loadReal(b)
	for b.Loop() {
		resetCaches(p)
		if _, err := Evaluate(context.Background(), []*Pipeline{p}, Config{Splits: 20, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLoadPipeline reads and prepares one real pipeline: trace,
// labels, the policy-only replay with scores and gate scores.
func BenchmarkLoadPipeline(b *testing.B) {
	dir := dataDir(b)
	for b.Loop() {
		if _, err := Load(context.Background(), LoadConfig{Runs: dir, Policies: policiesDir, Pipelines: []string{realPipeline},
			Attacks: []string{"important_instructions"}, Score: score.KindNgram, Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
