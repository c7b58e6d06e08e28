package nfq

import (
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// Re-checking flows released to their end (Config.Recheck).
//
// A flow whose content the loop does not see (an opaque stream, TLS not
// intercepted, QUIC) is released to its end on a decision that took it
// to carry everything the agent had read. The fast path stamps such a
// release with the read generation, which the file tracer's BPF program
// moves after every read of the working tree (bpf/include/carbd/
// read_gen.h); once it moved, the flow's next packet with data comes to
// the loop (tcx.QueueRead) instead of passing. The loop holds it, with
// whatever of the flow follows, and asks the Decider (Meta.Recheck),
// which brings what the agent read up to date and answers Release (what
// the agent has read is what the release was decided on: the flow is
// released again at the generation read before the question) or Refuse
// (it read more: the flow is decided again, as after RevokeOpen).
//
// The generation is read before the decision or question is submitted,
// so before the Decider brings the tracer up to date: every read the
// stamp counts has been seen by the decision (the tracer moves the
// generation after the read's record is in its ring buffer). A read the
// decision saw but the stamp does not count costs one more question.

// genDatapath is a Datapath with read generations (tcx.Datapath).
type genDatapath interface {
	Generation() (uint64, error)
	ReleaseFlowAt(k tcx.FlowKey, gen uint64) error
}

// genStamp is the read generation an effect was decided at.
type genStamp struct {
	set bool   // read (Config.Recheck on a Datapath with generations)
	ok  bool   // gen could be read; if not, the release is asked about at its next data
	gen uint64 // the generation
}

// gens returns the Datapath's read generations when flows released to
// their end are re-checked, or nil.
func (c *core) gens() genDatapath {
	if !c.cfg.Recheck || c.dp == nil {
		return nil
	}
	g, _ := c.dp.(genDatapath)
	return g
}

// readStamp reads the generation for an effect that may release its flow
// to its end, before the effect is decided.
func (w *worker) readStamp(e *effect) {
	if !(e.tcp && (e.span == netparse.SpanOpen || e.span == netparse.SpanFlow)) && !e.flowVerdict {
		return
	}
	g := w.c.gens()
	if g == nil {
		return
	}
	gen, err := g.Generation()
	e.stamp = genStamp{set: true, ok: err == nil, gen: gen}
}

// readSince reports whether a packet of f, released to its end, must be
// asked about: it carries data and the read generation is no longer the
// one f was released at (or cannot be read: fail closed).
func (w *worker) readSince(f *flowState, data bool) bool {
	if !data || !f.open || f.redecide || f.openEv == nil || !f.stamp.set {
		return false
	}
	g := w.c.gens()
	if g == nil {
		return false
	}
	gen, err := g.Generation()
	return err != nil || !f.stamp.ok || gen != f.stamp.gen
}

// releaseOpen writes f's release to its end to the fast path: at its
// stamp's generation when it has one.
func (w *worker) releaseOpen(f *flowState) {
	if w.c.dp == nil {
		return
	}
	if g := w.c.gens(); g != nil && f.stamp.set {
		gen := f.stamp.gen
		if !f.stamp.ok {
			gen = ^uint64(0) // never the current one: the next data is asked about
		}
		w.c.dpErr("release-flow", f.key, g.ReleaseFlowAt(f.key, gen))
		return
	}
	if f.udp {
		w.c.dpErr("release", f.key, w.c.dp.Release(f.key, 0))
		return
	}
	w.c.dpErr("release-flow", f.key, w.c.dp.ReleaseFlow(f.key))
}

// startRecheck holds a TCP flow released to its end (its packet p is
// held) and asks whether its release still stands.
func (w *worker) startRecheck(f *flowState, p *packet) {
	f.open = false // held packets wait for the answer (settle)
	m := Meta{Flow: f.key, Kind: netparse.KindTCPOpaque, Span: netparse.SpanOpen, Seq: p.seq, Time: p.time, Local: p.local, Redecide: true}
	e := &effect{flow: f, tcp: true, span: netparse.SpanOpen, seq: p.seq, ev: f.openEv}
	f.pending = append(f.pending, e)
	w.holding[f] = struct{}{}
	w.submit(e, asRecheck(e, m))
}

// asRecheck makes e a question about its flow's release; m is the Meta
// it is decided with if the answer is no.
func asRecheck(e *effect, m Meta) Meta {
	e.recheck = &m
	q := m
	q.Recheck = true
	return q
}

// recheckFailed: the release of e's flow does not stand any more (the
// agent read more, or the question could not be answered): the flow is
// decided again, e in its place (in stream or arrival order).
func (w *worker) recheckFailed(e *effect) {
	m := *e.recheck
	e.recheck = nil
	w.forgetEffect(e)
	if f := e.flow; f != nil {
		f.open = false
		if w.c.dp != nil {
			w.c.dpErr("forget", f.key, w.c.dp.Forget(f.key))
		}
	}
	ev := *e.ev
	if e.tcp {
		ev.Time = m.Time
	}
	e.ev = &ev
	w.submit(e, m)
}
