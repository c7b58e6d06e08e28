package decide

import (
	"context"
	"fmt"
	"strings"

	"github.com/carbd/carbd/pkg/decide/ledger"
)

func (e *Engine) ledgerOn() bool {
	return e.opt.Calibration != nil && e.opt.Calibration.HasLedger
}

// graphOn reports whether the dependency graph is kept and proposals are
// scored: with a calibrated ledger, or when Options.Ledger asks for it.
func (e *Engine) graphOn() bool { return e.opt.Ledger || e.ledgerOn() }

// LedgerGraph returns the engine's G-CARB dependency graph, or nil when
// none is kept (no calibrated ledger and Options.Ledger unset). Node i is
// the i-th event the engine saw (observed or proposed) until the ledger
// stopped the episode. The graph is shared, not copied: read it only
// while no other goroutine uses the engine (e.g. after RunTrace), and do
// not modify it.
func (e *Engine) LedgerGraph() *ledger.Graph {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.graphOn() {
		return nil
	}
	return &e.graph
}

// LedgerScore returns the gate score of the latest proposal and the
// calibrated stop threshold (ok is false when no ledger is calibrated).
func (e *Engine) LedgerScore() (score, lambda float64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.ledgerOn() {
		return 0, 0, false
	}
	return e.lastGate, e.opt.Calibration.LedgerLambda, true
}

// Stopped reports whether the ledger gate stopped the episode, and the
// decision that stopped it.
func (e *Engine) Stopped() (Decision, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped == nil {
		return Decision{}, false
	}
	return *e.stopped, true
}

// LedgerNode describes an outgoing effect to the G-CARB scorer: whether it
// reads a private source (its operation or object is a sensitive source),
// whether it is an external sink (net effects to non-internal parties;
// tool operations only when the policy marks them external), and the
// policy's financial / irreversible / message flags.
func LedgerNode(p *Policy, ev *Event, spec *OpSpec) ledger.Node {
	n := ledger.Node{Proposal: true, Financial: spec.Financial, Irreversible: spec.Irreversible, Message: spec.Message}
	probe := Event{Ch: ev.Ch, Dir: In, Obj: ev.Obj, Dest: ev.Dest}
	if p.SourceLabel(&probe).Level > 0 {
		n.Private = true
	} else if ev.Op != "" {
		probe.Obj = ev.Op
		n.Private = p.SourceLabel(&probe).Level > 0
	}
	switch {
	case spec.External:
		n.Sink = true
	case ev.Ch == ChanNet && !strings.HasPrefix(ev.Op, "tool:"):
		_, internal := p.InternalChannel(ev)
		n.Sink = !internal
	}
	return n
}

// ledgerGateLocked is step 6: the proposal joins the dependency graph, is
// scored by the frozen Table 1 scorer on its dependency-selected evidence,
// and stops the episode when the score reaches λ̂. A stop refuses the
// proposal, aborts the open scope without asking the oracle, and refuses
// every later effect.
func (e *Engine) ledgerGateLocked(ctx context.Context, p *Policy, ev *Event, d *Decision) ([]Resolution, bool) {
	spec := e.opSpec(p, ev.Op)
	node := LedgerNode(p, ev, spec)
	texts := make([]string, 0, len(ev.Fields)+2)
	texts = append(texts, ev.Obj, ev.Content)
	for _, f := range ev.Fields {
		texts = append(texts, f.Value)
	}
	i := e.graph.Add(node, texts...)
	evidence, path := ledger.Dependency{}.Select(&e.graph, i)
	s := ledger.Table1.Score(node, path)
	e.lastGate = s
	d.Gate = s
	if !e.ledgerOn() {
		return nil, false // scored for the record only (Options.Ledger)
	}
	lambda := e.opt.Calibration.LedgerLambda
	if d.Verdict == Refuse || !ledger.Stops(s, lambda) {
		return nil, false
	}
	d.Verdict, d.Layer = Refuse, LayerLedger
	d.Reason = Reason{Code: CodeLedgerStop, Score: s, Threshold: lambda}
	chain := "no private-source path"
	if path {
		chain = fmt.Sprintf("a private-source path through %d earlier events", len(evidence))
	}
	d.Justification = fmt.Sprintf("ledger gate score %.2f reached the calibrated stop threshold %.2f (%s): the episode is stopped", s, lambda, chain)
	stop := *d
	e.stopped = &stop
	for e.resolving {
		e.idle.Wait()
	}
	if e.scope == nil {
		return nil, true
	}
	sc := e.scope
	r := Resolution{Scope: sc.id, Trigger: "ledger stop at #" + fmt.Sprint(d.Seq), Time: e.opt.Now()}
	for _, h := range sc.held {
		fd := *h
		fd.Verdict, fd.Layer = Refuse, LayerLedger
		fd.Reason = Reason{Code: CodeEpisodeStopped}
		fd.Justification = "the episode was stopped by the ledger gate at #" + fmt.Sprint(d.Seq)
		r.Effects = append(r.Effects, fd)
		e.count(Refuse)
		e.audit.decision(r.Time, &fd, sc.id)
	}
	e.trusted.Truncate(sc.tLen)
	r.Notice = AbortNotice(r.Refused())
	e.stats.Aborted++
	e.audit.resolution(&r)
	// No resolution is under way (waited for above), so no next scope.
	e.scope = nil
	return []Resolution{r}, true
}
