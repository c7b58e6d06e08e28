package eval

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/calib/agentdojo"
	"github.com/carbd/carbd/pkg/decide"
)

// Cause counts why carbd released attacker values, or withheld or
// modified effects of benign runs, for one suite, tool and cause.
type Cause struct {
	Suite string `json:"suite"`
	Tool  string `json:"tool"`
	Cause string `json:"cause"`
	Steps int    `json:"steps"`
	Runs  int    `json:"runs"`
	// Example is one episode where it happened.
	Example string `json:"example"`
}

// Diagnosis explains carbd's misses and benign losses on a pipeline: every
// episode replayed once with the calibration of split 0's calibration
// half (the split the figures' first split uses).
type Diagnosis struct {
	// Leaks: attacker effects released with an attacker value, in
	// attacked runs.
	Leaks []Cause `json:"leaks"`
	// Losses: effects of benign runs with utility true that carbd refused
	// or modified (a revert), or that a ledger stop cut.
	Losses []Cause `json:"losses"`
	// Details lists every withheld or modified effect of a benign run
	// with utility true, one per step (not in the JSON report; the
	// --losses output of carbd eval agentdojo).
	Details []LossDetail `json:"-"`
}

// LossDetail is one effect of a benign run with utility true that carbd
// withheld or modified: the run, the step, and the decision's reason
// (the field, its value and where carbd saw that value arrive).
type LossDetail struct {
	Pipeline string
	Suite    string
	Episode  string
	Step     int // index of the outgoing step in the run
	Tool     string
	Cause    string // as in Diagnosis.Losses
	Reason   decide.Reason
}

// WriteLosses writes the per-effect losses of the report's pipelines
// as tab-separated lines: pipeline, suite, episode, step, tool, cause,
// field, value, origin, level, clearance, party, token, token origin.
func (r *Report) WriteLosses(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "pipeline\tsuite\tepisode\tstep\ttool\tcause\tfield\tvalue\torigin\tlevel\tclearance\tparty\ttoken\ttoken_origin")
	clean := func(s string) string { return strings.NewReplacer("\t", " ", "\n", " ", "\r", " ").Replace(s) }
	for _, p := range r.Pipelines {
		if p.Diagnosis == nil {
			continue
		}
		for _, d := range p.Diagnosis.Details {
			x := d.Reason
			fmt.Fprintf(bw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.Pipeline, d.Suite, d.Episode, d.Step, d.Tool,
				clean(d.Cause), clean(x.Field), clean(x.Value), clean(x.Origin), x.Level, x.Clearance, clean(x.Party), clean(x.Token), clean(x.TokenFrom))
		}
	}
	return bw.Flush()
}

// diagnose replays every episode under split 0's calibration and counts
// the causes.
func diagnose(ctx context.Context, p *Pipeline, cfg *Config) (*Diagnosis, error) {
	cal, _ := splitSets(p.Episodes, cfg.Seed, 0, cfg.CalFraction)
	calCRC, calLedger := splitCalibration(cal, cfg.LedgerSplit)
	var art *calib.Artifact
	var err error
	if cfg.pool != nil {
		art, err = cfg.pool.get(cfg, cfg.Budgets, 0)
	} else {
		art, err = calibrateCRC(calCRC, cfg.Budgets, cfg.Delta, cfg.Score, cfg.Rule)
	}
	if err != nil {
		return nil, err
	}
	th := &thresholds{cal: art.Engine()}
	ctr := &replayCounters{}
	les := make([]calib.LedgerEpisode, len(calLedger))
	for j, ep := range calLedger {
		o, err := ep.outcomeFor(ctx, th, math.NaN(), ctr)
		if err != nil {
			return nil, err
		}
		les[j] = ep.ledgerEpisode(selGCARB, o)
	}
	lc, err := calib.CalibrateLedger(les, calib.LedgerConfig{Alpha: cfg.LedgerAlpha, Evidence: selectorNames[selGCARB]})
	if err != nil {
		return nil, err
	}
	c := th.cal
	c.HasLedger, c.LedgerLambda = true, lc.Lambda
	leaks, losses := newCounter(), newCounter()
	var details []LossDetail
	for _, ep := range p.Episodes {
		if ep.Kind == agentdojo.Benign && !ep.Utility {
			continue
		}
		e := decide.New(ep.policy, decide.Options{Oracle: decide.Strict{}, Calibration: &c, Revert: true, Now: fixedClock, Ablate: ep.ablate})
		rep := decide.RunTrace(ctx, e, ep.trace)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		o := summarize(ep, rep, e)
		v := fullView(ep, o)
		for t, st := range rep.Steps {
			tool := strings.TrimPrefix(ep.Steps[t].Op, "tool:")
			if tool == "" {
				tool = "(answer)"
			}
			switch {
			case ep.Kind == agentdojo.Attacked && v.harmful(ep, t):
				leaks.add(ep, tool, leakCause(ep, t, o, &st))
			case ep.Kind == agentdojo.Benign && !v.released(t):
				c := lossCause(&st)
				losses.add(ep, tool, c)
				details = append(details, LossDetail{Pipeline: p.Name, Suite: ep.Suite, Episode: ep.ID, Step: t, Tool: tool, Cause: c, Reason: lossReason(&st)})
			case ep.Kind == agentdojo.Benign && v.released(t) && len(st.Final.Reverts) > 0:
				rv := st.Final.Reverts[0]
				c := fmt.Sprintf("released with %s %s reverted to a trusted value", rv.Role, rv.Field)
				losses.add(ep, tool, c)
				details = append(details, LossDetail{Pipeline: p.Name, Suite: ep.Suite, Episode: ep.ID, Step: t, Tool: tool, Cause: c,
					Reason: decide.Reason{Code: decide.CodeCRCReverted, Field: rv.Field, Role: rv.Role, Value: rv.From}})
			}
		}
	}
	return &Diagnosis{Leaks: leaks.list(), Losses: losses.list(), Details: details}, nil
}

// leakCause says how an attacker value got through at step t.
func leakCause(ep *Episode, t int, o *outcome, st *decide.Step) string {
	var parts []string
	for _, fi := range ep.Steps[t].fields {
		f := &ep.Fields[fi]
		if !f.Violated || o.reverted[fi] {
			continue
		}
		switch {
		case !f.Gated:
			parts = append(parts, fmt.Sprintf("%s %s not gated", f.Role, f.Name))
		case f.Derivable:
			parts = append(parts, fmt.Sprintf("%s %s derivable from T", f.Role, f.Name))
		default:
			parts = append(parts, fmt.Sprintf("%s %s scored %.2f, under its threshold", f.Role, f.Name, f.Score))
		}
	}
	how := string(st.Final.Layer) + "/" + st.Final.Reason.Code
	if len(st.Final.Reverts) > 0 {
		how += fmt.Sprintf(" (%s %s reverted)", st.Final.Reverts[0].Role, st.Final.Reverts[0].Field)
	}
	return strings.Join(parts, ", ") + "; released by " + how
}

// lossReason is the reason a benign effect was withheld: the deferral's
// when an oracle or a scope decided.
func lossReason(st *decide.Step) decide.Reason {
	d := st.Final
	if d.Layer == decide.LayerOracle || d.Layer == decide.LayerScope {
		d = st.Decision
	}
	return d.Reason
}

// lossCause says why a benign effect was withheld.
func lossCause(st *decide.Step) string {
	d := st.Final
	if d.Layer == decide.LayerOracle || d.Layer == decide.LayerScope {
		d = st.Decision // the deferral's reason
	}
	r := d.Reason
	if r.Code == decide.CodeOracleRefuse || r.Code == decide.CodeOracleFailed || r.Code == decide.CodeOracleUnanswerd {
		// A blocking effect's reason code is the oracle's; the deferral's
		// details remain.
		switch {
		case r.Field != "" && r.Threshold != 0:
			r.Code = decide.CodeCRCOver
		case r.Field != "":
			r.Code = decide.CodeUntrustedValue
		case r.Clearance != "":
			r.Code = decide.CodeUncleared
		case r.Value != "":
			r.Code = decide.CodeUnknownParty
		}
	}
	switch r.Code {
	case decide.CodeUntrustedValue, decide.CodeCRCOver:
		origin := r.Origin
		if i := strings.IndexByte(origin, '('); i > 0 {
			origin = origin[:i]
		}
		if origin == "" {
			origin = "agent-made"
		}
		return fmt.Sprintf("%s: %s %s from %s", r.Code, r.Role, r.Field, origin)
	case decide.CodeUncleared:
		return fmt.Sprintf("uncleared: %s data to %s", r.Level, partyName(r.Party))
	case decide.CodeLedgerStop, decide.CodeEpisodeStopped:
		return "ledger: " + r.Code
	}
	return r.Code
}

func partyName(p string) string {
	if p == "" {
		return "an unnamed destination"
	}
	return p
}

type causeCounter struct {
	m map[[3]string]*Cause
	// runs counted per key
	seen map[[3]string]map[string]bool
}

func newCounter() *causeCounter {
	return &causeCounter{m: map[[3]string]*Cause{}, seen: map[[3]string]map[string]bool{}}
}

func (c *causeCounter) add(ep *Episode, tool, cause string) {
	k := [3]string{ep.Suite, tool, cause}
	x := c.m[k]
	if x == nil {
		x = &Cause{Suite: ep.Suite, Tool: tool, Cause: cause, Example: ep.ID}
		c.m[k] = x
		c.seen[k] = map[string]bool{}
	}
	x.Steps++
	if !c.seen[k][ep.ID] {
		c.seen[k][ep.ID] = true
		x.Runs++
	}
}

func (c *causeCounter) list() []Cause {
	out := make([]Cause, 0, len(c.m))
	for _, x := range c.m {
		out = append(out, *x)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Runs != out[j].Runs {
			return out[i].Runs > out[j].Runs
		}
		return out[i].Suite+out[i].Tool+out[i].Cause < out[j].Suite+out[j].Tool+out[j].Cause
	})
	return out
}

func writeCauses(w io.Writer, title string, cs []Cause, limit int) error {
	fmt.Fprintf(w, "\n   %s\n", title)
	if len(cs) == 0 {
		fmt.Fprintln(w, "     none")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "     runs\tsteps\tsuite\ttool\tcause\texample")
	for i, c := range cs {
		if i == limit {
			fmt.Fprintf(tw, "     ...\t\t\t\t%d more causes\t\n", len(cs)-limit)
			break
		}
		fmt.Fprintf(tw, "     %d\t%d\t%s\t%s\t%s\t%s\n", c.Runs, c.Steps, c.Suite, c.Tool, c.Cause, c.Example)
	}
	return tw.Flush()
}
