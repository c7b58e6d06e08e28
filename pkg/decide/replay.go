package decide

import (
	"context"
	"fmt"
	"io"
	"sort"
)

// Step is one outgoing effect of a replayed trace: the decision when it
// was proposed and its final verdict (after its scope resolved).
type Step struct {
	Index    int      `json:"index"` // position in the trace, from 0
	Decision Decision `json:"decision"`
	Final    Decision `json:"final"`
	Event    Event    `json:"event"`
}

// Replay is the outcome of running a recorded trace through an engine.
type Replay struct {
	Steps       []Step       `json:"steps"`
	Resolutions []Resolution `json:"resolutions"`
	Stats       Stats        `json:"stats"`
}

// RunTrace feeds a recorded trace to the engine: incoming events are
// observed, outgoing ones proposed, and the open scope resolves at the end
// of the task.
func RunTrace(ctx context.Context, e *Engine, trace []Event) *Replay {
	r := &Replay{}
	bySeq := map[uint64]int{}
	apply := func(res []Resolution) {
		for _, rs := range res {
			r.Resolutions = append(r.Resolutions, rs)
			for _, d := range rs.Effects {
				if i, ok := bySeq[d.Seq]; ok {
					r.Steps[i].Final = d
				}
			}
		}
	}
	for i, ev := range trace {
		if err := ctx.Err(); err != nil {
			break
		}
		if ev.Dir == In {
			e.Observe(ev)
			continue
		}
		res := e.Propose(ctx, ev)
		st := Step{Index: i, Decision: res.Decision, Final: res.Decision, Event: *res.Decision.Event}
		apply(res.Resolutions)
		bySeq[res.Decision.Seq] = len(r.Steps)
		r.Steps = append(r.Steps, st)
	}
	if fin := e.Finish(ctx); fin != nil {
		apply([]Resolution{*fin})
	}
	r.Stats = e.Stats()
	return r
}

// Counts tallies the final verdicts of a replay.
func (r *Replay) Counts() (released, refused, deferredReleased, deferredRefused int) {
	for _, s := range r.Steps {
		switch s.Final.Verdict {
		case Release:
			released++
			if s.Decision.Verdict == Defer || s.Final.Layer == LayerOracle {
				deferredReleased++
			}
		case Refuse:
			refused++
			if s.Decision.Verdict == Defer || s.Final.Layer == LayerOracle {
				deferredRefused++
			}
		}
	}
	return
}

// WriteText prints one line per outgoing effect and a summary.
func (r *Replay) WriteText(w io.Writer) {
	for _, s := range r.Steps {
		held := ""
		if s.Decision.Verdict == Defer {
			held = fmt.Sprintf(" (held in scope %d)", s.Decision.Scope)
		}
		fmt.Fprintf(w, "#%-4d %-7s %-10s %s%s\n      %s\n", s.Final.Seq, s.Final.Verdict, s.Final.Layer,
			s.Event.Summary(), held, s.Final.Justification)
	}
	rel, ref, dr, df := r.Counts()
	layers := map[Layer]int{}
	for _, s := range r.Steps {
		layers[s.Final.Layer]++
	}
	keys := make([]string, 0, len(layers))
	for l := range layers {
		keys = append(keys, string(l))
	}
	sort.Strings(keys)
	fmt.Fprintf(w, "\n%d effects: %d released, %d refused (deferred: %d released by the oracle, %d refused); %d scopes (%d committed, %d aborted)\n",
		len(r.Steps), rel, ref, dr, df, r.Stats.Scopes, r.Stats.Committed, r.Stats.Aborted)
	fmt.Fprint(w, "decided by:")
	for _, k := range keys {
		fmt.Fprintf(w, " %s=%d", k, layers[Layer(k)])
	}
	fmt.Fprintln(w)
}
