package daemon

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// StatusVersion is the version of the status JSON; fields are only ever
// added within a version (docs/status.md).
const StatusVersion = 1

// SandboxStatus is what `carbd status --json` prints for one sandbox.
type SandboxStatus struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Backend string    `json:"backend"`
	Pid     int       `json:"pid"`
	Workdir string    `json:"workdir"`
	Started time.Time `json:"started"`
	Task    string    `json:"task"`
	Policy  string    `json:"policy"`
	Oracle  string    `json:"oracle"`
	State   string    `json:"state"` // running, stopped (ledger), exiting, failed
	// Failure is the component whose failure is ending the run (state
	// failed); absent otherwise.
	Failure *FailureStatus `json:"failure,omitempty"`
	// Held lists every effect waiting: in the open scope, or (a deferred
	// blocking request) for the operator's answer.
	Held  []HeldEffect `json:"held"`
	Scope *ScopeStatus `json:"scope,omitempty"`
	// EngineBusy: the engine is waiting for the oracle, so Decisions,
	// Ledger and State are as of DecisionsAsOf (Held is always current).
	EngineBusy    bool              `json:"engine_busy"`
	DecisionsAsOf time.Time         `json:"decisions_as_of"`
	Ledger        *LedgerStatus     `json:"ledger,omitempty"`
	Roles         []RoleStatus      `json:"roles,omitempty"`
	Decisions     DecisionCounts    `json:"decisions"`
	Datapath      map[string]uint64 `json:"datapath,omitempty"` // TC program counters by reason
	Queue         QueueCounters     `json:"queue"`
	Files         FileCounters      `json:"files"`
	Kernel        KernelFeatures    `json:"kernel"`
}

// FailureStatus is a component's failure that ends the run closed.
type FailureStatus struct {
	Component string    `json:"component"` // e.g. verdict-loop (docs/operator.md)
	Error     string    `json:"error"`
	At        time.Time `json:"at"`
}

// ScopeStatus is the open speculative scope.
type ScopeStatus struct {
	ID   uint64       `json:"id"`
	Held []HeldEffect `json:"held"`
}

// HeldEffect is one effect waiting: in the open scope, or for the
// operator's answer.
type HeldEffect struct {
	ID            uint64    `json:"id"`
	Scope         uint64    `json:"scope"` // the open scope holding it; 0: waits outside any scope
	Since         time.Time `json:"since"`
	AgeMillis     int64     `json:"age_ms"`
	Kind          string    `json:"kind"`
	Op            string    `json:"op"`
	Obj           string    `json:"obj"`
	Summary       string    `json:"summary"` // the effect in one line, with its fields
	Reason        string    `json:"reason"`  // reason code; empty for a blocking effect asked about inside its decision
	Justification string    `json:"justification"`
	Deadline      time.Time `json:"deadline,omitzero"` // operator oracle: refused at this time
	Pending       bool      `json:"pending"`           // waiting for carbd approve/deny
}

// LedgerStatus is the G-CARB gate.
type LedgerStatus struct {
	Score   float64 `json:"score"`
	Lambda  float64 `json:"lambda"`
	Stopped bool    `json:"stopped"`
}

// RoleStatus is a per-role budget and its certificate.
type RoleStatus struct {
	Role        string  `json:"role"`
	Stratum     string  `json:"stratum"`
	Threshold   float64 `json:"threshold"`
	Alpha       float64 `json:"alpha"`
	CPUpper     float64 `json:"cp_upper"`
	Certifiable bool    `json:"certifiable"`
}

// DecisionCounts are the engine's counters.
type DecisionCounts struct {
	Proposed  uint64 `json:"proposed"`
	Released  uint64 `json:"released"`
	Refused   uint64 `json:"refused"`
	Deferred  uint64 `json:"deferred"`
	Scopes    uint64 `json:"scopes"`
	Committed uint64 `json:"scopes_committed"`
	Aborted   uint64 `json:"scopes_aborted"`
}

// QueueCounters are the verdict loop's and the kernel queue's counters.
type QueueCounters struct {
	Queued        uint64 `json:"queued"`
	Accepted      uint64 `json:"accepted"`
	Dropped       uint64 `json:"dropped"`
	Held          uint64 `json:"held"`
	KernelDropped uint64 `json:"kernel_queue_dropped"`
	SocketDropped uint64 `json:"socket_dropped"`
	// Verdicts counts the loop's verdicts by reason (accept-* and drop-*,
	// docs/verdict-loop.md): why packets were accepted or dropped.
	Verdicts map[string]uint64 `json:"verdicts"`
}

// FileCounters are the file channel's counters.
type FileCounters struct {
	Events uint64 `json:"events"`
	Lost   uint64 `json:"ringbuf_lost"`
	// Unattributed counts reads the tracer could not attribute to a path
	// (the sensitive files were then taken as read).
	Unattributed uint64 `json:"unattributed_reads"`
	Committed    uint64 `json:"committed"`
	Aborted      uint64 `json:"aborted"`
	Refused      uint64 `json:"refused"`
	// Run names the staging's run (its conflicts are kept under
	// State/conflicts/<run>); State is the working directory's state
	// directory; Labels counts its committed labels.
	Run    string `json:"run"`
	State  string `json:"state"`
	Labels int    `json:"labels"`
	// Conflicts are the staged changes of this run not committed because
	// the user changed the path in the working directory under the agent.
	Conflicts []ConflictStatus `json:"conflicts,omitempty"`
}

// ConflictStatus is one conflict: W keeps the user's version, the
// agent's is at Kept (empty for a removal).
type ConflictStatus struct {
	Path   string `json:"path"`
	Op     string `json:"op"`
	Reason string `json:"reason"`
	Kept   string `json:"kept,omitempty"`
}

// KernelFeatures says what carbd uses on this host.
type KernelFeatures struct {
	TC        string `json:"tc"`        // tcx or tc-legacy
	Netfilter string `json:"netfilter"` // nftables or xtables-nft
	Tracing   string `json:"tracing"`   // tp_btf, raw_tracepoint, off
	Overlay   string `json:"overlay"`
}

// WriteText renders statuses for a terminal.
func WriteText(w io.Writer, sts []SandboxStatus, now time.Time) {
	if len(sts) == 0 {
		fmt.Fprintln(w, "no sandboxes running")
		return
	}
	for i, s := range sts {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "sandbox %s  %s  pid %d  %s  up %s\n", s.ID, s.Backend, s.Pid, strings.ToUpper(s.State), now.Sub(s.Started).Round(time.Second))
		if f := s.Failure; f != nil {
			fmt.Fprintf(w, "  FAILED   component %s: %s (%s ago): the run ends closed, held effects refused, staged changes kept staged\n",
				f.Component, oneLine(f.Error, 200), now.Sub(f.At).Round(time.Millisecond))
		}
		fmt.Fprintf(w, "  workdir  %s\n  task     %s\n  policy   %s   oracle %s\n", s.Workdir, oneLine(s.Task, 100), s.Policy, s.Oracle)
		d := s.Decisions
		fmt.Fprintf(w, "  effects  %d proposed: %d released, %d refused, %d deferred; scopes %d (%d committed, %d aborted)\n",
			d.Proposed, d.Released, d.Refused, d.Deferred, d.Scopes, d.Committed, d.Aborted)
		if s.Ledger != nil {
			mark := "below"
			if s.Ledger.Stopped {
				mark = "STOPPED"
			} else if s.Ledger.Score >= s.Ledger.Lambda {
				mark = "AT"
			}
			fmt.Fprintf(w, "  ledger   score %.2f / stop at %.2f (%s)\n", s.Ledger.Score, s.Ledger.Lambda, mark)
		}
		for _, r := range s.Roles {
			cert := "expectation only"
			if r.Certifiable {
				cert = fmt.Sprintf("certified (CP %.4f)", r.CPUpper)
			}
			fmt.Fprintf(w, "  role     %-10s α=%-6g τ=%.3f stratum %s, %s\n", r.Role, r.Alpha, r.Threshold, r.Stratum, cert)
		}
		if s.Scope != nil && len(s.Scope.Held) > 0 {
			fmt.Fprintf(w, "  scope %d holds %d effects:\n", s.Scope.ID, len(s.Scope.Held))
			for _, h := range s.Scope.Held {
				writeHeld(w, h, now)
			}
		}
		var outside []HeldEffect
		for _, h := range s.Held {
			if h.Scope == 0 {
				outside = append(outside, h)
			}
		}
		if len(outside) > 0 {
			fmt.Fprintf(w, "  %d effects wait outside any scope:\n", len(outside))
			for _, h := range outside {
				writeHeld(w, h, now)
			}
		}
		if s.EngineBusy {
			asOf := "none read yet"
			if !s.DecisionsAsOf.IsZero() {
				asOf = "as of " + now.Sub(s.DecisionsAsOf).Round(time.Millisecond).String() + " ago"
			}
			fmt.Fprintf(w, "  (the engine is waiting for the oracle: effect counts and ledger %s)\n", asOf)
		}
		q := s.Queue
		fmt.Fprintf(w, "  queue    %d queued, %d accepted, %d dropped, %d held; kernel queue drops %d, socket drops %d\n",
			q.Queued, q.Accepted, q.Dropped, q.Held, q.KernelDropped, q.SocketDropped)
		if drops := nonZero(q.Verdicts, "drop-"); drops != "" {
			fmt.Fprintf(w, "  drops    %s\n", drops)
		}
		if len(s.Datapath) > 0 {
			fmt.Fprintf(w, "  datapath %s\n", nonZero(s.Datapath, ""))
		}
		f := s.Files
		fmt.Fprintf(w, "  files    %d events (%d lost, %d unattributed reads), %d committed, %d aborted, %d refused, %d conflicts\n", f.Events, f.Lost, f.Unattributed, f.Committed, f.Aborted, f.Refused, len(f.Conflicts))
		if f.State != "" {
			fmt.Fprintf(w, "  state    %s (run %s, %d labels)\n", f.State, f.Run, f.Labels)
		}
		for _, c := range f.Conflicts {
			kept := "nothing to keep (a removal)"
			if c.Kept != "" {
				kept = "agent's version at " + c.Kept
			}
			fmt.Fprintf(w, "  CONFLICT %s %s — %s; %s\n", c.Op, oneLine(c.Path, 60), c.Reason, kept)
		}
		k := s.Kernel
		fmt.Fprintf(w, "  kernel   tc=%s netfilter=%s tracing=%s overlay=%s\n", k.TC, k.Netfilter, k.Tracing, k.Overlay)
	}
}

// nonZero renders the non-zero counters of m whose names start with
// prefix as "name=n ...", sorted by name.
func nonZero(m map[string]uint64, prefix string) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v > 0 && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func writeHeld(w io.Writer, h HeldEffect, now time.Time) {
	pend := ""
	if h.Pending {
		pend = fmt.Sprintf("  [operator: carbd approve %d | deny %d, refused in %s]", h.ID, h.ID, h.Deadline.Sub(now).Round(time.Second))
	}
	what := h.Justification
	if h.Reason != "" {
		what = h.Reason + ": " + what
	}
	fmt.Fprintf(w, "    #%-5d %-9s %6s  %s %s — %s%s\n", h.ID, h.Kind, time.Duration(h.AgeMillis*int64(time.Millisecond)).Round(time.Millisecond),
		h.Op, oneLine(h.Obj, 50), oneLine(what, 110), pend)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
