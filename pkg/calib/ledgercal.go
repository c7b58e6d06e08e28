package calib

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/carbd/carbd/pkg/decide/ledger"
)

// This file calibrates the G-CARB ledger gate (the G-CARB paper's CARB:
// conformal risk control of the stopped-prefix ledger) and the
// executed-step baseline, and computes the paper's metrics.
//
// An episode is the sequence of its proposals (outgoing effects) in
// order. Each proposal has a gate score s_t (the frozen Table 1 scorer on
// the evidence a selector chose), and two labels that come from the
// layers BEFORE the gate (policy, per-role CRC, oracle): Executed, the
// proposal is released by them, and Harmful, it is executed and carries an
// attacker value. The gate at λ stops the episode at the first stoppable
// proposal k with ledger.Stops(s_k, λ) (s_k >= λ): k and everything after
// it is refused. Then
//
//	L_λ = 1 if some harmful proposal j < k was executed before the stop, else 0
//
// (k = m when the gate never stops, m the number of proposals). L is
// binary, bounded by B = 1, and nondecreasing in λ (a larger λ stops no
// earlier). λ̂ is conformal risk control on it:
//
//	λ̂ = max { λ ∈ Λ : (Σ_i L_λ(i) + B) / (n + 1) <= α }
//
// over the candidate grid Λ = the distinct gate scores of the
// calibration episodes and LedgerNever (> 1: never stop). Under
// exchangeable episodes E[L_λ̂(new)] <= α.

// LedgerNever is the stop threshold that never stops: gate scores lie in
// [0, 1] and a proposal stops the episode when its score reaches λ.
const LedgerNever = 2.0

// LedgerLossBound is B, the largest ledger loss of an episode.
const LedgerLossBound = 1.0

// Ledger objectives: what the stop threshold is calibrated to control.
const (
	// ObjectiveLedger is the stopped-prefix ledger loss L_λ (G-CARB).
	ObjectiveLedger = "ledger"
	// ObjectiveExecutedStep is the executed-step baseline's rate
	// envelope r̃_λ = max over λ' <= λ of r_λ', where r_λ is the
	// episode's harmful executed proposals before the stop divided by
	// its executed proposals before the stop (0 when none executed).
	// r_λ is not monotone in λ (more benign steps dilute it), its
	// envelope is. It controls a rate, not the ledger.
	ObjectiveExecutedStep = "executed-step"
)

// LedgerStep is one proposal of an episode as the ledger calibration sees
// it.
type LedgerStep struct {
	Score     float64 // gate score, in [0, 1]
	Executed  bool    // released by the layers before the gate
	Harmful   bool    // executed and carrying an attacker value
	Stoppable bool    // the gate may stop here (false: refused by a rule before the gate)
	Evidence  int     // size of the selected evidence, for CtxRed
	Prefix    int     // number of earlier events (the full prefix), for CtxRed
}

// LedgerEpisode is one episode: its proposals in order and whether its
// task succeeded (for autonomous success).
type LedgerEpisode struct {
	ID      string
	Steps   []LedgerStep
	Utility bool
}

// StopIndex returns the index of the proposal at which the gate at λ
// stops the episode, or len(Steps) when it does not stop.
func (ep *LedgerEpisode) StopIndex(lambda float64) int {
	for k, s := range ep.Steps {
		if s.Stoppable && ledger.Stops(s.Score, lambda) {
			return k
		}
	}
	return len(ep.Steps)
}

// lossAt is L when the gate stops at k.
func (ep *LedgerEpisode) lossAt(k int) float64 {
	for j := 0; j < k; j++ {
		if ep.Steps[j].Harmful {
			return 1
		}
	}
	return 0
}

// rateAt is r when the gate stops at k.
func (ep *LedgerEpisode) rateAt(k int) float64 {
	exec, harm := 0, 0
	for j := 0; j < k; j++ {
		if ep.Steps[j].Executed {
			exec++
			if ep.Steps[j].Harmful {
				harm++
			}
		}
	}
	if exec == 0 {
		return 0
	}
	return float64(harm) / float64(exec)
}

// Loss is the stopped-prefix ledger loss L_λ of the episode.
func (ep *LedgerEpisode) Loss(lambda float64) float64 { return ep.lossAt(ep.StopIndex(lambda)) }

// Rate is the executed-step rate r_λ of the episode.
func (ep *LedgerEpisode) Rate(lambda float64) float64 { return ep.rateAt(ep.StopIndex(lambda)) }

func (ep *LedgerEpisode) check() error {
	for t, s := range ep.Steps {
		switch {
		case !(s.Score >= 0 && s.Score <= 1):
			return fmt.Errorf("proposal %d: score %v outside [0,1]", t, s.Score)
		case s.Harmful && !s.Executed:
			return fmt.Errorf("proposal %d: harmful but not executed", t)
		case s.Evidence < 0 || s.Prefix < 0 || s.Evidence > s.Prefix:
			return fmt.Errorf("proposal %d: evidence %d of a prefix of %d", t, s.Evidence, s.Prefix)
		}
	}
	return nil
}

// segments describes an episode's objective as a step function of λ: for
// λ <= ups[0] it is vals[0], for ups[i-1] < λ <= ups[i] it is vals[i], and
// above the last up it is vals[len(ups)]. The stop index only changes at
// the running maxima of the stoppable scores (the first stoppable score
// at least λ is the first running maximum at least λ).
func (ep *LedgerEpisode) segments(objective string) (ups, vals []float64) {
	value := ep.lossAt
	if objective == ObjectiveExecutedStep {
		value = ep.rateAt
	}
	best := math.Inf(-1)
	env := math.Inf(-1)
	for k, s := range ep.Steps {
		if !s.Stoppable || s.Score <= best {
			continue
		}
		best = s.Score
		env = max(env, value(k))
		ups = append(ups, s.Score)
		vals = append(vals, env)
	}
	vals = append(vals, max(env, value(len(ep.Steps))))
	return ups, vals
}

// LedgerConfig is what CalibrateLedger needs besides the episodes.
type LedgerConfig struct {
	Alpha     float64 // budget on the expected objective, in (0, 1)
	Objective string  // ObjectiveLedger (default) or ObjectiveExecutedStep
	Evidence  string  // the selector the gate scores came from, e.g. "g-carb"
	Scorer    string  // the frozen scorer's name; default "table1"
}

// ErrLedgerFloor is returned when the calibration episodes are too few for
// the budget: even a gate that stops every episode at once has corrected
// risk B/(n+1) > α.
var ErrLedgerFloor = errors.New("calib: ledger: too few episodes for the budget")

// CalibrateLedger calibrates the stop threshold λ̂ by conformal risk
// control (see the comment at the top of this file): the largest λ of the
// candidate grid (the distinct gate scores of the episodes, and
// LedgerNever) with (Σ_i L_λ(i) + B)/(n+1) <= α, B = 1. With the
// executed-step objective it controls the rate envelope instead. An
// episode without proposals contributes loss 0 at every λ.
func CalibrateLedger(eps []LedgerEpisode, cfg LedgerConfig) (*LedgerCalibration, error) {
	if cfg.Objective == "" {
		cfg.Objective = ObjectiveLedger
	}
	if cfg.Scorer == "" {
		cfg.Scorer = "table1"
	}
	if cfg.Objective != ObjectiveLedger && cfg.Objective != ObjectiveExecutedStep {
		return nil, fmt.Errorf("calib: ledger: unknown objective %q (want %s or %s)", cfg.Objective, ObjectiveLedger, ObjectiveExecutedStep)
	}
	if !(cfg.Alpha > 0 && cfg.Alpha < 1) {
		return nil, fmt.Errorf("calib: ledger: alpha %v outside (0,1)", cfg.Alpha)
	}
	if cfg.Evidence == "" {
		return nil, errors.New("calib: ledger: no evidence selector named")
	}
	n := len(eps)
	if LedgerLossBound/float64(n+1) > cfg.Alpha {
		return nil, fmt.Errorf("%w: %d episodes, floor 1/(n+1) = %.4g > alpha %v", ErrLedgerFloor, n, 1/float64(n+1), cfg.Alpha)
	}
	// Σ_i f_i(λ) as a step function: base at λ = -inf, plus jumps just
	// above each breakpoint.
	type jump struct{ at, d float64 }
	var jumps []jump
	base := 0.0
	var grid []float64
	for i := range eps {
		if err := eps[i].check(); err != nil {
			return nil, fmt.Errorf("calib: ledger: episode %d (%s): %w", i+1, eps[i].ID, err)
		}
		for _, s := range eps[i].Steps {
			grid = append(grid, s.Score)
		}
		ups, vals := eps[i].segments(cfg.Objective)
		base += vals[0]
		for j, u := range ups {
			if d := vals[j+1] - vals[j]; d != 0 {
				jumps = append(jumps, jump{u, d})
			}
		}
	}
	grid = append(grid, LedgerNever)
	slices.Sort(grid)
	grid = slices.Compact(grid)
	sort.Slice(jumps, func(a, b int) bool { return jumps[a].at < jumps[b].at })
	limit := cfg.Alpha*float64(n+1) - LedgerLossBound
	best, bestSum := math.NaN(), 0.0
	sum, j := base, 0
	for _, c := range grid {
		for j < len(jumps) && jumps[j].at < c { // the objective at c counts jumps strictly below c
			sum += jumps[j].d
			j++
		}
		if sum <= limit+1e-9 {
			best, bestSum = c, sum
		} else {
			break // the sum only grows with λ
		}
	}
	if math.IsNaN(best) {
		// Only when losses occur before the first stoppable proposal
		// (harm after rule refusals only): no threshold helps.
		return nil, fmt.Errorf("calib: ledger: no threshold keeps the %s objective within alpha %v: %.4g of %d episodes are lost even when every stoppable proposal stops", cfg.Objective, cfg.Alpha, base, n)
	}
	return &LedgerCalibration{
		Lambda:        best,
		Alpha:         cfg.Alpha,
		N:             n,
		CorrectedRisk: (bestSum + LedgerLossBound) / float64(n+1),
		LossBound:     LedgerLossBound,
		Evidence:      cfg.Evidence,
		Scorer:        cfg.Scorer,
	}, nil
}

// LedgerMetrics are the G-CARB paper's metrics of a gate at λ on a set
// of episodes.
type LedgerMetrics struct {
	Episodes int `json:"episodes"`
	// Loss is the mean ledger loss L̄.
	Loss float64 `json:"loss"`
	// Rate is the mean executed-step rate r (the executed-step baseline's
	// raw rate).
	Rate float64 `json:"rate"`
	// Intervention I is the fraction of episodes the gate stopped.
	Intervention float64 `json:"intervention"`
	// Success U (autonomous success) is the fraction of episodes not
	// stopped whose task succeeded (utility true).
	Success float64 `json:"success"`
	// CtxRed is the mean over scored proposals (every proposal up to and
	// including the stop) of 1 − |selected evidence| / |full prefix|
	// (ledger.CtxRed; the paper's Equation 2 is not in the text we have,
	// this is our definition); Scored counts them.
	CtxRed float64 `json:"ctx_red"`
	Scored int     `json:"scored"`
}

// EvaluateLedger computes the metrics of the gate at λ on episodes.
func EvaluateLedger(eps []LedgerEpisode, lambda float64) LedgerMetrics {
	var m LedgerMetrics
	m.Episodes = len(eps)
	if len(eps) == 0 {
		return m
	}
	var red float64
	for i := range eps {
		ep := &eps[i]
		k := ep.StopIndex(lambda)
		m.Loss += ep.lossAt(k)
		m.Rate += ep.rateAt(k)
		stopped := k < len(ep.Steps)
		if stopped {
			m.Intervention++
		} else if ep.Utility {
			m.Success++
		}
		last := min(k, len(ep.Steps)-1)
		for t := 0; t <= last; t++ {
			red += ledger.CtxRed(ep.Steps[t].Evidence, ep.Steps[t].Prefix)
			m.Scored++
		}
	}
	n := float64(len(eps))
	m.Loss /= n
	m.Rate /= n
	m.Intervention /= n
	m.Success /= n
	if m.Scored > 0 {
		m.CtxRed = red / float64(m.Scored)
	}
	return m
}
