package soak

import (
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLinearFit(t *testing.T) {
	// y = 3 + 2x exactly: slope 2, no error.
	x := []float64{1, 2, 3, 4, 5}
	y := []float64{5, 7, 9, 11, 13}
	f, err := LinearFit(x, y)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(f.Slope-2) > 1e-12 || math.Abs(f.Intercept-3) > 1e-12 || f.SlopeSE > 1e-12 || !f.Grows() {
		t.Fatalf("exact line: %+v", f)
	}
	// Residuals +1,-1,+1,-1,... around y = 10: slope ~0 with a standard
	// error a textbook computes: s^2 = SSR/(n-2), se = sqrt(s^2/Sxx).
	x = []float64{1, 2, 3, 4}
	y = []float64{11, 9, 11, 9}
	f, err = LinearFit(x, y)
	if err != nil {
		t.Fatal(err)
	}
	// slope = Sxy/Sxx = (-1.5*1 + -0.5*-1 + 0.5*1 + 1.5*-1)/5 = -0.4
	// residuals: 11-(10.5-0.4) ... SSR = 3.2, s^2 = 1.6, se = sqrt(1.6/5)
	if math.Abs(f.Slope+0.4) > 1e-12 || math.Abs(f.SlopeSE-math.Sqrt(1.6/5)) > 1e-12 || f.Grows() {
		t.Fatalf("noisy flat line: %+v", f)
	}
	if _, err := LinearFit([]float64{1, 1}, []float64{1, 2}); err == nil {
		t.Fatal("constant x: no error")
	}
	if _, err := LinearFit([]float64{1}, []float64{1}); err == nil {
		t.Fatal("one point: no error")
	}
}

func TestSummaryCounts(t *testing.T) {
	out := "SOAK t-end 1\n\ncarbd: sandbox s1 exited with status 0\n  released 112, refused 3, held 0; files: committed 20, aborted 0, conflicts 6\n  REFUSED #1 ...\n"
	want := map[string]float64{"released": 112, "refused": 3, "held": 0, "committed": 20, "aborted": 0, "conflicts": 6}
	if d := cmp.Diff(want, summaryCounts(out)); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	if got := summaryCounts("no summary\n"); len(got) != 0 {
		t.Fatalf("no summary: %v", got)
	}
}

func TestSummarise(t *testing.T) {
	rows := []Row{{"run": 0, "grows": 100, "flat": 9}} // run 0: the baseline, not fitted
	for n := 1; n <= 3; n++ {
		rows = append(rows, Row{"run": float64(n), "grows": float64(2 * n), "flat": 7})
	}
	got := summarise(rows)
	for _, want := range []string{
		"| resource | run 1 | run 3 | growth per run ± s.e. | grows |",
		"| flat | 7 | 7 | 0 ± 0 |  |",
		"| grows | 2 | 6 | 2 ± 0 | **yes** |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if got := summarise(rows[:3]); got != "fewer than three runs: no fit\n" {
		t.Errorf("two runs: %q", got)
	}
}
