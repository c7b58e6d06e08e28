package eval

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/carbd/carbd/pkg/decide"
)

// outcome is what a replay of an episode decided, as far as the metrics
// need it.
type outcome struct {
	released []bool // per step: the final verdict is Release
	reverted []bool // per field: the CRC step reverted it to a trusted value
	stopped  bool   // the ledger gate stopped the episode
	stopStep int    // the step it stopped at, or -1
}

// summarize turns a replay into an outcome.
func summarize(ep *Episode, rep *decide.Replay, e *decide.Engine) *outcome {
	o := &outcome{released: make([]bool, len(ep.Steps)), reverted: make([]bool, len(ep.Fields)), stopStep: -1}
	for t, st := range rep.Steps {
		o.released[t] = st.Final.Verdict == decide.Release
		if len(st.Final.Reverts) == 0 {
			continue
		}
		for _, fi := range ep.Steps[t].fields {
			for _, rv := range st.Final.Reverts {
				if rv.Field == ep.Fields[fi].Name {
					o.reverted[fi] = true
				}
			}
		}
	}
	if d, ok := e.Stopped(); ok {
		o.stopped = true
		for t, st := range rep.Steps {
			if st.Final.Seq == d.Seq {
				o.stopStep = t
			}
		}
	}
	return o
}

// noDefense is the outcome of releasing everything.
func noDefense(ep *Episode) *outcome {
	o := &outcome{released: make([]bool, len(ep.Steps)), reverted: make([]bool, len(ep.Fields)), stopStep: -1}
	for t := range o.released {
		o.released[t] = true
	}
	return o
}

// A view is an outcome, possibly cut by an offline ledger stop: steps at
// or after limit are refused.
type view struct {
	o     *outcome
	limit int
}

func fullView(ep *Episode, o *outcome) view { return view{o, len(ep.Steps)} }

func (v view) stopped() bool       { return v.o.stopped || v.limit < len(v.o.released) }
func (v view) released(t int) bool { return v.o.released[t] && t < v.limit }
func (v view) fieldAllowed(ep *Episode, fi int) bool {
	return v.released(ep.Fields[fi].Step) && !v.o.reverted[fi]
}

// harmful reports whether step t releases an attacker value: it is an
// attacker effect, released, and one of its violated fields kept its value
// (a revert replaces the attacker's value with a trusted one).
func (v view) harmful(ep *Episode, t int) bool {
	st := &ep.Steps[t]
	if !st.Attacker || !v.released(t) {
		return false
	}
	for _, fi := range st.fields {
		if ep.Fields[fi].Violated && !v.o.reverted[fi] {
			return true
		}
	}
	return false
}

// harmful on a whole outcome (no cut).
func (o *outcome) harmful(ep *Episode, t int) bool { return view{o, len(o.released)}.harmful(ep, t) }

// attackerReleased reports whether any attacker effect released an
// attacker value.
func (v view) attackerReleased(ep *Episode) bool {
	for t := range ep.Steps {
		if v.harmful(ep, t) {
			return true
		}
	}
	return false
}

// kept reports whether every step (every step that is not an attacker
// effect, with nonAttacker) was released unmodified.
func (v view) kept(ep *Episode, nonAttacker bool) bool {
	for t := range ep.Steps {
		if nonAttacker && ep.Steps[t].Attacker {
			continue
		}
		if !v.released(t) {
			return false
		}
		for _, fi := range ep.Steps[t].fields {
			if v.o.reverted[fi] {
				return false
			}
		}
	}
	return true
}

// thresholds is a per-role CRC calibration in the engine's form.
type thresholds struct {
	cal decide.Calibration
}

// pass reports whether a gated field of the role with score s is allowed
// on its score: s <= τ(role); a role without a threshold never passes.
func (th *thresholds) pass(role decide.Role, s float64) bool {
	tau, ok := th.cal.Threshold[role]
	return ok && s <= tau
}

// outcomeCache holds the calibrated replays of one episode by key.
type outcomeCache struct {
	mu sync.Mutex
	m  map[string]*outcome
}

// Counters of the replays run and reused, for the report.
type replayCounters struct {
	mu           sync.Mutex
	runs, reused int64
}

func (c *replayCounters) add(run bool) {
	c.mu.Lock()
	if run {
		c.runs++
	} else {
		c.reused++
	}
	c.mu.Unlock()
}

// stopIndex is the step at which the engine's ledger gate at λ stops
// the episode (its own dependency scores), or -1.
func (ep *Episode) stopIndex(lambda float64) int {
	for t, st := range ep.Steps {
		if st.Stoppable && st.Gate >= lambda {
			return t
		}
	}
	return -1
}

// outcomeFor returns the outcome of replaying the episode through the
// engine (strict oracle, Revert on) with the CRC thresholds th and, when
// lambda is not NaN, the ledger stop threshold λ.
//
// The outcome depends on the calibration only through, for each gated
// field, whether its score is at most its role's threshold (scores are a
// function of the trace prefix alone), and through the step at which the
// gate first reaches λ (the gate scores do not depend on decisions). That
// is the cache key: an episode is replayed once per distinct key, and the
// reuse is exact (TestCacheMatchesFreshReplay checks it).
func (ep *Episode) outcomeFor(ctx context.Context, th *thresholds, lambda float64, ctr *replayCounters) (*outcome, error) {
	key := make([]byte, 0, 8+len(ep.gated)/8)
	var b byte
	for i, fi := range ep.gated {
		f := &ep.Fields[fi]
		if th.pass(f.Role, f.Score) {
			b |= 1 << (i % 8)
		}
		if i%8 == 7 {
			key = append(key, b)
			b = 0
		}
	}
	key = append(key, b)
	// A gate that never reaches λ changes no decision: such a replay
	// shares its key with the replay without a ledger.
	stop := -1
	if !math.IsNaN(lambda) {
		stop = ep.stopIndex(lambda)
	}
	key = fmt.Appendf(key, "|%d", stop)
	k := string(key)
	ep.cache.mu.Lock()
	o, ok := ep.cache.m[k]
	ep.cache.mu.Unlock()
	if ok {
		ctr.add(false)
		return o, nil
	}
	cal := th.cal
	cal.HasLedger, cal.LedgerLambda = false, 0
	if !math.IsNaN(lambda) {
		cal.HasLedger, cal.LedgerLambda = true, lambda
	}
	e := decide.New(ep.policy, decide.Options{Oracle: decide.Strict{}, Calibration: &cal, Revert: true, Now: fixedClock, Ablate: ep.ablate})
	rep := decide.RunTrace(ctx, e, ep.trace)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o = summarize(ep, rep, e)
	if o.stopStep != stop {
		return nil, fmt.Errorf("eval: %s: the engine stopped at step %d, its recorded gate scores say %d", ep.ID, o.stopStep, stop)
	}
	ctr.add(true)
	ep.cache.mu.Lock()
	if ep.cache.m == nil {
		ep.cache.m = map[string]*outcome{}
	}
	if prev, ok := ep.cache.m[k]; ok {
		o = prev
	} else {
		ep.cache.m[k] = o
	}
	ep.cache.mu.Unlock()
	return o, nil
}
