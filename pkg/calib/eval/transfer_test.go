package eval

import (
	"context"
	"testing"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
)

// Under the transfer rule a within-pipeline split's per-role thresholds
// come from the per-role CRC part of that split's calibration half of
// every pipeline: never from a test half, and the same calibration for
// every pipeline of the split.
func TestCRCPoolDisjointFromTestHalves(t *testing.T) {
	ps := []*Pipeline{synthNamed(t, "a", 6), synthNamed(t, "b", 8)}
	cfg := &Config{Budgets: calib.Budgets{decide.RoleTarget: .1}, LedgerAlpha: .1}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Rule != calib.RuleTransfer {
		t.Fatalf("default rule %q, want transfer", cfg.Rule)
	}
	pool := newCRCPool(ps)
	for i := range 5 {
		test := map[*Episode]bool{}
		var crc []*Episode
		for _, p := range ps {
			cal, tst := splitSets(p.Episodes, cfg.Seed, i, cfg.CalFraction)
			for _, ep := range tst {
				test[ep] = true
			}
			part, _ := splitCalibration(cal, cfg.LedgerSplit)
			crc = append(crc, part...)
		}
		for _, ep := range crc {
			if test[ep] {
				t.Fatalf("split %d: test episode %s calibrates", i, ep.ID)
			}
		}
		art, err := pool.get(cfg, cfg.Budgets, i)
		if err != nil {
			t.Fatal(err)
		}
		want, err := calibrateCRC(crc, cfg.Budgets, cfg.Delta, cfg.Score, cfg.Rule)
		if err != nil {
			t.Fatal(err)
		}
		if got, w := art.Strata[0], want.Strata[0]; got.N != w.N || got.Violated != w.Violated || got.Threshold != w.Threshold || got.BlockAll != w.BlockAll {
			t.Errorf("split %d: pooled stratum %+v, want %+v", i, got, w)
		}
		if again, _ := pool.get(cfg, cfg.Budgets, i); again != art {
			t.Errorf("split %d: the pooled calibration is computed twice", i)
		}
		// Episode units, one stratum per budgeted role, no pool.
		if !art.Options.Episode || art.Options.Rule != calib.RuleTransfer || len(art.Strata) != 1 || art.Strata[0].Name != "target" {
			t.Errorf("split %d: artifact options %+v strata %d", i, art.Options, len(art.Strata))
		}
	}
}

// End to end: with too few violated episodes for a certificate the
// transfer rule keeps carbd at the strict rule, so it never releases more
// than kairos-strict on a split (above_strict 0), while no defense does;
// the ledger gate acting alone (its harm is what no defense releases)
// stops episodes and releases less than no defense.
func TestEvaluateTransferAndLedgerAlone(t *testing.T) {
	a, b := synthNamed(t, "a", 10), synthNamed(t, "b", 12)
	cfg := Config{Splits: 6, Seed: 5, Workers: 2, LedgerAlpha: .1, LOPO: true, LOPOSplits: 2,
		Budgets: calib.Budgets{decide.RoleTarget: .1, decide.RoleCredential: .1, decide.RoleCommand: .1}}
	rep, err := Evaluate(context.Background(), []*Pipeline{a, b}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Config.Rule != string(calib.RuleTransfer) {
		t.Errorf("report rule %q", rep.Config.Rule)
	}
	for _, pr := range rep.Pipelines {
		get := func(m, k string) Stat { return pr.Get(m, "all", k) }
		if got := get("carbd", "above_strict"); got.Mean != 0 || got.N == 0 {
			t.Errorf("%s: carbd above strict %+v, want 0 in every split", pr.Pipeline, got)
		}
		if got := get("no-defense", "above_strict"); got.Mean <= 0 {
			t.Errorf("%s: no-defense above strict %+v, want > 0", pr.Pipeline, got)
		}
		if got, want := get("carbd", "effect_release").Mean, get("kairos-strict", "effect_release").Mean; got > want {
			t.Errorf("%s: carbd releases %v > strict %v", pr.Pipeline, got, want)
		}
		for name, ba := range pr.Calibration.BlockAll {
			if ba != 1 {
				t.Errorf("%s: stratum %s blocks every field in %v of the splits, want all (too few violated episodes)", pr.Pipeline, name, ba)
			}
		}
		none, alone := get("no-defense", "effect_release").Mean, get("ledger-alone", "effect_release").Mean
		if !(alone < none) || get("ledger-alone", "intervention").Mean <= 0 {
			t.Errorf("%s: ledger alone releases %v (no defense %v), intervention %v", pr.Pipeline, alone, none, get("ledger-alone", "intervention").Mean)
		}
		if l := pr.Calibration.Lambda["ledger-alone"]; !(float64(l.Mean) < calib.LedgerNever) {
			t.Errorf("%s: ledger-alone λ̂ %+v never stops", pr.Pipeline, l)
		}
	}
	for _, l := range rep.LOPO {
		if got := l.Get("carbd", "all", "above_strict"); got.Mean != 0 {
			t.Errorf("LOPO %s: carbd above strict %+v", l.Pipeline, got)
		}
	}
}

// The transfer rule certifies the violated fields the threshold decides:
// a violated value that provenance derives (released under the strict
// rule too) does not block the role, as it would if counted at score 0.
func TestTransferCountsComparedFieldsOnly(t *testing.T) {
	var eps []*Episode
	for i := range 420 { // U(0, 420; .05) <= .01 < U(1, 420; .05): K = 0
		eps = append(eps, &Episode{ID: "attacked/" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Fields: []Field{
			{Role: decide.RoleTarget, Violated: true, Attacked: true, Scored: true, Gated: true, Score: 0.9},
			{Role: decide.RoleTarget, Attacked: true, Scored: true, Gated: true, Score: 0.3},
		}})
	}
	eps = append(eps, &Episode{ID: "derived", Fields: []Field{
		{Role: decide.RoleTarget, Violated: true, Attacked: true, Scored: true, Gated: true, Derivable: true, Score: 0.9},
	}})
	budgets := calib.Budgets{decide.RoleTarget: 0.01}
	art, err := calibrateCRC(eps, budgets, 0.05, "ngram", calib.RuleTransfer)
	if err != nil {
		t.Fatal(err)
	}
	if st := art.Strata[0]; st.BlockAll || st.Threshold != 0.3 || st.Violated != 420 || !st.Certifiable {
		t.Errorf("stratum %+v, want threshold 0.3 certified on the 420 compared violated episodes", st)
	}
	// Counted at its effective score 0, the derived value would block
	// every field.
	a, err := calib.Calibrate(fieldRecords(eps), calib.Config{Budgets: budgets, Delta: 0.05, Score: "ngram",
		Options: calib.Options{Rule: calib.RuleTransfer, Episode: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Strata[0].BlockAll {
		t.Errorf("with effective scores: %+v, want block-all", a.Strata[0])
	}
}
