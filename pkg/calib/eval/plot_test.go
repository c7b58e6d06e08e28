package eval

import (
	"bytes"
	"image/color"
	"image/png"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSymlogScale(t *testing.T) {
	var s symlog
	for _, c := range []struct{ x, want float64 }{
		{0, 0}, {0.0005, 0.125}, {0.001, 0.25}, {0.01, 0.5}, {0.1, 0.75}, {1, 1},
	} {
		if got := s.Normalize(0, 1, c.x); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("Normalize(0, 1, %g) = %g, want %g", c.x, got, c.want)
		}
	}
	var labels []string
	for _, tk := range s.Ticks(0, 0.5) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if diff := cmp.Diff([]string{"0", "0.1 %", "1 %", "10 %", "50 %"}, labels); diff != "" {
		t.Errorf("tick labels (-want +got):\n%s", diff)
	}
}

func TestPlotAxisRanges(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0.02}, {[]float64{0, 0.004}, 0.02}, {[]float64{0.03}, 0.05}, {[]float64{0.05}, 0.05},
		{[]float64{0.3, math.NaN()}, 0.5}, {[]float64{0.51}, 1},
	} {
		if got := plotXMax(c.xs); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("plotXMax(%v) = %g, want %g", c.xs, got, c.want)
		}
	}
	if lo, hi := plotYRange([]float64{0.42, 0.61}); math.Abs(lo-0.3) > 1e-12 || math.Abs(hi-0.7) > 1e-12 {
		t.Errorf("plotYRange = %g, %g, want 0.3, 0.7", lo, hi)
	}
	if lo, hi := plotYRange([]float64{0.01, 0.99}); lo != 0 || hi != 1 {
		t.Errorf("plotYRange = %g, %g, want 0, 1", lo, hi)
	}
}

func TestPlotLabels(t *testing.T) {
	pts := mergePoints([]plotPoint{
		{x: 0, y: 0.5, label: "kairos-strict"}, {x: 0.2, y: 0.7, label: "no-defense"},
		{x: 0.0001, y: 0.5002, label: "carbd"}, {x: math.NaN(), y: 0.5, label: "nan"},
	})
	var got []string
	for _, p := range pts {
		got = append(got, p.label)
	}
	if diff := cmp.Diff([]string{"kairos-strict = carbd", "no-defense"}, got); diff != "" {
		t.Errorf("merged labels (-want +got):\n%s", diff)
	}
	curve := []plotPoint{{x: 0, y: .4}, {x: .01, y: .5}, {x: .02, y: .6}, {x: .02, y: .6}, {x: .02, y: .6}}
	budgetLabels(curve, []float64{0.005, 0.01, 0.05, 0.1, 0.2})
	got = nil
	for _, p := range curve {
		got = append(got, p.label)
	}
	if diff := cmp.Diff([]string{"α .005", "α .01", "α .05–.2", "", ""}, got); diff != "" {
		t.Errorf("budget labels (-want +got):\n%s", diff)
	}
}

// plotReport is a report of one pipeline: kairos-strict releases nothing,
// carbd 0.4 % (under the goal), no-defense 30 %.
func plotReport() *Report {
	stat := func(x float64) Stat { return Stat{Mean: Num(x), P05: Num(x), P95: Num(x), N: 1} }
	method := func(name string, release, utility float64) MethodReport {
		return MethodReport{Method: name, Suites: []SuiteReport{{Suite: "all",
			Metrics: map[string]Stat{"effect_release": stat(release), "benign_utility": stat(utility)}}}}
	}
	p := PipelineReport{Pipeline: "test-pipeline", Methods: []MethodReport{
		method("no-defense", 0.3, 0.8), method("kairos-strict", 0, 0.4), method("aggregate-crc", 0.05, 0.7),
		method("carbd-crc", 0.004, 0.6), method("carbd", 0.004, 0.6)}}
	for i, a := range DefaultFrontier {
		p.Frontier = append(p.Frontier,
			FrontierPoint{Sweep: SweepCRC, Alpha: a, Method: "carbd", EffectRelease: Num(0.002 * float64(i+1)), BenignUtility: Num(0.5 + 0.02*float64(i))},
			FrontierPoint{Sweep: SweepLedger, Alpha: a, Method: "carbd", EffectRelease: 0, BenignUtility: Num(0.45 + 0.01*float64(i))})
	}
	return &Report{Version: ReportVersion, Config: ReportConfig{Splits: 200}, Pipelines: []PipelineReport{p}}
}

// The figure as drawn: its size, the goal line, and each method's point
// on the side of the goal its figures put it.
func TestWritePlot(t *testing.T) {
	var buf bytes.Buffer
	if err := plotReport().WritePlot(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	pt := func(l float64) int { return int(math.Round(l * 96 / 72)) }
	if b.Dx() != pt(float64(plotPanelWidth)) || b.Dy() != pt(float64(plotPanelHeight+plotHeader)) {
		t.Fatalf("size %v, want %dx%d", b.Size(), pt(float64(plotPanelWidth)), pt(float64(plotPanelHeight+plotHeader)))
	}
	near := func(c color.Color, want color.RGBA) bool {
		r, g, bl, _ := c.RGBA()
		d := math.Abs(float64(r>>8)-float64(want.R)) + math.Abs(float64(g>>8)-float64(want.G)) + math.Abs(float64(bl>>8)-float64(want.B))
		return d < 24
	}
	top := pt(float64(plotHeader)) // below the header's legend
	// columns returns, per x, how many pixels of the colour lie under the header.
	columns := func(want color.RGBA) map[int]int {
		n := map[int]int{}
		for y := top; y < b.Max.Y; y++ {
			for x := b.Min.X; x < b.Max.X; x++ {
				if near(img.At(x, y), want) {
					n[x]++
				}
			}
		}
		return n
	}
	goalX, most := -1, 0
	for x, n := range columns(plotGoalColor) {
		if n > most {
			goalX, most = x, n
		}
	}
	if most < b.Dy()/3 {
		t.Fatalf("no vertical goal line: at most %d goal-coloured pixels in a column", most)
	}
	// A method's point is the only solid 5x5 block of its colour (text
	// and the curves' small dots are thinner).
	blocks := func(want color.RGBA) (xs []int) {
		for y := top; y+5 < b.Max.Y; y++ {
			for x := b.Min.X; x+5 < b.Max.X; x++ {
				solid := true
				for dy := 0; dy < 5 && solid; dy++ {
					for dx := 0; dx < 5 && solid; dx++ {
						solid = near(img.At(x+dx, y+dy), want)
					}
				}
				if solid {
					xs = append(xs, x+2)
				}
			}
		}
		return xs
	}
	// carbd's point is under carbd-crc's, at the same place.
	for _, c := range []struct {
		method string
		right  bool
	}{{"no-defense", true}, {"kairos-strict", false}, {"aggregate-crc", true}, {"carbd-crc", false}} {
		xs := blocks(methodColor(c.method))
		if len(xs) == 0 {
			t.Errorf("%s: no point drawn", c.method)
			continue
		}
		for _, x := range xs {
			if (x > goalX) != c.right {
				t.Errorf("%s: point at x=%d, goal line at x=%d: want it on the %s", c.method, x, goalX, map[bool]string{true: "right", false: "left"}[c.right])
				break
			}
		}
	}
	if xs := blocks(methodColor("carbd")); len(xs) != 0 {
		t.Errorf("carbd drawn apart from carbd-crc at x=%d though both are at the same place", xs[0])
	}
}

func TestWritePlotNoPipelines(t *testing.T) {
	if err := (&Report{}).WritePlot(&bytes.Buffer{}); err == nil {
		t.Error("a report without pipelines was drawn")
	}
}
