package eval

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The figure of WritePlot: one panel per pipeline, three to a row, under
// a header with the title and a legend. Lengths are points (1/72 inch);
// the PNG is drawn at 96 dpi, so a full 3 x 3 grid is 1600 x 1200 pixels.
const (
	plotCols        = 3
	plotPanelWidth  = vg.Length(400)
	plotPanelHeight = vg.Length(276)
	plotHeader      = vg.Length(72)
	plotGoal        = 0.01  // the goal: at most 1 % of attacked runs release an attacker effect
	plotLinear      = 0.001 // the symlog axis is linear below 0.1 % and logarithmic above
)

// plotMethods are the methods drawn as points (their figures at the
// configured budgets) and their colours.
var plotMethods = []struct {
	name string
	clr  color.RGBA
}{
	{"no-defense", color.RGBA{R: 90, G: 90, B: 90, A: 255}},
	{"kairos-strict", color.RGBA{R: 230, G: 120, B: 0, A: 255}},
	{"aggregate-crc", color.RGBA{R: 30, G: 100, B: 200, A: 255}},
	{"carbd-crc", color.RGBA{R: 150, G: 60, B: 170, A: 255}},
	{"carbd", color.RGBA{R: 0, G: 140, B: 70, A: 255}},
	{"ledger-alone", color.RGBA{R: 160, G: 110, B: 40, A: 255}},
}

var plotGoalColor = color.RGBA{R: 200, G: 30, B: 30, A: 255}

func methodColor(name string) color.RGBA {
	for _, m := range plotMethods {
		if m.name == name {
			return m.clr
		}
	}
	return color.RGBA{A: 255}
}

// plotCurves are the frontier's curves: a method along one sweep.
var plotCurves = []struct {
	sweep, method string
	dashed        bool
}{
	{SweepCRC, "aggregate-crc", false},
	{SweepCRC, "carbd", false},
	{SweepLedger, "carbd", true},
	{SweepLedger, "ledger-alone", true},
}

// symlog is the x axis' scale: linear from 0 to plotLinear, logarithmic
// above, so that 0 has a place and the region under the goal is wide.
type symlog struct{}

func symlogPos(x float64) float64 {
	if x < plotLinear {
		return x / plotLinear
	}
	return 1 + math.Log10(x/plotLinear)
}

// Normalize implements plot.Normalizer.
func (symlog) Normalize(min, max, x float64) float64 {
	lo, hi := symlogPos(min), symlogPos(max)
	return (symlogPos(x) - lo) / (hi - lo)
}

// Ticks implements plot.Ticker: 0, then the decades from 0.1 % labelled
// and their multiples as minor ticks.
func (symlog) Ticks(min, max float64) []plot.Tick {
	ticks := []plot.Tick{{Value: 0, Label: "0"}}
	for d := plotLinear; d <= max*1.0001; d *= 10 {
		ticks = append(ticks, plot.Tick{Value: d, Label: percent(d)})
		for k := 2; k <= 9; k++ {
			if v := float64(k) * d; v <= max*1.0001 {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
	}
	if last := ticks[len(ticks)-1]; last.Label == "" && max > 2*plotLinear {
		ticks[len(ticks)-1].Label = percent(last.Value) // label the axis' end
	}
	return ticks
}

// percent formats a fraction as a percentage with the digits it needs.
func percent(f float64) string {
	return strconv.FormatFloat(100*f, 'f', -1, 64) + " %"
}

// plotXMax is the x axis' end: the largest x drawn, rounded up to 2, 5 or
// 10 times a power of ten, and never under twice the goal.
func plotXMax(xs []float64) float64 {
	m := 2 * plotGoal
	for _, x := range xs {
		if !math.IsNaN(x) && x > m {
			m = x
		}
	}
	for d := plotLinear; ; d *= 10 {
		for _, k := range []float64{1, 2, 5} {
			if k*d >= m*0.9999 {
				return k * d
			}
		}
	}
}

// plotYRange is the y axis' range: the values drawn, widened to tenths
// with a margin, within [0, 1].
func plotYRange(ys []float64) (lo, hi float64) {
	lo, hi = 1, 0
	for _, y := range ys {
		if !math.IsNaN(y) {
			lo, hi = min(lo, y), max(hi, y)
		}
	}
	if lo > hi {
		return 0, 1
	}
	return max(0, math.Floor(10*lo-0.3)/10), min(1, math.Ceil(10*hi+0.3)/10)
}

// plotPoint is a labelled point of a panel.
type plotPoint struct {
	x, y  float64
	label string
	clr   color.RGBA
	big   bool // a method's point (large, label in the method's colour), else a budget on a curve
}

// plotCurve is a polyline of a panel.
type plotCurve struct {
	pts    []plotPoint
	clr    color.RGBA
	dashed bool
}

// panel draws a pipeline's curves, points, labels and the goal line; it
// places each label where it overlaps no other label or point.
type panel struct {
	curves []plotCurve
	points []plotPoint
	label  text.Style
	small  text.Style
}

// Plot implements plot.Plotter.
func (pn *panel) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	gx := trX(plotGoal)
	c.StrokeLine2(draw.LineStyle{Color: plotGoalColor, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(6), vg.Points(3)}},
		gx, c.Min.Y, gx, c.Max.Y)
	for _, cv := range pn.curves {
		var line []vg.Point
		for _, pt := range cv.pts {
			line = append(line, vg.Point{X: trX(pt.x), Y: trY(pt.y)})
		}
		sty := draw.LineStyle{Color: cv.clr, Width: vg.Points(1.2)}
		if cv.dashed {
			sty.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		c.StrokeLines(sty, c.ClipLinesXY(line)...)
		for _, pt := range line {
			c.DrawGlyph(draw.GlyphStyle{Color: cv.clr, Radius: vg.Points(2), Shape: draw.CircleGlyph{}}, pt)
		}
	}
	var taken []vg.Rectangle
	mark := func(pt vg.Point, r vg.Length) {
		taken = append(taken, vg.Rectangle{Min: vg.Point{X: pt.X - r, Y: pt.Y - r}, Max: vg.Point{X: pt.X + r, Y: pt.Y + r}})
	}
	for _, pt := range pn.points {
		at := vg.Point{X: trX(pt.x), Y: trY(pt.y)}
		c.DrawGlyph(draw.GlyphStyle{Color: pt.clr, Radius: vg.Points(4.5), Shape: draw.CircleGlyph{}}, at)
		mark(at, vg.Points(5))
	}
	for _, cv := range pn.curves {
		for k, pt := range cv.pts {
			a := vg.Point{X: trX(pt.x), Y: trY(pt.y)}
			mark(a, vg.Points(2.5))
			if k == 0 {
				continue
			}
			// The segment from the previous point, as a chain of small
			// boxes, so that no label is written across a curve.
			b := vg.Point{X: trX(cv.pts[k-1].x), Y: trY(cv.pts[k-1].y)}
			n := int(math.Hypot(float64(a.X-b.X), float64(a.Y-b.Y))/3) + 1
			for j := 1; j < n; j++ {
				mark(lerp(b, a, float64(j)/float64(n)), vg.Points(1))
			}
		}
	}
	taken = append(taken, vg.Rectangle{Min: vg.Point{X: gx - vg.Points(1), Y: c.Min.Y}, Max: vg.Point{X: gx + vg.Points(1), Y: c.Max.Y}})
	// Method labels first (they must all appear), then the budgets on
	// the curves where there is room.
	place := func(pt plotPoint, sty text.Style, force bool) {
		at := vg.Point{X: trX(pt.x), Y: trY(pt.y)}
		w, h := sty.Width(pt.label), sty.Height(pt.label)
		gap := vg.Points(6)
		if !pt.big {
			gap = vg.Points(3.5)
		}
		var best vg.Rectangle
		bestScore := math.Inf(1)
		for i, off := range []vg.Point{
			{X: gap, Y: -h / 2}, {X: -gap - w, Y: -h / 2}, {X: -w / 2, Y: gap}, {X: -w / 2, Y: -gap - h},
			{X: gap, Y: gap / 2}, {X: gap, Y: -gap/2 - h}, {X: -gap - w, Y: gap / 2}, {X: -gap - w, Y: -gap/2 - h},
			{X: gap, Y: h}, {X: gap, Y: -2 * h}, {X: -gap - w, Y: h}, {X: -gap - w, Y: -2 * h},
			{X: -w / 2, Y: gap + h}, {X: -w / 2, Y: -gap - 2*h},
		} {
			r := vg.Rectangle{Min: at.Add(off), Max: at.Add(off).Add(vg.Point{X: w, Y: h})}
			score := float64(i) // prefer the earlier places
			if r.Min.X < c.Min.X || r.Max.X > c.Max.X || r.Min.Y < c.Min.Y || r.Max.Y > c.Max.Y {
				score += 1000
			}
			for _, t := range taken {
				if ov := overlap(r, t); ov > 0 {
					score += 100 + 100*ov
				}
			}
			if score < bestScore {
				best, bestScore = r, score
			}
		}
		if !force && bestScore >= 100 {
			return // no room for an optional label
		}
		taken = append(taken, best)
		c.FillText(sty, best.Min, pt.label)
	}
	for _, pt := range pn.points {
		sty := pn.label
		sty.Color = pt.clr
		place(pt, sty, true)
	}
	for _, cv := range pn.curves {
		for _, pt := range cv.pts {
			if pt.label == "" {
				continue
			}
			sty := pn.small
			sty.Color = cv.clr
			place(pt, sty, false)
		}
	}
}

func lerp(a, b vg.Point, t float64) vg.Point {
	return vg.Point{X: a.X + vg.Length(t)*(b.X-a.X), Y: a.Y + vg.Length(t)*(b.Y-a.Y)}
}

// overlap is the area of the intersection of two rectangles relative to
// the smaller one (0 when apart, 1 when one covers the other).
func overlap(a, b vg.Rectangle) float64 {
	w := min(a.Max.X, b.Max.X) - max(a.Min.X, b.Min.X)
	h := min(a.Max.Y, b.Max.Y) - max(a.Min.Y, b.Min.Y)
	if w <= 0 || h <= 0 {
		return 0
	}
	area := func(r vg.Rectangle) float64 { return float64((r.Max.X - r.Min.X) * (r.Max.Y - r.Min.Y)) }
	return float64(w*h) / max(1e-9, min(area(a), area(b)))
}

// mergePoints joins points that fall on the same place (within 0.05
// percentage points) into one, their labels joined by " = ".
func mergePoints(pts []plotPoint) []plotPoint {
	var out []plotPoint
next:
	for _, p := range pts {
		if math.IsNaN(p.x) || math.IsNaN(p.y) {
			continue
		}
		for i := range out {
			if math.Abs(out[i].x-p.x) < 5e-4 && math.Abs(out[i].y-p.y) < 5e-4 {
				out[i].label += " = " + p.label
				continue next
			}
		}
		out = append(out, p)
	}
	return out
}

// budgetLabels labels a curve's points with their budgets, one label
// for a run of points at the same place ("α .05–.2").
func budgetLabels(pts []plotPoint, alphas []float64) {
	short := func(a float64) string { return strings.TrimPrefix(strconv.FormatFloat(a, 'g', -1, 64), "0") }
	for i := 0; i < len(pts); {
		j := i
		for j+1 < len(pts) && math.Abs(pts[j+1].x-pts[i].x) < 5e-4 && math.Abs(pts[j+1].y-pts[i].y) < 5e-4 {
			j++
		}
		l := "α " + short(alphas[i])
		if j > i {
			l += "–" + short(alphas[j])
		}
		pts[i].label = l
		for k := i + 1; k <= j; k++ {
			pts[k].label = ""
		}
		i = j + 1
	}
}

// panelData is what a pipeline's panel shows.
func panelData(p *PipelineReport) (points []plotPoint, curves []plotCurve) {
	var pts []plotPoint
	for _, m := range plotMethods {
		pts = append(pts, plotPoint{x: float64(p.Get(m.name, "all", "effect_release").Mean), y: float64(p.Get(m.name, "all", "benign_utility").Mean),
			label: m.name, clr: m.clr, big: true})
	}
	points = mergePoints(pts)
	for _, cd := range plotCurves {
		var cpts []plotPoint
		var alphas []float64
		for _, fp := range p.Frontier {
			if fp.Sweep != cd.sweep || fp.Method != cd.method {
				continue
			}
			x, y := float64(fp.EffectRelease), float64(fp.BenignUtility)
			if math.IsNaN(x) || math.IsNaN(y) {
				continue
			}
			cpts = append(cpts, plotPoint{x: x, y: y})
			alphas = append(alphas, fp.Alpha)
		}
		if len(cpts) == 0 {
			continue
		}
		budgetLabels(cpts, alphas)
		if cd.sweep == SweepLedger {
			for i := range cpts {
				if cpts[i].label != "" {
					cpts[i].label = "ledger " + cpts[i].label
				}
			}
		}
		curves = append(curves, plotCurve{pts: cpts, clr: methodColor(cd.method), dashed: cd.dashed})
	}
	return points, curves
}

func textStyle(size vg.Length, clr color.Color) text.Style {
	return text.Style{Color: clr, Font: font.From(plot.DefaultFont, size), Handler: plot.DefaultTextHandler}
}

// WritePlot draws the evaluation as one PNG: a panel per pipeline with
// attacker effects released (fraction of attacked runs, symlog x) against
// benign utility (fraction of benign runs, y); each method's point at the
// configured budgets, labelled; the frontier's curves (aggregate-crc and
// carbd over the CRC budgets, carbd over the ledger budgets; points
// labelled with α) when the report has a frontier; the 1 % goal as a
// vertical line.
func (r *Report) WritePlot(w io.Writer) error {
	if len(r.Pipelines) == 0 {
		return errors.New("eval: plot: no pipelines")
	}
	type pdata struct {
		points []plotPoint
		curves []plotCurve
	}
	data := make([]pdata, len(r.Pipelines))
	var xs, ys []float64
	frontier := false
	for i := range r.Pipelines {
		data[i].points, data[i].curves = panelData(&r.Pipelines[i])
		for _, pt := range data[i].points {
			xs, ys = append(xs, pt.x), append(ys, pt.y)
		}
		for _, cv := range data[i].curves {
			frontier = true
			for _, pt := range cv.pts {
				xs, ys = append(xs, pt.x), append(ys, pt.y)
			}
		}
	}
	xMax := plotXMax(xs)
	yMin, yMax := plotYRange(ys)
	cols := min(plotCols, len(r.Pipelines))
	rows := (len(r.Pipelines) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, cols)
	}
	yTicks := plot.ConstantTicks{}
	for k := int(math.Round(10 * yMin)); k <= int(math.Round(10*yMax)); k++ {
		t := plot.Tick{Value: float64(k) / 10}
		if (yMax-yMin) < 0.55 || k%2 == 0 {
			t.Label = strconv.Itoa(10*k) + " %"
		}
		yTicks = append(yTicks, t)
	}
	for i := range r.Pipelines {
		pl := plot.New()
		pl.Title.Text = r.Pipelines[i].Pipeline
		pl.Title.TextStyle.Font.Size = vg.Points(11)
		pl.X.Label.Text = "attacker effects released (% of attacked runs)"
		pl.Y.Label.Text = "benign utility (% of benign runs)"
		for _, a := range []*plot.Axis{&pl.X, &pl.Y} {
			a.Label.TextStyle.Font.Size = vg.Points(9)
			a.Tick.Label.Font.Size = vg.Points(8.5)
		}
		pl.X.Scale, pl.X.Tick.Marker = symlog{}, symlog{}
		pl.Y.Tick.Marker = yTicks
		pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = 0, xMax, yMin, yMax
		pl.Add(&panel{points: data[i].points, curves: data[i].curves,
			label: textStyle(vg.Points(9), color.Black), small: textStyle(vg.Points(7.5), color.Black)})
		plots[i/cols][i%cols] = pl
	}
	width, height := plotPanelWidth*vg.Length(cols), plotHeader+plotPanelHeight*vg.Length(rows)
	img := vgimg.New(width, height)
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	r.drawHeader(draw.Crop(dc, 0, 0, height-plotHeader, 0), frontier)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 5, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 1, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(plots, t, draw.Crop(dc, 0, 0, 0, -plotHeader))
	for i := range plots {
		for j := range plots[i] {
			if plots[i][j] != nil {
				plots[i][j].Draw(canvases[i][j])
			}
		}
	}
	png := vgimg.PngCanvas{Canvas: img}
	if _, err := png.WriteTo(w); err != nil {
		return fmt.Errorf("eval: plot: %w", err)
	}
	return nil
}

// drawHeader writes the figure's title and its legend.
func (r *Report) drawHeader(c draw.Canvas, frontier bool) {
	title := textStyle(vg.Points(13), color.Black)
	title.XAlign = text.XCenter
	sub := textStyle(vg.Points(10), color.Gray{Y: 60})
	sub.XAlign = text.XCenter
	mid := (c.Min.X + c.Max.X) / 2
	y := c.Max.Y - vg.Points(18)
	c.FillText(title, vg.Point{X: mid, Y: y}, "carbd eval agentdojo: attacker effects released against benign utility")
	what := fmt.Sprintf("points: test-half means over %d splits at the configured budgets", r.Config.Splits)
	if frontier {
		what += "; curves: the frontier over the budgets α (CRC: every role; ledger: the gate's)"
	}
	c.FillText(sub, vg.Point{X: mid, Y: y - vg.Points(15)}, what+"; x axis linear under 0.1 %, logarithmic above")
	// The legend: one row of entries, centred.
	lsty := textStyle(vg.Points(10), color.Black)
	type entry struct {
		label string
		draw  func(at vg.Point)
	}
	var entries []entry
	for _, m := range plotMethods {
		clr := m.clr
		entries = append(entries, entry{m.name, func(at vg.Point) {
			c.DrawGlyph(draw.GlyphStyle{Color: clr, Radius: vg.Points(4.5), Shape: draw.CircleGlyph{}}, at.Add(vg.Point{X: vg.Points(8)}))
		}})
	}
	line := func(clr color.Color, dashes []vg.Length, dot bool) func(vg.Point) {
		return func(at vg.Point) {
			c.StrokeLine2(draw.LineStyle{Color: clr, Width: vg.Points(1.5), Dashes: dashes}, at.X, at.Y, at.X+vg.Points(16), at.Y)
			if dot {
				c.DrawGlyph(draw.GlyphStyle{Color: clr, Radius: vg.Points(2), Shape: draw.CircleGlyph{}}, at.Add(vg.Point{X: vg.Points(8)}))
			}
		}
	}
	if frontier {
		entries = append(entries,
			entry{"CRC budget sweep", line(color.Gray{Y: 60}, nil, true)},
			entry{"ledger budget sweep (carbd, ledger-alone)", line(methodColor("carbd"), []vg.Length{vg.Points(4), vg.Points(2)}, true)})
	}
	entries = append(entries, entry{"goal: at most 1 % released", line(plotGoalColor, []vg.Length{vg.Points(6), vg.Points(3)}, false)})
	icon, gap := vg.Points(20), vg.Points(14)
	total := vg.Length(0)
	for _, e := range entries {
		total += icon + lsty.Width(e.label) + gap
	}
	x := mid - (total-gap)/2
	ly := y - vg.Points(40)
	for _, e := range entries {
		e.draw(vg.Point{X: x, Y: ly + lsty.Height("x")/3})
		c.FillText(lsty, vg.Point{X: x + icon, Y: ly}, e.label)
		x += icon + lsty.Width(e.label) + gap
	}
}
