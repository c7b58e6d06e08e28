package daemon

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// Status implements Operator.
func (d *daemon) Status() SandboxStatus {
	now := time.Now()
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
	st := d.engine.Stats()
	s.Decisions = DecisionCounts{Proposed: st.Proposed, Released: st.Released, Refused: st.Refused, Deferred: st.Deferred,
		Scopes: st.Scopes, Committed: st.Committed, Aborted: st.Aborted}
	if score, lambda, ok := d.engine.LedgerScore(); ok {
		_, stopped := d.engine.Stopped()
		s.Ledger = &LedgerStatus{Score: score, Lambda: lambda, Stopped: stopped}
		if stopped {
			s.State = "stopped"
		}
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
	if id := d.engine.ScopeOpen(); id != 0 {
		s.Scope = &ScopeStatus{ID: id, Held: d.Held()}
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
				KernelDropped: uint64(ls.Kernel.Dropped), SocketDropped: uint64(ls.Kernel.UserDropped) + ls.RecvOverruns}
		}
	}
	if d.files != nil {
		s.Files = d.files.counters()
		s.Kernel.Tracing = d.files.mechanism()
		s.Kernel.Overlay = "overlayfs (frozen base, staged upper)"
	}
	_ = now
	return s
}

// Held implements Operator: the effects held in the open scope, marked
// pending when the operator oracle waits for an answer about them.
func (d *daemon) Held() []HeldEffect {
	now := time.Now()
	pending := map[uint64]decide.Pending{}
	if d.cfg.Operator != nil {
		for _, p := range d.cfg.Operator.Pending() {
			pending[p.ID] = p
		}
	}
	var out []HeldEffect
	seen := map[uint64]bool{}
	for _, h := range d.engine.Held() {
		he := heldEffect(h, now)
		if p, ok := pending[h.Seq]; ok {
			he.Pending, he.Deadline = true, p.Deadline
		}
		seen[h.Seq] = true
		out = append(out, he)
	}
	// A deferred blocking effect waits for the operator outside any scope.
	for id, p := range pending {
		if seen[id] {
			continue
		}
		out = append(out, HeldEffect{ID: id, Since: p.Asked, AgeMillis: now.Sub(p.Asked).Milliseconds(), Kind: "blocking",
			Op: p.Summary, Reason: p.Reason, Justification: p.Reason, Deadline: p.Deadline, Pending: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func heldEffect(h decide.Decision, now time.Time) HeldEffect {
	he := HeldEffect{ID: h.Seq, Kind: h.Kind.String(), Reason: h.Reason.Code, Justification: h.Justification}
	if ev := h.Event; ev != nil {
		he.Since, he.Op, he.Obj = ev.Time, ev.Op, ev.Obj
		he.AgeMillis = now.Sub(ev.Time).Milliseconds()
	}
	return he
}

// Answer implements Operator: approve or deny a pending effect.
func (d *daemon) Answer(id uint64, release bool, justification string) error {
	if d.cfg.Operator == nil {
		return errors.New("this sandbox's oracle is " + d.cfg.Oracle.Name() + ", not the operator: nothing waits for an answer")
	}
	v := decide.Refuse
	if release {
		v = decide.Release
	}
	if justification == "" {
		justification = "by the operator"
	}
	if err := d.cfg.Operator.Answer(id, v, justification); err != nil {
		return fmt.Errorf("effect %d: %w", id, err)
	}
	return nil
}

// AuditPcap implements Operator.
func (d *daemon) AuditPcap(w io.Writer) error {
	if d.net == nil {
		return errors.New("no network channel")
	}
	return d.net.writePcap(w)
}
