package nfq

import (
	"context"

	"github.com/carbd/carbd/pkg/decide"
)

// EngineDecider decides the loop's effects with carbd's decision engine:
// Release and Refuse map to themselves; Defer holds the effect with the
// engine's sequence number as its ticket, and the scope resolutions that
// come back with later decisions (or from Engine.Resolve and Finish,
// passed to Loop.ApplyResolution) release or refuse it.
//
// The engine serialises its decisions and asks the oracle about a
// deferred blocking effect inside Propose: while it waits, the loop's
// other effects wait for the engine too (their packets stay held, up to
// the loop's HoldTimeout).
type EngineDecider struct {
	Engine *decide.Engine
}

// Decide implements Decider.
func (d EngineDecider) Decide(ctx context.Context, _ Meta, ev decide.Event) Outcome {
	res := d.Engine.Propose(ctx, ev)
	out := Outcome{Reason: res.Decision.Reason.Code}
	switch res.Decision.Verdict {
	case decide.Release:
		out.Verdict = Release
	case decide.Defer:
		out.Verdict, out.Ticket = Hold, res.Decision.Seq
	default:
		out.Verdict = Refuse
	}
	for i := range res.Resolutions {
		out.Resolutions = append(out.Resolutions, Resolutions(&res.Resolutions[i])...)
	}
	return out
}

// Resolutions converts the engine's resolution of a scope into the
// loop's: one per effect the scope held (effects of other channels are
// among them; the loop ignores tickets it does not hold).
func Resolutions(r *decide.Resolution) []Resolution {
	if r == nil {
		return nil
	}
	out := make([]Resolution, 0, len(r.Effects))
	for _, d := range r.Effects {
		v := Refuse
		if d.Verdict == decide.Release {
			v = Release
		}
		out = append(out, Resolution{Ticket: d.Seq, Verdict: v, Reason: d.Reason.Code})
	}
	return out
}
