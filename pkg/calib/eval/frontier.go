package eval

import (
	"context"
	"errors"
	"fmt"

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
	SweepLedger: {mCarbd, mLedgerGCARB, mLedgerFull, mLedgerWindow, mLedgerRandom, mLedgerExecStep, mLedgerAlone},
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
