package eval

import (
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/carbd/carbd/pkg/calib"
)

// Frontier sweeps.
const (
	// SweepCRC sets every budgeted role's α to the grid value (the ledger
	// budget stays as configured).
	SweepCRC = "crc"
	// SweepLedger sets the ledger budget to the grid value (the role
	// budgets stay as configured).
	SweepLedger = "ledger"
)

// FrontierPoint is one method at one budget of a sweep: test-half means
// over Config.FrontierSplits splits.
type FrontierPoint struct {
	Sweep             string  `json:"sweep"`
	Alpha             float64 `json:"alpha"`
	Method            string  `json:"method"`
	EffectRelease     Num     `json:"effect_release"`
	ASR               Num     `json:"asr"`
	LedgerLoss        Num     `json:"ledger_loss"`
	BenignUtility     Num     `json:"benign_utility"`
	AutonomousSuccess Num     `json:"autonomous_success"`
	Intervention      Num     `json:"intervention"`
}

// sweepMethods are the methods a sweep moves.
var sweepMethods = map[string][]int{
	SweepCRC:    {mNoDefense, mStrict, mAggregate, mCarbdCRC, mCarbd},
	SweepLedger: {mCarbd, mLedgerGCARB, mLedgerFull, mLedgerWindow, mLedgerRandom, mLedgerExecStep},
}

func frontier(ctx context.Context, p *Pipeline, cfg *Config, ctr *replayCounters) ([]FrontierPoint, error) {
	var out []FrontierPoint
	for _, sweep := range []string{SweepCRC, SweepLedger} {
		for _, a := range cfg.Frontier {
			budgets, la := cfg.Budgets, cfg.LedgerAlpha
			if sweep == SweepCRC {
				budgets = calib.Budgets{}
				for r := range cfg.Budgets {
					budgets[r] = a
				}
			} else {
				la = a
			}
			res, err := runSplits(ctx, p, cfg, budgets, la, cfg.FrontierSplits, fmt.Sprintf("frontier %s α=%g", sweep, a), ctr)
			if err != nil {
				if errors.Is(err, calib.ErrLedgerFloor) {
					continue // the grid point is below the ledger's floor for this pipeline
				}
				return nil, err
			}
			mean := func(m, x int) Num {
				xs := make([]float64, len(res))
				for i, r := range res {
					xs[i] = r.x[m][0][x]
				}
				return summarizeStat(xs).Mean
			}
			for _, m := range sweepMethods[sweep] {
				out = append(out, FrontierPoint{Sweep: sweep, Alpha: a, Method: MethodNames[m],
					EffectRelease: mean(m, xEffectRelease), ASR: mean(m, xASR), LedgerLoss: mean(m, xLedgerLoss),
					BenignUtility: mean(m, xBenignUtility), AutonomousSuccess: mean(m, xSuccess), Intervention: mean(m, xIntervention)})
			}
		}
	}
	return out, nil
}

// WritePlot draws the risk-utility frontiers as a PNG: one row per
// pipeline with a frontier; left, the CRC sweep (x: attacker effects
// released, the fraction of attacked runs; y: benign utility proxy);
// right, the ledger sweep (x: mean ledger loss; y: benign utility proxy).
// One curve per method over the budget grid.
func (r *Report) WritePlot(w io.Writer) error {
	var rows []*PipelineReport
	for i := range r.Pipelines {
		if len(r.Pipelines[i].Frontier) > 0 {
			rows = append(rows, &r.Pipelines[i])
		}
	}
	if len(rows) == 0 {
		return errors.New("eval: plot: no frontier computed")
	}
	plots := make([][]*plot.Plot, len(rows))
	for i, p := range rows {
		plots[i] = make([]*plot.Plot, 2)
		for j, sweep := range []string{SweepCRC, SweepLedger} {
			pl := plot.New()
			pl.Title.Text = p.Pipeline + " — " + sweep + " budget sweep"
			pl.Y.Label.Text = "benign utility proxy"
			if sweep == SweepCRC {
				pl.X.Label.Text = "attacker effects released (fraction of attacked runs)"
			} else {
				pl.X.Label.Text = "mean ledger loss"
			}
			pl.Y.Min, pl.Y.Max = 0, 1
			pl.X.Min, pl.X.Max = 0, 0.02
			pl.Legend.Top = true
			pl.Legend.TextStyle.Font.Size = vg.Points(7)
			for k, m := range sweepMethods[sweep] {
				name := MethodNames[m]
				var pts plotter.XYs
				for _, fp := range p.Frontier {
					if fp.Sweep != sweep || fp.Method != name {
						continue
					}
					x := float64(fp.EffectRelease)
					if sweep == SweepLedger {
						x = float64(fp.LedgerLoss)
					}
					y := float64(fp.BenignUtility)
					if math.IsNaN(x) || math.IsNaN(y) {
						continue
					}
					pts = append(pts, plotter.XY{X: x, Y: y})
					pl.X.Max = max(pl.X.Max, 1.05*x)
				}
				if len(pts) == 0 {
					continue
				}
				l, s, err := plotter.NewLinePoints(pts)
				if err != nil {
					return fmt.Errorf("eval: plot: %w", err)
				}
				c := plotutil.Color(k)
				l.Color, s.Color = c, c
				l.Dashes = plotutil.Dashes(k)
				s.Shape = plotutil.Shape(k)
				pl.Add(l, s)
				pl.Legend.Add(name, l, s)
			}
			grid := plotter.NewGrid()
			grid.Vertical.Color = color.Gray{Y: 220}
			grid.Horizontal.Color = color.Gray{Y: 220}
			pl.Add(grid)
			plots[i][j] = pl
		}
	}
	img := vgimg.New(vg.Length(2*480), vg.Length(360*len(rows)))
	dc := draw.New(img)
	t := draw.Tiles{Rows: len(rows), Cols: 2, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	png := vgimg.PngCanvas{Canvas: img}
	if _, err := png.WriteTo(w); err != nil {
		return fmt.Errorf("eval: plot: %w", err)
	}
	return nil
}
