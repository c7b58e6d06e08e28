package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/nfq"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// Status implements Operator. It never waits for the engine: see
// engineView.
func (d *daemon) Status() SandboxStatus {
	s := SandboxStatus{Version: StatusVersion, ID: d.cfg.ID, Backend: d.cfg.Backend, Workdir: d.cfg.Workdir,
		Started: d.started, Task: d.cfg.Task, Policy: d.cfg.PolicyPath, Oracle: d.cfg.Oracle.Name(), State: "running"}
	if d.sandbox != nil {
		s.Pid = d.sandbox.Pid()
	}
	d.mu.Lock()
	if d.exiting {
		s.State = "exiting"
	}
	d.mu.Unlock()
	v, current := d.engineView()
	s.EngineBusy = !current
	s.DecisionsAsOf = v.at
	st := v.stats
	s.Decisions = DecisionCounts{Proposed: st.Proposed, Released: st.Released, Refused: st.Refused, Deferred: st.Deferred,
		Scopes: st.Scopes, Committed: st.Committed, Aborted: st.Aborted}
	if a := d.cfg.Calibration; a != nil && a.Ledger != nil {
		s.Ledger = &LedgerStatus{Score: v.score, Lambda: a.Ledger.Lambda, Stopped: v.stopped}
	}
	if v.stopped {
		s.State = "stopped"
	}
	if cf := d.sup.Err(); cf != nil {
		s.State = "failed"
		s.Failure = &FailureStatus{Component: cf.Component, Error: cf.Err.Error(), At: cf.At}
	}
	if a := d.cfg.Calibration; a != nil {
		for role, name := range a.RoleStratum {
			if st := a.Stratum(name); st != nil {
				s.Roles = append(s.Roles, RoleStatus{Role: role.String(), Stratum: name, Threshold: st.Threshold,
					Alpha: st.Alpha, CPUpper: st.CPUpper, Certifiable: st.Certifiable})
			}
		}
		sort.Slice(s.Roles, func(i, j int) bool { return s.Roles[i].Role < s.Roles[j].Role })
	}
	s.Held = d.Held()
	if s.Held == nil {
		s.Held = []HeldEffect{}
	}
	for _, h := range s.Held {
		if h.Scope == 0 {
			continue
		}
		if s.Scope == nil || h.Scope > s.Scope.ID {
			s.Scope = &ScopeStatus{ID: h.Scope}
		}
	}
	if s.Scope != nil {
		for _, h := range s.Held {
			if h.Scope == s.Scope.ID {
				s.Scope.Held = append(s.Scope.Held, h)
			}
		}
	}
	if d.net != nil {
		if d.net.dp != nil {
			if c, err := d.net.dp.Counters(); err == nil {
				s.Datapath = map[string]uint64{}
				for r := tcx.Reason(0); r < tcx.NumReasons; r++ {
					s.Datapath[r.String()] = c[r].Packets
				}
			}
			s.Kernel.TC = d.net.dp.Mode().String()
		}
		s.Kernel.Netfilter = d.net.backend.String()
		if d.net.loop != nil {
			ls := d.net.loop.Stats()
			s.Queue = QueueCounters{Queued: ls.Received, Accepted: ls.Accepted(), Dropped: ls.Dropped(), Held: uint64(max(ls.Held, 0)),
				KernelDropped: uint64(ls.Kernel.Dropped), SocketDropped: uint64(ls.Kernel.UserDropped) + ls.RecvOverruns,
				Verdicts: map[string]uint64{}}
			for r := nfq.Reason(0); r < nfq.NumReasons; r++ {
				s.Queue.Verdicts[r.String()] = ls.Verdicts[r]
			}
		}
	}
	if d.files != nil {
		s.Files = d.files.counters()
		s.Kernel.Tracing = d.files.mechanism()
		s.Kernel.Overlay = "overlayfs (frozen base, staged upper)"
	}
	return s
}

// engineView is the part of the status that comes from the engine. The
// engine keeps its lock while it asks the oracle about deferred effects,
// and the operator oracle may take minutes: the operator socket (and the
// metrics) must answer meanwhile, or nobody could see what waits for an
// answer. So the view is refreshed in the background, one refresh at a
// time, and a status waits for it at most viewWait; past that it shows
// the latest complete view, marked as such (engine_busy).
type engineView struct {
	at      time.Time
	stats   decide.Stats
	score   float64
	stopped bool
}

const (
	// viewWait is how long a status waits for a refresh.
	viewWait = 250 * time.Millisecond
	// viewMaxAge: the background refresher reads the engine at most this
	// often, so the view is close to current when the engine blocks on
	// the oracle, at a bounded cost on a busy sandbox.
	viewMaxAge = 50 * time.Millisecond
)

// kickView notes that a decision was recorded: a background refresher
// reads the engine after it, at most every viewMaxAge, so the view lags
// the last decision by at most that. It never waits.
func (d *daemon) kickView() {
	d.viewMu.Lock()
	d.viewDirty = true
	start := !d.refresher
	d.refresher = true
	d.viewMu.Unlock()
	if start {
		go d.refreshLoop()
	}
}

func (d *daemon) refreshLoop() {
	for {
		d.viewMu.Lock()
		if !d.viewDirty {
			d.refresher = false
			d.viewMu.Unlock()
			return
		}
		d.viewDirty = false
		d.viewMu.Unlock()
		<-d.refreshView()
		time.Sleep(viewMaxAge)
	}
}

// refreshView starts a refresh of the engine view unless one is in
// flight, and returns the channel closed when it is done.
func (d *daemon) refreshView() <-chan struct{} {
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	if d.viewDone != nil {
		return d.viewDone
	}
	done := make(chan struct{})
	d.viewDone = done
	go func() {
		e := d.engine
		v := engineView{stats: e.Stats()}
		v.score, _, _ = e.LedgerScore()
		_, v.stopped = e.Stopped()
		v.at = time.Now()
		d.viewMu.Lock()
		d.view = v
		d.viewDone = nil
		d.viewMu.Unlock()
		close(done)
	}()
	return done
}

// engineView returns the engine's state, and whether it is current
// (false: the engine is busy and this is the latest view).
func (d *daemon) engineView() (engineView, bool) {
	done := d.refreshView()
	current := true
	t := time.NewTimer(viewWait)
	select {
	case <-done:
	case <-t.C:
		current = false
	}
	t.Stop()
	d.viewMu.Lock()
	defer d.viewMu.Unlock()
	return d.view, current
}

// Held implements Operator: the effects held in the open scope and those
// waiting for the operator's answer (a deferred blocking effect waits
// outside any scope), marked pending when the operator is asked about
// them. It reads the daemon's own record of decisions, never the engine
// (which is busy while the oracle is asked).
func (d *daemon) Held() []HeldEffect {
	now := time.Now()
	pending := map[uint64]decide.Pending{}
	if d.cfg.Operator != nil {
		for _, p := range d.cfg.Operator.Pending() {
			pending[p.ID] = p
		}
	}
	var out []HeldEffect
	d.mu.Lock()
	for _, h := range d.held {
		he := heldEffect(*h, now)
		if p, ok := pending[h.Seq]; ok {
			he.Pending, he.Deadline = true, p.Deadline
			delete(pending, h.Seq)
		}
		out = append(out, he)
	}
	d.mu.Unlock()
	for id, p := range pending {
		// Asked inside its own decision: only a blocking effect is.
		op, obj := splitSummary(p.Summary)
		out = append(out, HeldEffect{ID: id, Since: p.Asked, AgeMillis: now.Sub(p.Asked).Milliseconds(), Kind: decide.Blocking.String(),
			Op: op, Obj: obj, Summary: p.Summary, Justification: p.Reason, Deadline: p.Deadline, Pending: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func heldEffect(h decide.Decision, now time.Time) HeldEffect {
	he := HeldEffect{ID: h.Seq, Scope: h.Scope, Kind: h.Kind.String(), Reason: h.Reason.Code, Justification: h.Justification}
	if ev := h.Event; ev != nil {
		he.Since, he.Op, he.Obj, he.Summary = ev.Time, ev.Op, ev.Obj, ev.Summary()
		he.AgeMillis = now.Sub(ev.Time).Milliseconds()
	}
	return he
}

// splitSummary takes the operation and the object out of an event's
// one-line summary ("net out http:GET http://host/path field[role]=...").
func splitSummary(s string) (op, obj string) {
	f := strings.SplitN(s, " ", 5)
	if len(f) >= 4 && strings.Contains(f[2], ":") {
		return f[2], f[3]
	}
	return "", s
}

// Answer implements Operator: approve or deny a pending effect (and the
// effects asking the same question), for the run with forRun.
func (d *daemon) Answer(id uint64, release bool, justification, by string, forRun bool) error {
	if d.cfg.Operator == nil {
		return errors.New("this sandbox's oracle is " + d.cfg.Oracle.Name() + ", not the operator: nothing waits for an answer")
	}
	v := decide.Refuse
	if release {
		v = decide.Release
	}
	if err := d.cfg.Operator.AnswerWith(decide.Answer{ID: id, Verdict: v, Justification: justification, By: by, ForRun: forRun}); err != nil {
		if errors.Is(err, decide.ErrWithdrawn) {
			return err // names the question
		}
		return fmt.Errorf("effect %d: %w", id, err)
	}
	return nil
}

// maxWithdrawnShown bounds the withdrawn questions a held request lists.
const maxWithdrawnShown = 64

// Withdrawn implements Operator: the questions withdrawn most recently
// (their clients are gone), oldest first.
func (d *daemon) Withdrawn() []decide.Withdrawn {
	if d.cfg.Operator == nil {
		return nil
	}
	w := d.cfg.Operator.Withdrawals(time.Time{})
	if len(w) > maxWithdrawnShown {
		w = w[len(w)-maxWithdrawnShown:]
	}
	return w
}

// clientGone is told by the verdict loop that nobody waits for the held
// effect seq any more (its client reset or closed the connection, or
// stopped retransmitting): the operator's question about it is
// withdrawn once no other effect waits on it, and the effect is refused
// (as withdrawn) when its scope resolves. Nothing is released.
func (d *daemon) clientGone(seq uint64, reason string) {
	if d.cfg.Operator != nil {
		d.cfg.Operator.Withdraw(seq, reason)
	}
}

// sandboxExited withdraws what only the sandbox's processes waited for:
// a network effect being decided or held has no client any more. A
// staged file change has no client: its question stays (the change is
// committed or not when the run ends).
func (d *daemon) sandboxExited() {
	const why = "the sandbox exited"
	d.exitedCancel(fmt.Errorf("%w: %s", decide.ErrClientGone, why))
	if d.cfg.Operator == nil {
		return
	}
	var gone []uint64
	d.mu.Lock()
	for seq, h := range d.held {
		if h.Event != nil && h.Event.Ch == decide.ChanNet {
			gone = append(gone, seq)
		}
	}
	d.mu.Unlock()
	for _, seq := range gone {
		d.cfg.Operator.Withdraw(seq, why)
	}
}

// AuditPcap implements Operator.
func (d *daemon) AuditPcap(w io.Writer) error {
	if d.net == nil {
		return errors.New("no network channel")
	}
	return d.net.writePcap(w)
}

// coveringOracle is the configured oracle, except that it answers itself
// the questions an earlier approval of the same bytes covers: a held
// staging decision of a file whose staged content its image proved to be
// exactly what the path's writes produced, writes the oracle released
// for the same reasons (fileChannel.cover). Such a file is asked about
// once, not again at its commit point. Everything else is asked as
// before; an error of the oracle refuses everything it was asked with,
// as the engine does for any error.
type coveringOracle struct {
	decide.Oracle
	d *daemon
}

func (o coveringOracle) Decide(ctx context.Context, v *decide.View) ([]decide.OracleAnswer, error) {
	var out []decide.OracleAnswer
	rest := *v
	rest.Deferred = nil
	for _, e := range v.Deferred {
		if why, ok := o.d.files.takeCovered(e.Seq); ok {
			out = append(out, decide.OracleAnswer{Seq: e.Seq, Verdict: decide.Release, Justification: why})
			continue
		}
		rest.Deferred = append(rest.Deferred, e)
	}
	if len(out) > 0 {
		o.d.log.Info("file commit covered by an earlier approval: not asked again", "covered", len(out), "asked", len(rest.Deferred))
	}
	if len(rest.Deferred) == 0 {
		return out, nil
	}
	answers, err := o.Oracle.Decide(ctx, &rest)
	return append(out, answers...), err
}
