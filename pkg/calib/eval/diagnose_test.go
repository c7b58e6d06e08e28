package eval

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
)

// Every withheld effect of a benign run is listed with the field, its
// value and where the value came from: in the synthetic pipeline, the
// kind-1 runs pay the IBAN of a bill, which only the bill (an untrusted
// read) holds; the kind-0 runs pay the IBAN the task names and lose
// nothing.
func TestLossDetails(t *testing.T) {
	p := synthPipeline(t, 6)
	rep, err := Evaluate(context.Background(), []*Pipeline{p}, Config{Splits: 2, Seed: 3, Budgets: calib.Budgets{decide.RoleTarget: .1, decide.RoleCredential: .1, decide.RoleCommand: .1}, LedgerAlpha: .2})
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Pipelines[0].Diagnosis
	steps := 0
	for _, c := range d.Losses {
		steps += c.Steps
	}
	if len(d.Details) != steps || steps == 0 {
		t.Fatalf("%d details for %d lost steps", len(d.Details), steps)
	}
	runs := map[string]bool{}
	for _, x := range d.Details {
		runs[x.Episode] = true
		if !strings.HasPrefix(x.Episode, "synthetic-1/") {
			t.Errorf("loss in %s: only the kind-1 runs (the bill's IBAN) lose an effect", x.Episode)
		}
		if x.Tool != "send_money" || x.Reason.Field != "recipient" || !strings.HasPrefix(x.Reason.Value, "UK") || !strings.HasPrefix(x.Reason.Origin, "read_file(") {
			t.Errorf("detail %+v: want send_money's recipient, a UK IBAN from read_file", x)
		}
	}
	if len(runs) != 6 {
		t.Errorf("%d runs with a loss, want the 6 kind-1 runs", len(runs))
	}
	var buf bytes.Buffer
	if err := rep.WriteLosses(&buf); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 1+len(d.Details) {
		t.Fatalf("%d lines for %d details:\n%s", len(lines), len(d.Details), buf.String())
	}
	for _, l := range lines {
		if n := strings.Count(l, "\t"); n != 13 {
			t.Errorf("%d tabs in %q, want 13", n, l)
		}
	}
}
