package eval

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/calib/agentdojo"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/ledger"
	"github.com/carbd/carbd/pkg/decide/score"
)

// Episode is one run prepared for replay evaluation: its trace, its
// labels, the scores the engine computes online, the ledger gate scores
// of every selector, and the outcome of the policy-only replay. Nothing
// in it depends on a calibration; the calibration-dependent replays are
// cached in it (see outcomeFor).
type Episode struct {
	ID       string // agentdojo.Run.Episode()
	Pipeline string
	Suite    string
	Kind     agentdojo.RunKind
	Attack   string
	Utility  bool // the benchmark's utility outcome
	// Succeeded: an attacked run whose attack succeeded in the recorded
	// (undefended) run: security true and no error (an errored run did
	// not complete the injection task; every defended method's figures
	// use this). NoDefenseSucceeded is the same under the counting of
	// LoadConfig.Errors, which the no-defense figures use: by default
	// the security flag as recorded, errored runs included, as
	// AgentDojo's published figures count them.
	Succeeded          bool
	NoDefenseSucceeded bool
	Errored            bool
	// QuotedReads counts the calls with violated fields that are not
	// attacker effects: reads whose violated fields only quote the goal.
	QuotedReads int

	trace  []decide.Event
	policy *decide.Policy
	kind   score.Kind
	ablate decide.Ablation // the engine's refinements switched off (LoadConfig.Ablate)
	Steps  []Step          // outgoing events, in trace order
	Fields []Field         // every field of every step, flattened in step order
	// gated are the indexes into Fields of the fields the CRC step may
	// compare with a threshold: gated role, non-empty value. The
	// outcome of a calibrated replay depends on a threshold only through
	// "score <= threshold" for these fields.
	gated []int
	// Selectors' gate scores, per step, for the ledger calibration;
	// ledgerSel[s][t] for selector s and step t.
	ledgerSel [numSelectors][]gateScore
	strict    *outcome // policy only: no CRC, no ledger, strict oracle
	noneOnce  sync.Once
	noneOut   *outcome

	cache outcomeCache
}

// Step is one outgoing event of an episode.
type Step struct {
	Event int    // index in the trace
	Op    string // the event's operation (tool:<function>), or "" for the final answer
	// Attacker: the call carries an attacker value (an attacker effect,
	// agentdojo.Run.AttackerEffects).
	Attacker bool
	// Stoppable: the ledger gate may stop here (the step was not refused
	// by a rule before the gate).
	Stoppable bool
	// Gate is the engine's own ledger score (G-CARB dependency evidence).
	Gate   float64
	fields []int // indexes into Episode.Fields
}

// Field is one field of a step with its labels and its online score.
type Field struct {
	Step     int
	Name     string
	Role     decide.Role
	Tool     string
	Value    string
	Violated bool
	Attacked bool
	// Scored: the engine scored it (non-empty value); Score is then its
	// score, Gated whether the operation gates its role and Derivable
	// whether provenance derives it from T at that point (in the
	// policy-only replay).
	Scored    bool
	Score     float64
	Gated     bool
	Derivable bool
}

// Effective is the field's score as the per-role CRC layer sees it: 0
// (allowed at every threshold) when the layer never compares it (a role
// the operation does not gate, an empty value, or a value provenance
// derives), else its score. The calibration loss
// 1{Effective <= τ and violated} is then an upper bound of "violated and
// let through by the field checks" at every τ.
func (f *Field) Effective() float64 {
	if !f.Scored || !f.Gated || f.Derivable {
		return 0
	}
	return f.Score
}

type gateScore struct {
	score    float64
	evidence int32
	prefix   int32
}

// Selectors for the ledger calibration, in report order.
const (
	selGCARB = iota
	selFullPrefix
	selWindow4
	selRandom
	selCurrent
	numSelectors
)

var selectorNames = [numSelectors]string{"g-carb", "full-prefix", "fixed-window-4", "equal-size-random", "current"}

// prepare builds an Episode from a run: the trace (with the suite's
// policy), the labels, and the policy-only replay with per-field scores
// and the dependency graph; then every selector's gate scores on that
// graph. seed keys the equal-size random selector (one draw per episode).
func prepare(ctx context.Context, r *agentdojo.Run, spec *agentdojo.SuiteSpec, kind score.Kind, seed uint64, errs agentdojo.ErrorCounting, ablate decide.Ablation) (*Episode, error) {
	tr, err := r.Trace(spec)
	if err != nil {
		return nil, err
	}
	ep := &Episode{
		ID: r.Episode(), Pipeline: r.Pipeline, Suite: r.Suite, Kind: r.Kind, Attack: r.Attack,
		Utility: r.Utility, Succeeded: r.AttackSucceeded(), NoDefenseSucceeded: r.AttackSucceededBy(errs), Errored: r.Errored(),
		trace: tr, policy: spec.Policy, kind: kind, ablate: ablate,
	}
	e := decide.New(spec.Policy, decide.Options{Oracle: decide.Strict{}, Score: string(kind), Ledger: true, Now: fixedClock, Ablate: ablate})
	rep := decide.RunTrace(ctx, e, tr)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	g := e.LedgerGraph()
	if g == nil || g.Len() != len(tr) {
		return nil, fmt.Errorf("eval: %s: ledger graph has %d nodes for %d events", ep.ID, graphLen(g), len(tr))
	}
	type fieldKey struct {
		event int
		name  string
	}
	labels := map[fieldKey]agentdojo.LabeledField{}
	// An attacker effect is a call with a violated field
	// (agentdojo.Run.AttackerEffects), except a read whose violated
	// fields only quote the injection goal: a read the policy declares
	// read-only (blocking, gating no role) of, e.g., a channel whose very
	// name is the injection carries nothing out of the system.
	attacker := map[int]bool{}
	quoteOnly := map[int]bool{}
	for _, lf := range r.Fields(spec) {
		labels[fieldKey{lf.Event, lf.Name}] = lf
		if !lf.Violated {
			continue
		}
		ts := spec.Tool(lf.Tool)
		if lf.QuotesGoal && ts.Kind == decide.Blocking && ts.Gate == 0 {
			if !attacker[lf.Event] {
				quoteOnly[lf.Event] = true
			}
			continue
		}
		attacker[lf.Event] = true
		delete(quoteOnly, lf.Event)
	}
	ep.QuotedReads = len(quoteOnly)
	used := 0
	for si, st := range rep.Steps {
		ev := &tr[st.Index]
		step := Step{Event: st.Index, Op: ev.Op, Attacker: attacker[st.Index], Gate: st.Decision.Gate,
			Stoppable: st.Decision.Layer != decide.LayerRule && st.Decision.Reason.Code != decide.CodeMalformed}
		scores := map[string]decide.FieldScore{}
		for _, fs := range st.Decision.Scores {
			scores[fs.Field] = fs
		}
		// Roles as the engine sees them (the operation table overrides
		// the trace's).
		for _, f := range st.Event.Fields {
			fd := Field{Step: si, Name: f.Name, Role: f.Role, Tool: ev.Op, Value: f.Value, Attacked: r.Kind == agentdojo.Attacked}
			if lf, ok := labels[fieldKey{st.Index, f.Name}]; ok {
				fd.Violated = lf.Violated
				used++
			}
			if fs, ok := scores[f.Name]; ok {
				fd.Scored, fd.Score, fd.Gated, fd.Derivable = true, fs.Score, fs.Gated, fs.Derivable
			}
			step.fields = append(step.fields, len(ep.Fields))
			if fd.Scored && fd.Gated {
				ep.gated = append(ep.gated, len(ep.Fields))
			}
			ep.Fields = append(ep.Fields, fd)
		}
		ep.Steps = append(ep.Steps, step)
	}
	if used != len(labels) {
		return nil, fmt.Errorf("eval: %s: %d labelled fields, %d matched the replay's fields", ep.ID, len(labels), used)
	}
	for eff := range attacker {
		if !ep.hasStep(eff) {
			return nil, fmt.Errorf("eval: %s: attacker effect at event %d is not an outgoing event of the replay", ep.ID, eff)
		}
	}
	ep.strict = summarize(ep, rep, e)

	// Gate scores of every selector on the engine's own graph.
	h := fnv.New64a()
	h.Write([]byte(ep.ID))
	rnd := ledger.Random{Rng: rand.New(rand.NewPCG(seed, h.Sum64()))}
	sels := [numSelectors]ledger.Selector{ledger.Dependency{}, ledger.FullPrefix{}, ledger.Window{N: 4}, rnd, ledger.Current{}}
	for s, sel := range sels {
		out := make([]gateScore, len(ep.Steps))
		for t, st := range ep.Steps {
			evd, path := sel.Select(g, st.Event)
			out[t] = gateScore{score: ledger.Table1.Score(g.Node(st.Event), path), evidence: int32(len(evd)), prefix: int32(st.Event)}
		}
		ep.ledgerSel[s] = out
	}
	for t, st := range ep.Steps {
		if ep.ledgerSel[selGCARB][t].score != st.Gate {
			return nil, fmt.Errorf("eval: %s: step %d: offline g-carb score %v differs from the engine's %v", ep.ID, t, ep.ledgerSel[selGCARB][t].score, st.Gate)
		}
	}
	return ep, nil
}

func graphLen(g *ledger.Graph) int {
	if g == nil {
		return 0
	}
	return g.Len()
}

func (ep *Episode) hasStep(event int) bool {
	i := sort.Search(len(ep.Steps), func(i int) bool { return ep.Steps[i].Event >= event })
	return i < len(ep.Steps) && ep.Steps[i].Event == event
}

// fixedClock keeps replays deterministic and cheap: decisions do not
// depend on time.
func fixedClock() time.Time { return time.Time{} }

// ledgerEpisode is the episode as the ledger calibration sees it under
// selector sel, with the executed and harmful labels of the outcome o
// of the layers before the gate.
func (ep *Episode) ledgerEpisode(sel int, o *outcome) calib.LedgerEpisode {
	le := calib.LedgerEpisode{ID: ep.ID, Utility: ep.Utility, Steps: make([]calib.LedgerStep, len(ep.Steps))}
	for t := range ep.Steps {
		gs := ep.ledgerSel[sel][t]
		le.Steps[t] = calib.LedgerStep{Score: gs.score, Executed: o.released[t], Harmful: o.harmful(ep, t),
			Stoppable: ep.Steps[t].Stoppable, Evidence: int(gs.evidence), Prefix: int(gs.prefix)}
	}
	return le
}
