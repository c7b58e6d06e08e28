package decide

import (
	"context"
	"fmt"
	"io"
	pathpkg "path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide/ledger"
	"github.com/carbd/carbd/pkg/decide/match"
	"github.com/carbd/carbd/pkg/decide/score"
)

// Options configure an Engine.
type Options struct {
	// Oracle resolves deferred effects; nil means Strict.
	Oracle Oracle
	// OracleTimeout bounds one oracle call; 0 means no bound beyond the
	// oracle's own. A call that times out refuses.
	OracleTimeout time.Duration
	// Audit receives one JSON line per decision; nil writes nothing.
	Audit io.Writer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Revert lets the CRC layer replace an over-threshold gated value by
	// the trusted value it most resembles. Only channels that can rewrite
	// an effect (tool-call adapters) set it; a packet cannot be rewritten.
	Revert bool
	// Calibration holds the per-role CRC thresholds (step 4) and the
	// ledger stop threshold (step 6); nil disables both layers.
	Calibration *Calibration
	// MaxTraceContent bounds the bytes of content kept per incoming event
	// for the oracle's view and the ledger (default 64 KiB).
	MaxTraceContent int
	// LocationLabel, when set, is consulted for the label of a path the
	// engine has no label for: the labels persisted by earlier sessions
	// (pkg/staging keeps them with the working directory).
	LocationLabel func(path string) (Label, bool)
	// LocationLabelsUnder, when set, lists the labels persisted by
	// earlier sessions of the paths strictly below dir (dir + "/..."),
	// keyed by their full paths: a renamed or linked directory carries
	// them to the same relative paths under its new name. Without it
	// only the labels this engine holds are carried.
	LocationLabelsUnder func(dir string) map[string]Label
	// MaxTraceEvents bounds how many recent events the engine keeps for
	// the oracle's view (default 4096). Provenance (T, S, labels) is never
	// trimmed.
	MaxTraceEvents int
	// Score, when set to a similarity kind of package score ("token",
	// "ngram" or "max"), records in every Decision the score of each
	// field of the effect (Decision.Scores), with or without calibrated
	// thresholds: offline calibration reads the scores the engine
	// computes online. Set it to the calibration's kind when both are
	// given. Empty records nothing.
	Score string
	// Ablate switches off refinements of the policy's questions for the
	// ablation study; the zero value keeps every refinement (the
	// default).
	Ablate Ablation
	// Ledger keeps the G-CARB dependency graph and scores every proposal
	// (Decision.Gate) even without a calibrated λ̂; without one nothing
	// is stopped. Offline calibration uses it; a calibration with a
	// ledger implies it.
	Ledger bool
}

// Engine is the decision engine for one sandbox's episode. Its methods
// are safe for concurrent use; decisions are serialised, because each
// depends on the whole trace before it (δ(σ_{i-1}, e_i)).
type Engine struct {
	policy atomic.Pointer[Policy]
	opt    Options

	mu        sync.Mutex // guards everything below
	seq       uint64
	task      string          // every ctrl event's content: tokens the user supplied (isTaskToken)
	taskT     string          // the same when the policy trusts the task, else "": only this vouches (datesDerivable)
	trusted   *match.ValueSet // T_i: values from trusted sources
	untrusted *match.ValueSet // values from untrusted sources, for origin statements
	sens      *match.Index    // S_i: tokens of sensitive content
	sensMax   Level           // highest level in S
	graph     ledger.Graph    // G-CARB dependency graph (kept when a ledger is calibrated)
	lastGate  float64         // the ledger score of the latest proposal
	uctx      score.Context   // untrusted context u of the CRC score
	tctx      score.Context   // trusted prompt t of the CRC score
	readLabel Label           // combined label of everything read so far
	loc       map[string]Label
	scope     *scope
	nextScope uint64
	// resolving is set while the open scope's resolution waits for the
	// oracle with mu released; idle is signalled when it ends. Effects
	// that must resolve a scope first (a state-changing or deferred
	// request) wait for it; staged writes are held in next, the scope
	// that opens when the resolution ends; everything else (reads,
	// released and refused requests) is decided meanwhile, so one open
	// question never stalls the other effects (Guarantee 5).
	resolving bool
	idle      *sync.Cond
	next      *scope
	stopped   *Decision    // the ledger stop, once the episode is stopped
	trace     []traceEntry // a ring; traceHead is its oldest entry once full
	traceHead int
	opCache   map[string]*OpSpec
	stats     Stats
	audit     *auditor
	events    eventSlab    // the decisions' Events (hotpath.go)
	releases  releaseTexts // memoised release justifications
}

// traceEntry is an event as the engine remembers it.
type traceEntry struct {
	ev        Event // content clipped to MaxTraceContent
	label     Label // for incoming events
	untrusted bool
	verdict   Verdict // for outgoing effects
}

// scope is the open speculative scope.
type scope struct {
	id     uint64
	opened time.Time
	held   []*Decision
	tLen   int              // len(T) when the scope opened
	loc    map[string]Label // location labels admitted within the scope
}

// Stats count the engine's decisions.
type Stats struct {
	Observed  uint64 `json:"observed"`
	Proposed  uint64 `json:"proposed"`
	Released  uint64 `json:"released"`
	Refused   uint64 `json:"refused"`
	Deferred  uint64 `json:"deferred"`
	Scopes    uint64 `json:"scopes"`
	Committed uint64 `json:"scopes_committed"`
	Aborted   uint64 `json:"scopes_aborted"`
	OracleErr uint64 `json:"oracle_errors"`
}

// New returns an engine for one episode under policy p.
func New(p *Policy, opt Options) *Engine {
	if opt.Oracle == nil {
		opt.Oracle = Strict{}
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.MaxTraceContent <= 0 {
		opt.MaxTraceContent = 64 << 10
	}
	if opt.MaxTraceEvents <= 0 {
		opt.MaxTraceEvents = 4096
	}
	e := &Engine{
		opt:       opt,
		trusted:   &match.ValueSet{},
		untrusted: &match.ValueSet{},
		sens:      &match.Index{},
		readLabel: Label{Integrity: Trusted},
		loc:       map[string]Label{},
		opCache:   map[string]*OpSpec{},
		audit:     newAuditor(opt.Audit),
	}
	e.idle = sync.NewCond(&e.mu)
	e.policy.Store(p)
	e.seedPolicy(p)
	return e
}

// resolvesScope reports whether a decision must resolve an open scope
// before it takes effect: a state-changing request, or a deferred effect
// that is not a staged write.
func resolvesScope(d *Decision) bool {
	if d.Kind == Stageable {
		return false
	}
	return d.Verdict == Defer || (d.Verdict == Release && d.Kind == Stallable)
}

func (e *Engine) seedPolicy(p *Policy) {
	if len(p.TrustedValues) > 0 {
		e.trusted.Add("the operator's policy", p.TrustedValues...)
	}
}

// Policy returns the policy in force.
func (e *Engine) Policy() *Policy { return e.policy.Load() }

// SetPolicy swaps the policy atomically (a reload). Values the new policy
// declares trusted are added to T.
func (e *Engine) SetPolicy(p *Policy) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.policy.Store(p)
	e.opCache = map[string]*OpSpec{}
	e.seedPolicy(p)
}

// Stats returns the decision counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Task records the principal's task: the trusted values T_0 when the
// policy trusts the task. It is an incoming ctrl event.
func (e *Engine) Task(text string) {
	e.Observe(Event{Ch: ChanCtrl, Dir: In, Obj: "principal", Content: text, Source: "the user's message"})
}

// InLabel returns the label the incoming event ev would carry if it were
// observed now (its source's, its location's, its other names'), without
// observing it.
func (e *Engine) InLabel(ev Event) Label {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.inLabelLocked(e.policy.Load(), &ev)
}

func (e *Engine) inLabelLocked(p *Policy, ev *Event) Label {
	l := p.SourceLabel(ev)
	if ev.Ch == ChanFile {
		// A location the agent wrote carries what it had read before the
		// write, so state cannot launder labels (Kairos §III-C).
		if ll, ok := e.locationLabel(ev.Obj); ok {
			l = l.Combine(ll)
		}
		l = e.aliasLabelLocked(p, ev, l) // readalias.go
	}
	return l
}

// Observe records an incoming event: its values enter T when its source is
// trusted, its tokens enter S when it is sensitive. Outgoing events are
// never added to T: use Propose for them.
func (e *Engine) Observe(ev Event) {
	if ev.Dir != In {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.observeLocked(&ev)
}

func (e *Engine) observeLocked(ev *Event) {
	p := e.policy.Load()
	e.seq++
	ev.Seq = e.seq
	if ev.Time.IsZero() {
		ev.Time = e.opt.Now()
	}
	e.stats.Observed++
	l := e.inLabelLocked(p, ev)
	origin := ev.Origin()
	if ev.Ch == ChanCtrl && ev.Source == "" {
		origin = "the user's message"
	}
	values := match.Extract(ev.Content)
	vouched, fields := e.fieldTrustLocked(p, ev, l.Integrity, values) // fieldtrust.go
	if l.Integrity == Trusted {
		e.trusted.Add(origin, vouched...)
		e.tctx.Add(ev.Content)
	} else {
		e.untrusted.Add(origin, values...)
		e.uctx.Add(ev.Content)
	}
	for _, f := range fields {
		e.trusted.Add(f.origin, f.values...)
	}
	if l.Level > 0 {
		e.sens.Add(origin, uint8(l.Level), values...)
		e.sensMax = e.sensMax.Join(l.Level)
	}
	if ev.Ch == ChanCtrl {
		e.task = appendLine(e.task, ev.Content)
		if l.Integrity == Trusted {
			e.taskT = appendLine(e.taskT, ev.Content)
		}
	}
	e.readLabel = e.readLabel.Combine(l)
	if e.graphOn() {
		e.graph.Add(ledger.Node{Private: l.Level > 0}, ev.Content)
	}
	kept := *ev
	kept.Content = clip(p.Redact(ev.Content), e.opt.MaxTraceContent) // the oracle's view holds no credential
	e.remember(traceEntry{ev: kept, label: l, untrusted: l.Integrity == Untrusted})
}

// remember appends to the bounded trace: a ring of the MaxTraceEvents
// most recent events.
func (e *Engine) remember(t traceEntry) {
	if len(e.trace) < e.opt.MaxTraceEvents {
		e.trace = append(e.trace, t)
		return
	}
	e.trace[e.traceHead] = t
	e.traceHead = (e.traceHead + 1) % len(e.trace)
}

// recent returns the last n remembered events, oldest first.
func (e *Engine) recent(n int) []traceEntry {
	if n > len(e.trace) {
		n = len(e.trace)
	}
	out := make([]traceEntry, 0, n)
	for i := len(e.trace) - n; i < len(e.trace); i++ {
		out = append(out, e.trace[(e.traceHead+i)%len(e.trace)])
	}
	return out
}

// locationLabel returns the label of a path the agent wrote: the open
// scopes' labels first (the newest wins), then the committed one.
func (e *Engine) locationLabel(path string) (Label, bool) {
	for _, sc := range []*scope{e.next, e.scope} {
		if sc != nil {
			if l, ok := sc.loc[path]; ok {
				return l, true
			}
		}
	}
	if l, ok := e.loc[path]; ok {
		return l, true
	}
	if e.opt.LocationLabel != nil {
		return e.opt.LocationLabel(path)
	}
	return Label{}, false
}

// LocationLabel returns the label a read of path would carry from the
// agent's own writes, if any.
func (e *Engine) LocationLabel(path string) (Label, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.locationLabel(path)
}

// LocationLabels returns a copy of the committed location labels, for
// persistence by the staging layer.
func (e *Engine) LocationLabels() map[string]Label {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]Label, len(e.loc))
	for k, v := range e.loc {
		out[k] = v
	}
	return out
}

// SetLocationLabels seeds committed location labels (after a restart).
func (e *Engine) SetLocationLabels(m map[string]Label) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, v := range m {
		e.loc[k] = v
	}
}

// JoinLocationLabel joins l into the label of path, wherever the engine
// holds one (committed, and in the open scopes), so it is never lowered:
// the commit point gives a file the label of content it found moved
// there without an event (a rename the tracer did not see).
func (e *Engine) JoinLocationLabel(path string, l Label) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if o, ok := e.locationLabel(path); ok {
		l = l.Combine(o)
	}
	e.loc[path] = l
	for _, sc := range []*scope{e.scope, e.next} {
		if sc == nil {
			continue
		}
		if o, ok := sc.loc[path]; ok {
			sc.loc[path] = o.Combine(l)
		}
	}
}

// ScopeOpen reports the open scope's id, or 0.
func (e *Engine) ScopeOpen() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.scope == nil {
		return 0
	}
	return e.scope.id
}

// Held returns the decisions held in the open scope, and in the scope
// that opens after it while it is being resolved.
func (e *Engine) Held() []Decision {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Decision
	for _, sc := range []*scope{e.scope, e.next} {
		if sc != nil {
			for _, d := range sc.held {
				out = append(out, *d)
			}
		}
	}
	return out
}

// Propose decides an outgoing effect. The result's Decision is final for
// Release and Refuse; Defer means the effect is held in the open scope
// and its final verdict arrives in a later Resolution. Resolutions lists
// any scope the effect forced to resolve before it was decided.
func (e *Engine) Propose(ctx context.Context, ev Event) Result {
	e.mu.Lock()
	defer e.mu.Unlock()
	var res Result
	p := e.policy.Load()
	e.seq++
	ev.Seq = e.seq
	if ev.Time.IsZero() {
		ev.Time = e.opt.Now()
	}
	e.stats.Proposed++
	// The copy the decision points to; evaluate redacts it and applies
	// the operation's roles.
	evp := e.events.put(&ev)
	var d Decision
	for {
		d = e.evaluate(p, evp)
		if e.opt.Calibration != nil {
			d = e.applyCRC(p, evp, e.opSpec(p, evp.Op), d)
		}
		if !e.resolving || !resolvesScope(&d) {
			break
		}
		// A scope is being resolved: wait, then decide again on the
		// state it leaves (an abort rolls T back).
		e.idle.Wait()
	}
	if e.stopped != nil && d.Verdict != Refuse {
		d = Decision{Seq: ev.Seq, Verdict: Refuse, Layer: LayerLedger, Kind: d.Kind, Policy: d.Policy,
			Reason:        Reason{Code: CodeEpisodeStopped},
			Justification: "the episode was stopped by the ledger gate at #" + fmt.Sprint(e.stopped.Seq)}
	}
	if e.opt.Score != "" {
		d.Scores = e.scoreFields(p, evp)
	}
	d.Event = evp
	if e.graphOn() && e.stopped == nil {
		if stop, ok := e.ledgerGateLocked(ctx, p, evp, &d); ok {
			res.Resolutions = append(res.Resolutions, stop...)
		}
	}
	switch d.Verdict {
	case Refuse:
	case Release:
		switch {
		case e.scope != nil && d.Kind == Stageable:
			e.holdLocked(&d, CodeJoinsScope)
		case e.scope != nil && d.Kind == Stallable:
			// A state-changing request may build on speculative state:
			// the scope resolves before it becomes irreversible.
			if r, ok := e.resolveLocked(ctx, "state-changing request #"+fmt.Sprint(ev.Seq)); ok {
				res.Resolutions = append(res.Resolutions, r)
			}
		}
	case Defer:
		switch d.Kind {
		case Blocking:
			if e.scope != nil {
				if r, ok := e.resolveLocked(ctx, "deferred blocking request #"+fmt.Sprint(ev.Seq)); ok {
					res.Resolutions = append(res.Resolutions, r)
				}
			}
			e.decideBlockingLocked(ctx, &d)
		case Stallable:
			if e.scope != nil {
				if r, ok := e.resolveLocked(ctx, "further effect needs holding #"+fmt.Sprint(ev.Seq)); ok {
					res.Resolutions = append(res.Resolutions, r)
				}
			}
			e.holdLocked(&d, "")
		default: // Stageable: staged writes share the scope's upper layer
			e.holdLocked(&d, "")
		}
	}
	if d.Verdict == Release && d.Kind == Stageable {
		e.labelWritesLocked(&d, e.loc)
	}
	e.count(d.Verdict)
	e.remember(traceEntry{ev: clipEvent(*evp, e.opt.MaxTraceContent), verdict: d.Verdict})
	e.audit.decision(evp.Time, &d, 0)
	res.Decision = d
	return res
}

func clipEvent(ev Event, n int) Event {
	ev.Content = clip(ev.Content, n)
	return ev
}

func (e *Engine) count(v Verdict) {
	switch v {
	case Release:
		e.stats.Released++
	case Refuse:
		e.stats.Refused++
	case Defer:
		e.stats.Deferred++
	}
}

// holdLocked puts a decision into the open scope, opening one if needed.
// While the open scope is being resolved, only staged writes arrive here
// (everything else waits for the resolution); they are held in the scope
// that opens when it ends.
func (e *Engine) holdLocked(d *Decision, code string) {
	at := &e.scope
	if e.resolving {
		at = &e.next
	}
	if *at == nil {
		e.nextScope++
		e.stats.Scopes++
		*at = &scope{id: e.nextScope, opened: e.opt.Now(), tLen: e.trusted.Len(), loc: map[string]Label{}}
	}
	sc := *at
	if code != "" {
		d.Reason = Reason{Code: code}
		d.Layer = LayerScope
		d.Justification = fmt.Sprintf("admissible by policy, held with open speculative scope %d", sc.id)
	}
	d.Verdict = Defer
	d.Scope = sc.id
	if d.Kind == Stageable {
		e.labelWritesLocked(d, sc.loc)
	}
	cp := *d
	detach(&cp) // held until the scope resolves: pin no chunk of events
	sc.held = append(sc.held, &cp)
}

// labelWritesLocked records, for every path a stageable effect writes,
// the combined label of everything read before the write.
func (e *Engine) labelWritesLocked(d *Decision, into map[string]Label) {
	ev := d.Event
	if ev == nil || ev.Ch != ChanFile {
		return
	}
	// A write adds to what the location held (an append keeps the data
	// already there): its label joins the location's earlier one, so a
	// write cannot lower it within the run.
	label := func(p string) Label {
		if l, ok := e.locationLabel(p); ok {
			return e.readLabel.Combine(l)
		}
		return e.readLabel
	}
	if l, ok := e.locationLabel(ev.Obj); ok && ev.WrittenAsDecided {
		// The content is what the location's decided writes produced:
		// the label they gave it (joined with what it held before)
		// covers it.
		into[ev.Obj] = l
	} else {
		into[ev.Obj] = label(ev.Obj)
	}
	for _, f := range ev.Fields {
		if f.Role == RoleTarget && f.Value != "" && f.Value != ev.Obj {
			into[f.Value] = label(f.Value)
		}
	}
	e.carryLabelsLocked(ev, into)
}

// Operations whose destination holds the source's content, and the read
// (fileev's names; pkg/decide imports no kernel-facing package).
const (
	opRename  = "file:rename"
	opLink    = "file:link"
	opSymlink = "file:symlink"
	opRead    = "file:read"
	// renameExchange is renameat2's RENAME_EXCHANGE: both names swap
	// their content.
	renameExchange = 0x2
)

// carryLabelsLocked gives a rename's or a link's destination the label
// of its source, so state cannot launder a label by a new name (labels
// are never forgotten): the destination's label joins the source's
// location label, whichever holds it (an open scope, this run, an
// earlier session), and every labelled path below a source directory
// carries its label to the same relative path below the destination.
// An exchange carries both ways. Labels are only joined, never lowered.
// Both names' own labels are already in into (labelWritesLocked).
//
// A symlink is a name for its target's content too: a read through it
// may be reported under the link's name, so the link's path joins the
// label of its target (a relative target that stays inside the working
// directory, resolved lexically from the link's directory; an absolute
// target or one that leaves it is not mapped).
func (e *Engine) carryLabelsLocked(ev *Event, into map[string]Label) {
	if ev.Op != opRename && ev.Op != opLink && ev.Op != opSymlink {
		return
	}
	var src, dst, flags string
	for _, f := range ev.Fields {
		switch {
		case f.Name == "path" && f.Role == RoleTarget:
			src = f.Value
		case f.Name == "newpath" && f.Role == RoleTarget:
			dst = f.Value
		case f.Name == "linkto" && f.Role == RoleTarget:
			dst = f.Value
		case f.Name == "flags" && f.Role == RoleControl:
			flags = f.Value
		}
	}
	if ev.Op == opSymlink {
		// path is the link, linkto its target: the target's labels go
		// to the link.
		link, target := src, dst
		if link == "" || target == "" || strings.HasPrefix(target, "/") {
			return
		}
		target = pathpkg.Join(pathpkg.Dir(link), target)
		if target == "." || target == ".." || strings.HasPrefix(target, "../") || target == link {
			return
		}
		src, dst = target, link
	}
	if src == "" || dst == "" || src == dst {
		return
	}
	exchange := false
	if ev.Op == opRename && flags != "" {
		v, err := strconv.ParseUint(flags, 0, 64)
		// Flags that cannot be read are taken as an exchange: the
		// conservative direction (both names join both labels).
		exchange = err != nil || v&renameExchange != 0
	}
	// Read both sides before either is written: an exchange carries
	// what each side held.
	fromSrc := e.labelsAtLocked(src)
	e.joinSourceLabelLocked(fromSrc, src)
	var fromDst map[string]Label
	if exchange {
		fromDst = e.labelsAtLocked(dst)
		e.joinSourceLabelLocked(fromDst, dst)
	}
	carry(into, fromSrc, src, dst, e.locationLabel)
	if exchange {
		carry(into, fromDst, dst, src, e.locationLabel)
	}
}

// joinSourceLabelLocked joins into ls[path] the label the policy gives a
// read of path (its sensitive sources' level, untrusted unless a trusted
// source): a rename's or a link's destination holds the source's
// content, so `ln certs/key.pem k` or `mv certs/key.pem k` makes k as
// sensitive as certs/key.pem was, in this run and, persisted as k's
// location label, in later ones.
func (e *Engine) joinSourceLabelLocked(ls map[string]Label, path string) {
	l := e.policy.Load().SourceLabel(&Event{Ch: ChanFile, Dir: In, Obj: path, Op: opRead})
	if o, ok := ls[path]; ok {
		l = l.Combine(o)
	}
	ls[path] = l
}

// carry joins every label of ls (keyed by paths at or below from) into
// the same relative path below to, over that path's own label.
func carry(into, ls map[string]Label, from, to string, own func(string) (Label, bool)) {
	for p, l := range ls {
		q := to + p[len(from):]
		if o, ok := into[q]; ok {
			l = l.Combine(o)
		} else if o, ok := own(q); ok {
			l = l.Combine(o)
		}
		into[q] = l
	}
}

// labelsAtLocked returns the location labels of path and of every path
// below it, each the join of what every layer holds for it (the open
// scopes, this run's, the earlier sessions').
func (e *Engine) labelsAtLocked(path string) map[string]Label {
	out := map[string]Label{}
	add := func(p string, l Label) {
		if o, ok := out[p]; ok {
			l = l.Combine(o)
		}
		out[p] = l
	}
	if l, ok := e.locationLabel(path); ok {
		add(path, l)
	}
	prefix := path + "/"
	for _, m := range []map[string]Label{e.loc, scopeLoc(e.scope), scopeLoc(e.next)} {
		for p, l := range m {
			if strings.HasPrefix(p, prefix) {
				add(p, l)
			}
		}
	}
	if e.opt.LocationLabelsUnder != nil {
		for p, l := range e.opt.LocationLabelsUnder(path) {
			if strings.HasPrefix(p, prefix) {
				add(p, l)
			}
		}
	}
	return out
}

func scopeLoc(sc *scope) map[string]Label {
	if sc == nil {
		return nil
	}
	return sc.loc
}

// decideBlockingLocked asks the oracle about one deferred blocking effect
// before it is sent.
func (e *Engine) decideBlockingLocked(ctx context.Context, d *Decision) {
	e.stats.Deferred++ // deferred to the oracle, then released or refused
	answers := e.askOracleLocked(ctx, []*Decision{d})
	a := answers[d.Seq]
	d.Verdict, d.Layer, d.Reason.Code = a.Verdict, LayerOracle, a.code
	d.Justification = a.justification + "; deferred because " + d.Justification
}

type finalAnswer struct {
	Verdict       Verdict
	code          string
	justification string
}

// askOracleLocked consults the oracle about deferred effects, enforcing
// its bounded authority: it can only release what it was asked about, a
// missing or malformed answer refuses, an error refuses everything.
func (e *Engine) askOracleLocked(ctx context.Context, ds []*Decision) map[uint64]finalAnswer {
	out := make(map[uint64]finalAnswer, len(ds))
	for _, d := range ds {
		out[d.Seq] = finalAnswer{Verdict: Refuse, code: CodeOracleUnanswerd, justification: "the oracle gave no decision: refused"}
	}
	if len(ds) == 0 {
		return out
	}
	view := e.viewLocked(ds)
	if e.opt.OracleTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.opt.OracleTimeout)
		defer cancel()
	}
	// The oracle may take long (an operator, a language model): the
	// engine's lock is released meanwhile, so other effects are decided
	// (Guarantee 5). Callers keep the state the answer applies to stable:
	// a scope under resolution admits no effect (resolving), and a
	// blocking effect is in no scope. While a scope resolves, T is seen
	// as it was when the scope opened, so no effect decided meanwhile
	// builds on values an abort would roll back.
	if e.resolving && e.scope != nil {
		e.trusted.Hide(e.scope.tLen)
	}
	e.mu.Unlock()
	answers, err := e.opt.Oracle.Decide(ctx, view)
	e.mu.Lock()
	e.trusted.Hide(-1)
	if e.stopped != nil {
		// The ledger gate stopped the episode while the oracle answered:
		// nothing asked about may be released any more.
		for _, d := range ds {
			out[d.Seq] = finalAnswer{Verdict: Refuse, code: CodeEpisodeStopped, justification: "the episode was stopped by the ledger gate at #" + fmt.Sprint(e.stopped.Seq) + " while the oracle was asked"}
		}
		return out
	}
	if err != nil && clientGone(err) {
		// Nobody waits for these effects any more: the oracle's
		// question was withdrawn, not failed.
		for _, d := range ds {
			out[d.Seq] = finalAnswer{Verdict: Refuse, code: CodeOracleWithdrawn, justification: "the question was withdrawn (" + clip(err.Error(), 200) + "): refused"}
		}
		return out
	}
	if err != nil {
		e.stats.OracleErr++
		for _, d := range ds {
			out[d.Seq] = finalAnswer{Verdict: Refuse, code: CodeOracleFailed, justification: "the oracle failed (" + clip(err.Error(), 200) + "): refused"}
		}
		return out
	}
	for _, a := range answers {
		if _, asked := out[a.Seq]; !asked {
			continue // the oracle may decide only what it was asked about
		}
		switch {
		case a.Withdrawn:
			out[a.Seq] = finalAnswer{Verdict: Refuse, code: CodeOracleWithdrawn, justification: oneLine("oracle " + e.opt.Oracle.Name() + ": question " + a.Justification + ": refused")}
		case a.Verdict == Release:
			out[a.Seq] = finalAnswer{Verdict: Release, code: CodeOracleRelease, justification: oneLine("oracle " + e.opt.Oracle.Name() + " released: " + a.Justification)}
		default:
			out[a.Seq] = finalAnswer{Verdict: Refuse, code: CodeOracleRefuse, justification: oneLine("oracle " + e.opt.Oracle.Name() + " refused: " + a.Justification)}
		}
	}
	return out
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return clip(s, 300)
}

// Resolve resolves the open speculative scope, if any, asking the oracle
// about the effects the policy deferred. trigger says why (Kairos §III-D:
// a further effect needing a hold, a state-changing request, stub-derived
// content about to leave, the end of the task).
func (e *Engine) Resolve(ctx context.Context, trigger string) *Resolution {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.resolveLocked(ctx, trigger)
	if !ok {
		return nil
	}
	return &r
}

// Finish ends the task: the open scope resolves.
func (e *Engine) Finish(ctx context.Context) *Resolution {
	return e.Resolve(ctx, "end of task")
}

// resolveLocked resolves the open scope; it reports false when there is
// none (another caller may have resolved it while this one waited).
func (e *Engine) resolveLocked(ctx context.Context, trigger string) (Resolution, bool) {
	for e.resolving {
		e.idle.Wait()
	}
	sc := e.scope
	if sc == nil {
		return Resolution{}, false
	}
	e.resolving = true
	defer func() {
		e.resolving = false
		e.idle.Broadcast()
	}()
	r := Resolution{Scope: sc.id, Trigger: trigger}
	var ask []*Decision
	for _, d := range sc.held {
		if d.Policy == Defer {
			ask = append(ask, d)
		}
	}
	answers := e.askOracleLocked(ctx, ask)
	// The effects are decided when the oracle has answered (an operator
	// may take minutes): that is the time the audit records.
	r.Time = e.opt.Now()
	committed := true
	refusedPaths := map[string]bool{}
	for _, d := range sc.held {
		fd := *d
		if d.Policy == Defer {
			a := answers[d.Seq]
			fd.Verdict, fd.Layer, fd.Reason.Code = a.Verdict, LayerOracle, a.code
			fd.Justification = a.justification + "; deferred because " + d.Justification
		} else {
			fd.Verdict = Release
			fd.Justification = fmt.Sprintf("released with scope %d (admissible by policy)", sc.id)
		}
		if fd.Verdict == Refuse {
			committed = false
			if fd.Event != nil && fd.Event.Ch == ChanFile {
				refusedPaths[fd.Event.Obj] = true
			}
		}
		r.Effects = append(r.Effects, fd)
		e.count(fd.Verdict)
		e.audit.decision(r.Time, &fd, sc.id)
	}
	r.Committed = committed
	// Labels admitted within the scope become permanent for what was
	// released and are discarded for what was refused.
	for path, l := range sc.loc {
		if !refusedPaths[path] {
			e.loc[path] = l
		}
	}
	if committed {
		e.stats.Committed++
	} else {
		e.stats.Aborted++
		// Trusted values admitted while the scope was open may stem from
		// state the abort discards: roll T back (the conservative
		// direction). S is never rolled back: the agent's context still
		// holds what it read.
		e.trusted.Truncate(sc.tLen)
		r.Notice = AbortNotice(r.Refused())
	}
	e.audit.resolution(&r)
	e.openNextLocked(sc.tLen)
	return r, true
}

// openNextLocked ends the resolved scope: the scope that collected staged
// writes during the resolution, if any, becomes the open one. T may have
// been rolled back to tLen, below the mark the next scope took.
func (e *Engine) openNextLocked(tLen int) {
	e.scope, e.next = e.next, nil
	if e.scope != nil && e.scope.tLen > e.trusted.Len() {
		e.scope.tLen = min(tLen, e.trusted.Len())
	}
}
