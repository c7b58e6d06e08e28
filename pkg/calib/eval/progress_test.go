package eval

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// clock is a fake clock the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestPlannedSplits(t *testing.T) {
	if got := PlannedSplits(Config{Splits: 10}, 3); got != 30 {
		t.Errorf("no frontier: %d, want 30", got)
	}
	// Two sweeps of six budgets at min(200, 50) splits each, plus 200.
	if got := PlannedSplits(Config{Frontier: DefaultFrontier}, 2); got != 2*(200+2*6*50) {
		t.Errorf("with the frontier: %d, want %d", got, 2*(200+2*6*50))
	}
	if got := PlannedSplits(Config{Splits: 10, LOPO: true}, 3); got != 3*(10+DefaultLOPOSplits) {
		t.Errorf("with leave-one-pipeline-out: %d, want %d", got, 3*(10+DefaultLOPOSplits))
	}
}

// The overall count runs across stages and pipelines; a stage that stops
// early (a budget under the ledger floor) counts as done when the next
// begins; the ETA extrapolates the time so far; lines are throttled.
func TestMeter(t *testing.T) {
	c := &clock{t: time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)}
	var buf bytes.Buffer
	m := NewMeter(&buf, 40, MeterOptions{Every: time.Second, Now: c.now})
	step := func(d time.Duration, p, stage string, done, total int) {
		c.t = c.t.Add(d)
		m.Update(p, stage, done, total)
	}
	step(time.Second, "a", "splits", 1, 10)            // first report: written
	step(100*time.Millisecond, "a", "splits", 2, 10)   // throttled
	step(900*time.Millisecond, "a", "splits", 5, 10)   // 5/40 after 2 s: ETA 14 s
	step(time.Second, "a", "frontier", 1, 10)          // the splits stage is done: 11/40
	step(time.Second, "b", "splits", 3, 10)            // the frontier stopped at 1/10: 23/40
	step(100*time.Millisecond, "b", "splits", 2, 10)   // out of order: throttled, no step back
	step(100*time.Millisecond, "b", "frontier", 9, 10) // throttled
	step(time.Second, "b", "frontier", 10, 10)         // the last: written, no ETA
	m.Finish()
	want := []string{
		"eval: 1/40 splits, 2 %, ETA 39s (a: splits)",
		"eval: 5/40 splits, 12 %, ETA 14s (a: splits)",
		"eval: 11/40 splits, 27 %, ETA 8s (a: frontier)",
		"eval: 23/40 splits, 57 %, ETA 3s (b: splits)",
		"eval: 40/40 splits, 100 % (b: frontier)",
	}
	if diff := cmp.Diff(want, strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")); diff != "" {
		t.Errorf("lines (-want +got):\n%s", diff)
	}
}

// On a terminal the line is rewritten in place and ended once.
func TestMeterRewrite(t *testing.T) {
	c := &clock{t: time.Unix(0, 0)}
	var buf bytes.Buffer
	m := NewMeter(&buf, 2, MeterOptions{Now: c.now, Rewrite: true})
	c.t = c.t.Add(time.Second)
	m.Update("p", "splits", 1, 2)
	c.t = c.t.Add(time.Second)
	m.Update("p", "splits", 2, 2)
	m.Finish()
	want := "\reval: 1/2 splits, 50 %, ETA 1s (p: splits)\033[K\reval: 2/2 splits, 100 % (p: splits)\033[K\n"
	if got := buf.String(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
