package eval

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
)

// synthNamed is synthPipeline under another name, so that two of them
// are two pipelines.
func synthNamed(t *testing.T, name string, n int) *Pipeline {
	p := synthPipeline(t, n)
	p.Name = name
	for _, ep := range p.Episodes {
		ep.Pipeline = name
	}
	return p
}

// The LOPO sets: the left-out pipeline whole for testing, every other
// pipeline's episodes (and none of its own) for calibration, in an order
// that depends on the split only.
func TestLOPOSets(t *testing.T) {
	ps := []*Pipeline{synthNamed(t, "a", 2), synthNamed(t, "b", 3), synthNamed(t, "c", 4)}
	for k, p := range ps {
		cal, test := lopoSets(ps, k, 7, 0)
		if !slices.Equal(test, p.Episodes) {
			t.Errorf("%s: the test set is not the pipeline's episodes", p.Name)
		}
		want := 0
		for j, q := range ps {
			if j != k {
				want += len(q.Episodes)
			}
		}
		if len(cal) != want {
			t.Errorf("%s: %d calibration episodes, want %d", p.Name, len(cal), want)
		}
		for _, ep := range cal {
			if ep.Pipeline == p.Name {
				t.Errorf("%s: its own episode %s calibrates", p.Name, ep.ID)
			}
		}
		again, _ := lopoSets(ps, k, 7, 0)
		other, _ := lopoSets(ps, k, 7, 1)
		if !slices.Equal(cal, again) || slices.Equal(cal, other) {
			t.Errorf("%s: the calibration order is not a function of the split", p.Name)
		}
	}
}

// End to end on two synthetic pipelines: the report carries a LOPO entry
// per pipeline, calibrated on the other one, with the fixed outcomes
// (no defense, the strict policy) equal to their exact values, and the
// text prints them beside the within-pipeline splits.
func TestEvaluateLOPO(t *testing.T) {
	a, b := synthNamed(t, "a", 10), synthNamed(t, "b", 12)
	cfg := Config{Splits: 4, LOPO: true, LOPOSplits: 3, Seed: 2, Workers: 2, LedgerAlpha: .1,
		Budgets: calib.Budgets{decide.RoleTarget: .1, decide.RoleCredential: .1, decide.RoleCommand: .1}}
	rep, err := Evaluate(context.Background(), []*Pipeline{a, b}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.LOPO) != 2 {
		t.Fatalf("%d LOPO entries, want 2", len(rep.LOPO))
	}
	for i, want := range []struct {
		name, cal  string
		test, nCal int
	}{{"a", "b", 40, 48}, {"b", "a", 48, 40}} {
		l := &rep.LOPO[i]
		if l.Pipeline != want.name || !slices.Equal(l.Calibrated, []string{want.cal}) || l.TestEpisodes != want.test ||
			l.CalEpisodes != want.nCal || l.CRCCalEpisodes+l.LedgerCalEpisodes != want.nCal || l.Splits != 3 {
			t.Errorf("LOPO %d: %s on %v, %d test, %d cal (%d+%d), %d splits", i, l.Pipeline, l.Calibrated, l.TestEpisodes,
				l.CalEpisodes, l.CRCCalEpisodes, l.LedgerCalEpisodes, l.Splits)
		}
		// Half the attacked runs pay the attacker undefended (kind 2 of
		// kinds 2 and 3); the strict policy releases none of them.
		if got := l.Get("no-defense", "all", "effect_release"); got.Mean != .5 || got.P05 != .5 || got.P95 != .5 {
			t.Errorf("%s: no-defense effects released %+v, want 0.5", l.Pipeline, got)
		}
		if got := l.Get("kairos-strict", "all", "effect_release").Mean; got != 0 {
			t.Errorf("%s: kairos-strict effects released %v, want 0", l.Pipeline, got)
		}
		if got := l.Get("carbd", "all", "effect_release").Mean; got > l.Get("no-defense", "all", "effect_release").Mean {
			t.Errorf("%s: carbd releases more than no defense: %v", l.Pipeline, got)
		}
		if r, ok := l.Role("carbd", "all", decide.RoleTarget); !ok || r.Compliance == nil {
			t.Errorf("%s: no target compliance for carbd", l.Pipeline)
		}
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := strings.Join(strings.Fields(text.String()), " ")
	for _, want := range []string{"== leave-one-pipeline-out", "a carbd within", "a carbd lopo", "b kairos-strict lopo"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.LOPO) != 2 || back.LOPO[1].Pipeline != "b" {
		t.Errorf("JSON round trip: %v, %d LOPO entries", err, len(back.LOPO))
	}
	// One pipeline has nothing to leave out.
	if _, err := Evaluate(context.Background(), []*Pipeline{a}, cfg); err == nil || !strings.Contains(err.Error(), "at least 2 pipelines") {
		t.Errorf("LOPO with one pipeline: %v", err)
	}
}
