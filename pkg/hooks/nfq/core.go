package nfq

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// packet is one queued packet waiting for its verdict. Only the worker
// that owns it touches it after dispatch.
type packet struct {
	id     uint32
	mark   uint32
	data   []byte // the IP packet; released once parsed
	length int    // len(data) when it arrived
	time   time.Time
	local  bool // INPUT hook: addressed to the host
	indev  uint32
	hw     [6]byte
	hasHW  bool
	// csumNotReady: the kernel has not computed the transport checksum
	// (a GSO packet queued whole).
	csumNotReady bool
	// gso: queued whole as a GSO packet (NFQA_SKB_GSO, only with
	// Config.GSO): a UDP one may be several datagrams (see
	// errUDPSuperPacket).
	gso       bool
	truncated bool
	pk        peeked
	peekErr   error
	// TCP payload range [seq, end) and the payload (a view into data),
	// set by the worker for held packets.
	seq, end uint32
	payload  []byte
	done     bool
	// tm: the packet's timing, with Config.Timing only.
	tm *Timing
}

// sink is where verdicts and RSTs go: the nfqueue socket in a Loop, a
// recorder in the unit tests.
type sink interface {
	verdict(p *packet, accept bool) error
	rst(r rstInfo) error
	unreachable(u unreachInfo) error
}

// unreachInfo is what an ICMP "administratively prohibited" error for a
// refused datagram needs.
type unreachInfo struct {
	orig    []byte  // the refused IP packet
	hw      [6]byte // the client's MAC
	ifindex uint32
	dns     bool // a DNS query to answer NXDOMAIN (Config.DNSRefusal)
}

// rstInfo is what a RST to the client of a refused TCP flow needs.
type rstInfo struct {
	client, server netip.AddrPort
	// seq is the client's last acknowledgment number (the server's next
	// sequence number as the client expects it); ack is the end of the
	// client's bytes seen.
	seq, ack uint32
	hw       [6]byte // the client's MAC (source of its packets)
	ifindex  uint32  // the interface its packets arrived on
}

// core is the verdict loop without the kernel: workers, decisions,
// tickets and counters. Loop wires it to an nfqueue socket.
type core struct {
	cfg    Config
	out    sink
	dp     Datapath
	inline InlineDecider // cfg.Decider, when it can decide without blocking

	workers []*worker
	jobs    chan *job
	ctx     context.Context // ends when the loop stops; parent of Decide contexts
	cancel  context.CancelFunc
	quit    chan struct{}
	wg      sync.WaitGroup

	sendMu   sync.RWMutex // closing and the workers' in channels
	closing  bool
	stopOnce sync.Once

	tmu     sync.Mutex // guards tickets and early
	tickets map[uint64]ticketRef
	early   map[uint64]earlyRes

	received, released, refused, deferred, late atomic.Uint64
	double, verrs, recvErrs, overruns, panics   atomic.Uint64
	rsts, rstErrs, dpErrs, unreach              atomic.Uint64
	held                                        atomic.Int64
	verdicts                                    [NumReasons]atomic.Uint64

	// testHookHandle, when set (tests only), runs first in the worker for
	// every packet.
	testHookHandle func(p *packet)
}

type ticketRef struct {
	w  *worker
	id uint64
}

type earlyRes struct {
	res Resolution
	at  time.Time
}

// maxEarly bounds resolutions kept for tickets not yet registered.
const maxEarly = 4096

type job struct {
	w    *worker
	id   uint64
	meta Meta
	ev   decide.Event
	// ctx ends at the effect's hold deadline, or earlier when its client
	// is gone (cancel, with decide.ErrClientGone as the cause).
	ctx    context.Context
	cancel context.CancelCauseFunc
	timed  bool // Config.Timing: note when the decision ran
}

type result struct {
	id      uint64
	verdict Verdict
	reason  Reason
	ticket  uint64
	tm      *decTiming // with Config.Timing only
}

func newCore(cfg Config, out sink) *core {
	c := &core{
		cfg:     cfg,
		out:     out,
		dp:      cfg.Datapath,
		jobs:    make(chan *job, int(cfg.MaxQueueLen)+64),
		quit:    make(chan struct{}),
		tickets: map[uint64]ticketRef{},
		early:   map[uint64]earlyRes{},
	}
	c.inline, _ = cfg.Decider.(InlineDecider)
	for i := 0; i < cfg.Workers; i++ {
		c.workers = append(c.workers, newWorker(c, i))
	}
	return c
}

// start runs the workers and the decision pool.
func (c *core) start() {
	c.ctx, c.cancel = context.WithCancel(context.Background())
	for _, w := range c.workers {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); w.run() }()
	}
	for i := 0; i < c.cfg.DecideWorkers; i++ {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.decider() }()
	}
}

// stop gives every packet still queued or held a drop verdict and ends
// the goroutines. Packets dispatched after stop are dropped at once.
func (c *core) stop() { c.stopOnce.Do(c.doStop) }

func (c *core) doStop() {
	c.sendMu.Lock()
	if !c.closing {
		c.closing = true
		for _, w := range c.workers {
			close(w.in)
		}
	}
	c.sendMu.Unlock()
	for _, w := range c.workers {
		<-w.done
	}
	c.cancel()
	close(c.quit)
	c.wg.Wait()
}

// dispatch hands a packet to the worker that owns its flow, or drops it
// when the loop is stopping. It may block while that worker is busy: the
// kernel queue absorbs the wait.
func (c *core) dispatch(p *packet) {
	c.received.Add(1)
	if c.cfg.Timing != nil {
		if p.tm == nil {
			p.tm = &Timing{}
		}
		p.tm.Read = p.time
	}
	p.pk, p.peekErr = peek(p.data)
	c.sendMu.RLock()
	defer c.sendMu.RUnlock()
	if c.closing {
		c.verdict(p, false, DropShutdown)
		return
	}
	w := c.workers[shard(&p.pk, len(c.workers))]
	// Inline: when the worker has nothing queued and is idle, the
	// dispatcher handles the packet itself, under the worker's lock,
	// instead of waking the worker's goroutine (a hand-off that costs a
	// thread wake-up on a busy host). Order holds: with nothing of the
	// worker's queued, every packet dispatched before this one has been
	// handled. Handling never blocks (decisions that may wait run on the
	// decision pool), so the receive goroutine is back at the socket
	// when it returns.
	if !c.cfg.handOff && w.queued.Load() == 0 && w.mu.TryLock() {
		w.safely(p, func() { w.handle(p) })
		w.wake()
		w.mu.Unlock()
		return
	}
	w.queued.Add(1)
	w.in <- p
}

// verdict gives p its one verdict and counts it.
func (c *core) verdict(p *packet, accept bool, r Reason) {
	if p.done {
		c.double.Add(1)
		return
	}
	p.done = true
	if accept != r.Accept() { // a bug: never accept under a drop reason
		accept = false
		r = DropDecideError
	}
	c.verdicts[r].Add(1)
	if p.tm != nil {
		p.tm.Verdict = time.Now()
	}
	if err := c.out.verdict(p, accept); err != nil {
		c.verrs.Add(1)
		c.cfg.Logger.Warn("nfq: verdict not taken; the kernel drops the packet", "queue", c.cfg.QueueNum, "id", p.id, "err", err)
	}
	if tm := p.tm; tm != nil {
		tm.Written = time.Now()
		tm.ID, tm.Accept, tm.Reason = p.id, accept, r
		if p.pk.hasKey {
			tm.Flow, tm.TCPFlags, tm.Payload = p.pk.key, p.pk.tcpFlags, p.pk.tcpPayload
		}
		c.cfg.Timing(*tm)
	}
}

// outcome turns a Decider's answer for effect id of worker w (or its
// failure) into the result the worker applies.
func (c *core) outcome(w *worker, id uint64, out Outcome, err error) result {
	r := result{id: id, verdict: out.Verdict}
	switch {
	case err != nil:
		c.cfg.Logger.Warn("nfq: decider failed: refused", "err", err)
		r.verdict, r.reason = Refuse, DropDecideError
	case out.Verdict == Release:
		r.reason = AcceptReleased
	case out.Verdict == Refuse:
		r.reason = DropRefused
	case out.Verdict == Hold && out.Ticket != 0:
		r.ticket = out.Ticket
		if res, ok := c.register(out.Ticket, w, id); ok {
			r = resolutionResult(id, res)
		}
	default:
		c.cfg.Logger.Warn("nfq: decider answered nonsense: refused", "verdict", out.Verdict, "ticket", out.Ticket)
		r.verdict, r.reason = Refuse, DropDecideError
	}
	return r
}

// decider runs Decide calls from the job queue.
func (c *core) decider() {
	for {
		select {
		case j := <-c.jobs:
			c.decide(j)
		case <-c.quit:
			return
		}
	}
}

func (c *core) decide(j *job) {
	var start time.Time
	if j.timed {
		start = time.Now()
	}
	out, err := c.safeDecide(j.ctx, j)
	j.cancel(nil)
	var tm *decTiming
	if j.timed {
		tm = &decTiming{start: start, end: time.Now()}
	}
	r := c.outcome(j.w, j.id, out, err)
	r.tm = tm
	j.w.apply(r)
	for _, res := range out.Resolutions {
		c.resolve(res)
	}
}

func (c *core) safeDecide(ctx context.Context, j *job) (out Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.panics.Add(1)
			err = fmt.Errorf("nfq: decider panicked: %v\n%s", v, debug.Stack())
		}
	}()
	return c.cfg.Decider.Decide(ctx, j.meta, j.ev), nil
}

// safeDecideNow asks an InlineDecider; a panic is an error (refused).
func (c *core) safeDecideNow(d InlineDecider, m Meta, ev decide.Event) (out Outcome, ok bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			c.panics.Add(1)
			err = fmt.Errorf("nfq: decider panicked: %v\n%s", v, debug.Stack())
		}
	}()
	out, ok = d.DecideNow(m, ev)
	return out, ok, nil
}

func resolutionResult(id uint64, res Resolution) result {
	switch res.Verdict {
	case Release:
		return result{id: id, verdict: Release, reason: AcceptReleased}
	case Refuse:
		return result{id: id, verdict: Refuse, reason: DropRefused}
	}
	return result{id: id, verdict: Refuse, reason: DropDecideError}
}

// register records which worker holds ticket's effect; it returns a
// resolution that arrived before the registration, if any.
func (c *core) register(ticket uint64, w *worker, id uint64) (Resolution, bool) {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	if e, ok := c.early[ticket]; ok {
		delete(c.early, ticket)
		return e.res, true
	}
	c.tickets[ticket] = ticketRef{w: w, id: id}
	return Resolution{}, false
}

func (c *core) unregister(ticket uint64) {
	c.tmu.Lock()
	delete(c.tickets, ticket)
	c.tmu.Unlock()
}

// resolve delivers the final verdict of a held effect. It reports whether
// the ticket named an effect held now; a resolution for a ticket not yet
// registered is kept (bounded) for when it is.
func (c *core) resolve(res Resolution) bool {
	c.tmu.Lock()
	ref, ok := c.tickets[res.Ticket]
	if ok {
		delete(c.tickets, res.Ticket)
	} else if res.Ticket != 0 {
		if len(c.early) >= maxEarly {
			oldest, at := uint64(0), time.Time{}
			for t, e := range c.early {
				if at.IsZero() || e.at.Before(at) {
					oldest, at = t, e.at
				}
			}
			delete(c.early, oldest)
		}
		c.early[res.Ticket] = earlyRes{res: res, at: time.Now()}
	}
	c.tmu.Unlock()
	if ok {
		ref.w.post(resolutionResult(ref.id, res))
	} else if res.Ticket != 0 {
		// Wake a worker, whose ticks sweep what is kept (sweepEarly)
		// while any is; a full ctl queue wakes it anyway.
		select {
		case c.workers[0].ctl <- func() {}:
		default:
		}
	}
	return ok
}

// hasEarly reports whether resolutions wait for their tickets.
func (c *core) hasEarly() bool {
	c.tmu.Lock()
	defer c.tmu.Unlock()
	return len(c.early) > 0
}

// sweepEarly forgets early resolutions older than the hold timeout.
func (c *core) sweepEarly(now time.Time) {
	c.tmu.Lock()
	for t, e := range c.early {
		if now.Sub(e.at) > c.cfg.HoldTimeout {
			delete(c.early, t)
		}
	}
	c.tmu.Unlock()
}

func (c *core) stats() Stats {
	s := Stats{
		Received: c.received.Load(), Held: c.held.Load(),
		Released: c.released.Load(), Refused: c.refused.Load(), Deferred: c.deferred.Load(), Late: c.late.Load(),
		DoubleVerdicts: c.double.Load(), VerdictErrors: c.verrs.Load(), RecvErrors: c.recvErrs.Load(),
		RecvOverruns: c.overruns.Load(), Panics: c.panics.Load(), RSTs: c.rsts.Load(), RSTErrors: c.rstErrs.Load(),
		Unreachables:   c.unreach.Load(),
		DatapathErrors: c.dpErrs.Load(),
	}
	for r := range s.Verdicts {
		s.Verdicts[r] = c.verdicts[r].Load()
	}
	return s
}

func (c *core) dpErr(op string, k tcx.FlowKey, err error) {
	if err != nil {
		c.dpErrs.Add(1)
		c.cfg.Logger.Warn("nfq: fast path update failed", "op", op, "flow", k.String(), "err", err)
	}
}

// worker owns the flows that hash to it: their parser state, held packets
// and pending effects. Only its goroutine touches them.
type worker struct {
	c   *core
	idx int
	// mu is held while the worker's state is used: by its goroutine, or
	// by a dispatcher handling a packet inline (see dispatch). queued
	// counts the packets sent to in and not handled yet.
	mu      sync.Mutex
	queued  atomic.Int32
	in      chan *packet
	results chan result
	ctl     chan func()
	done    chan struct{}

	parser  *netparse.Parser
	flows   map[tcx.FlowKey]*flowState
	holding map[*flowState]struct{} // flows with held packets or pending effects
	effects map[uint64]*effect
	dgq     map[tcx.FlowKey][]*effect // datagram effects by flow, in arrival order
	frags   map[netparse.FragKey][]*packet
	// hws: the hardware address each source was last seen with on each
	// interface (see learnHW).
	hws     map[hwKey][6]byte
	nextID  uint64
	expired time.Time // last parser.Expire
	// timer fires the next tick; armed is the delay it was last set to
	// (0: stopped). Ticks run only while the worker has something to
	// expire (see nextTick): an idle loop does not wake.
	timer *time.Timer
	armed time.Duration
}

// flowState is what the loop knows of one TCP flow (or a UDP flow decided
// as a whole: QUIC).
type flowState struct {
	key     tcx.FlowKey
	held    []*packet // packets without a verdict, in arrival order
	bytes   int       // their payload bytes
	pending []*effect // effects awaiting a decision, in stream order
	// decidedTo: client bytes before it are released (hasRange); open:
	// everything to the end of the connection is.
	decidedTo uint32
	hasRange  bool
	open      bool
	openEv    *decide.Event // the effect that opened it, for Revoke
	stamp     genStamp      // the read generation open was released at (Config.Recheck)
	redecide  bool
	refused   bool
	synSeen   bool
	isn       uint32
	last      time.Time
	lastHeld  time.Time // arrival of the latest held packet
	// bodyOf is the released head of an HTTP request whose body is still
	// arriving: held body bytes are decided in parts (see PartAfter).
	bodyOf *decide.Event
	rst    rstInfo
	hasRST bool
	udp    bool
}

// effect is an effect handed to the Decider.
type effect struct {
	id       uint64
	flow     *flowState // TCP, or a UDP flow decided whole
	tcp      bool
	packets  []*packet // a datagram effect's packets (the datagram, or its fragments)
	span     netparse.Span
	seq, end uint32
	ev       *decide.Event
	deadline time.Time
	ticket   uint64
	// flowVerdict: the verdict applies to the UDP flow on the fast path
	// (QUIC, or ReleaseUDPFlows).
	flowVerdict bool
	udp         bool        // a UDP datagram: refused, its client gets an ICMP error
	key         tcx.FlowKey // a datagram's flow
	verdict     Verdict     // TCP: set when decided, applied in stream order
	reason      Reason
	headOnly    bool      // an HTTP head whose body follows as other effects
	part        bool      // a part of a body, made by the loop (see PartAfter)
	stamp       genStamp  // the read generation before it was decided (Config.Recheck)
	recheck     *Meta     // a Meta.Recheck question, not a decision (recheck.go)
	submitted   time.Time // when it went to the decider
	// cancel ends the context of the effect's decision (see clientGone);
	// gone: its client was found gone already.
	cancel context.CancelCauseFunc
	gone   bool
	tm     *decTiming // with Config.Timing only
}

const tickEvery = 50 * time.Millisecond

func newWorker(c *core, idx int) *worker {
	w := &worker{
		c:       c,
		idx:     idx,
		in:      make(chan *packet, 256),
		results: make(chan result, 1024),
		ctl:     make(chan func(), 16),
		done:    make(chan struct{}),
		flows:   map[tcx.FlowKey]*flowState{},
		holding: map[*flowState]struct{}{},
		effects: map[uint64]*effect{},
		dgq:     map[tcx.FlowKey][]*effect{},
		frags:   map[netparse.FragKey][]*packet{},
		hws:     map[hwKey][6]byte{},
		timer:   time.NewTimer(time.Hour),
	}
	w.timer.Stop()
	w.parser = w.newParser()
	return w
}

func (w *worker) newParser() *netparse.Parser {
	p, err := netparse.NewParser(w.c.cfg.Parser)
	if err != nil {
		panic(err) // validated by New
	}
	return p
}

// apply applies a decision from the pool: at once, under the worker's
// lock, when the worker is idle (no hand-off back to its goroutine),
// else through its results channel. Results apply in any order: settle
// keeps a flow's stream order.
func (w *worker) apply(r result) {
	if !w.c.cfg.handOff && w.mu.TryLock() {
		w.safely(nil, func() { w.result(r) })
		w.wake()
		w.mu.Unlock()
		return
	}
	w.post(r)
}

// post delivers a decision to the worker, unless it has stopped.
func (w *worker) post(r result) {
	select {
	case w.results <- r:
	case <-w.done:
	}
}

func (w *worker) run() {
	defer close(w.done)
	defer w.timer.Stop()
	for {
		select {
		case p, ok := <-w.in:
			w.mu.Lock()
			if !ok {
				w.shutdown()
				w.mu.Unlock()
				return
			}
			w.safely(p, func() { w.handle(p) })
			w.queued.Add(-1)
			w.wake()
			w.mu.Unlock()
		case r := <-w.results:
			w.mu.Lock()
			w.safely(nil, func() { w.result(r) })
			w.wake()
			w.mu.Unlock()
		case f := <-w.ctl:
			w.mu.Lock()
			w.safely(nil, f)
			w.wake()
			w.mu.Unlock()
		case now := <-w.timer.C:
			w.mu.Lock()
			w.armed = 0
			w.safely(nil, func() { w.tick(now) })
			if d := w.nextTick(now); d > 0 {
				w.armed = d
				w.timer.Reset(d)
			}
			w.mu.Unlock()
		}
	}
}

// safely runs fn; a panic drops p (if it has no verdict yet) and every
// packet the worker holds, refuses the flows they belong to and restarts
// the parser: the worker's state cannot be trusted any more.
func (w *worker) safely(p *packet, fn func()) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		w.c.panics.Add(1)
		w.c.cfg.Logger.Error("nfq: worker panicked: its held packets are dropped and their flows refused",
			"worker", w.idx, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		if p != nil && !p.done {
			w.c.verdict(p, false, DropPanic)
		}
		w.reset(DropPanic)
	}()
	fn()
}

// reset drops everything held and forgets the parser's state.
func (w *worker) reset(r Reason) {
	defer func() {
		if v := recover(); v != nil { // never let a second panic escape
			w.c.panics.Add(1)
		}
		w.parser = w.newParser()
	}()
	for f := range w.holding {
		w.refuseFlow(f, r, true)
	}
	for id, e := range w.effects {
		w.dropEffect(e, r)
		delete(w.effects, id)
	}
	clear(w.dgq)
	for k, ps := range w.frags {
		w.dropAll(ps, r)
		delete(w.frags, k)
	}
	// Forget the flows too (refused ones excepted): their next data is
	// resynced from the fast path's released range, as after a restart.
	for k, f := range w.flows {
		if !f.refused {
			delete(w.flows, k)
		}
	}
}

// shutdown drops every packet the worker holds: the loop is stopping.
func (w *worker) shutdown() {
	for f := range w.holding {
		w.dropAll(f.held, DropShutdown)
		f.held = nil
		for _, e := range f.pending {
			w.forgetEffect(e)
		}
		f.pending = nil
	}
	clear(w.holding)
	for _, e := range w.effects {
		w.dropEffect(e, DropShutdown)
	}
	clear(w.effects)
	clear(w.dgq)
	for k, ps := range w.frags {
		w.dropAll(ps, DropShutdown)
		delete(w.frags, k)
	}
}

func (w *worker) accept(p *packet, r Reason) {
	if p.done {
		w.c.double.Add(1)
		return
	}
	w.c.verdict(p, true, r)
}

func (w *worker) drop(p *packet, r Reason) {
	if p.done {
		w.c.double.Add(1)
		return
	}
	w.c.verdict(p, false, r)
}

// unhold gives a held packet its verdict.
func (w *worker) unhold(p *packet, accept bool, r Reason) {
	w.c.held.Add(-1)
	if accept {
		w.accept(p, r)
	} else {
		w.drop(p, r)
	}
}

func (w *worker) dropAll(ps []*packet, r Reason) {
	for _, p := range ps {
		w.unhold(p, false, r)
	}
}

// hold counts p as held; false when the loop's budget is full (p is then
// dropped: a TCP sender retransmits).
func (w *worker) hold(p *packet) bool {
	if w.c.held.Load() >= int64(w.c.cfg.MaxHeld) {
		w.drop(p, DropBudget)
		return false
	}
	w.c.held.Add(1)
	return true
}

func (w *worker) flow(k tcx.FlowKey, now time.Time) *flowState {
	f := w.flows[k]
	if f == nil {
		f = &flowState{key: k, last: now}
		w.flows[k] = f
	}
	f.last = now
	return f
}

func (w *worker) handle(p *packet) {
	stampWorker(p)
	if h := w.c.testHookHandle; h != nil {
		h(p)
	}
	if p.peekErr != nil || p.truncated {
		w.drop(p, DropMalformed)
		return
	}
	w.learnHW(p)
	pk := &p.pk
	var f *flowState
	if pk.hasKey {
		f = w.flows[pk.key]
		if f != nil && f.refused {
			w.drop(p, DropFlowRefused)
			return
		}
		if pk.key.Proto == tcx.ProtoTCP && f == nil && pk.tcpFlags&tcpSYN == 0 && pk.tcpPayload > 0 {
			w.resync(pk, p.time)
		}
	}
	res := w.parser.Feed(p.data, netparse.Meta{Time: p.time, ChecksumNotReady: p.csumNotReady})
	for _, k := range res.Expired {
		w.dropFrags(k, DropFragment)
	}
	pkt := res.Packet
	if pkt == nil {
		r := DropMalformed
		if res.Action == netparse.Drop {
			r = DropRetry
		}
		w.drop(p, r)
		return
	}
	if pkt.IsFragment {
		switch res.Action {
		case netparse.Hold:
			if w.hold(p) {
				w.frags[pkt.Datagram] = append(w.frags[pkt.Datagram], p)
			}
		case netparse.Drop:
			w.drop(p, DropRetry)
		default:
			w.drop(p, DropFragment)
			w.dropFrags(pkt.Datagram, DropFragment)
		}
		return
	}
	if pkt.Proto == netparse.ProtoTCP {
		if f == nil {
			f = w.flow(tcpKey(pkt), p.time)
		}
		w.handleTCP(p, pkt, f, res)
		return
	}
	w.handleDatagram(p, pkt, res)
}

// hwKey is a source address on an input interface.
type hwKey struct {
	ifindex uint32
	addr    netip.Addr
}

// maxHWs bounds a worker's hardware address table (a guest can make up
// source addresses): when full it starts over.
const maxHWs = 4096

// learnHW gives a packet queued without the client's hardware address
// the one its source was last seen with on the same interface. The
// kernel leaves NFQA_HWADDR out of the segments of a GSO packet it
// segments before queueing (segmentation resets the MAC header): under
// a VMM's tap offloads most packets of a large request come so, and
// without the address a refused flow's RST, or a refused datagram's ICMP
// error, could not be sent.
func (w *worker) learnHW(p *packet) {
	if !p.pk.src.IsValid() {
		return
	}
	k := hwKey{p.indev, p.pk.src}
	if p.hasHW {
		if _, ok := w.hws[k]; !ok && len(w.hws) >= maxHWs {
			clear(w.hws)
		}
		w.hws[k] = p.hw
		return
	}
	if hw, ok := w.hws[k]; ok {
		p.hw, p.hasHW = hw, true
	}
}

// resync: a data packet of a TCP flow this loop has no state for (it
// restarted, or forgot the flow): when the fast path has the flow
// released up to a sequence number, parsing restarts there with a new
// request instead of deciding the rest of the connection as one opaque
// effect.
func (w *worker) resync(pk *peeked, now time.Time) {
	if w.c.dp == nil {
		return
	}
	v, err := w.c.dp.Verdict(pk.key)
	if err != nil || v.Action != tcx.Released || !v.TCPRange {
		return
	}
	src := netip.AddrPortFrom(pk.key.Src, pk.key.SrcPort)
	dst := netip.AddrPortFrom(pk.key.Dst, pk.key.DstPort)
	if w.parser.Resync(src, dst, v.SeqEnd, now) != nil {
		return
	}
	f := w.flow(pk.key, now)
	f.decidedTo, f.hasRange, f.synSeen = v.SeqEnd, true, true
}

func tcpKey(pk *netparse.Packet) tcx.FlowKey {
	return tcx.FlowKey{Src: pk.Src, Dst: pk.Dst, SrcPort: pk.SrcPort, DstPort: pk.DstPort, Proto: tcx.ProtoTCP}
}

func seqLE(a, b uint32) bool { return int32(a-b) <= 0 }

func (w *worker) handleTCP(p *packet, pkt *netparse.Packet, f *flowState, res *netparse.Result) {
	syn := pkt.Flags&netparse.FlagSYN != 0
	if syn && f.synSeen && f.isn != pkt.Seq {
		// A new connection on the same ports: whatever was held for the
		// old one will never be wanted.
		w.clientGone(f, "the guest opened a new connection on the same ports")
		w.forgetFlow(f, DropStale)
		f = w.flow(f.key, p.time)
	}
	if syn {
		f.synSeen, f.isn = true, pkt.Seq
	}
	if pkt.Flags&netparse.FlagFIN != 0 {
		// The guest closed the connection with a request still waiting
		// for its decision: its client gave up (the rare client that
		// half-closes after its request loses it too: refused, fail
		// closed). The decision is refused; the flow with it.
		w.clientGone(f, "the guest closed the connection")
	}
	seq := pkt.Seq
	if syn {
		seq++
	}
	p.seq, p.end, p.payload = seq, seq+uint32(len(pkt.Payload)), pkt.Payload
	if len(pkt.Payload) > 0 {
		f.rst = rstInfo{
			client: pkt.SrcAddrPort(), server: pkt.DstAddrPort(),
			seq: pkt.Ack, ack: p.end, hw: p.hw, ifindex: p.indev,
		}
		if pkt.Flags&netparse.FlagACK == 0 {
			f.rst.seq = 0
		}
		f.hasRST = p.hasHW && pkt.Flags&netparse.FlagACK != 0
	}
	var recheck bool // the agent read since f was released to its end
	switch res.Action {
	case netparse.Refuse:
		w.drop(p, DropParser)
		if errors.Is(res.Err, netparse.ErrTCPConflict) || errors.Is(res.Err, netparse.ErrFlowRefused) {
			w.refuseFlow(f, DropFlowRefused, true)
		}
		return
	case netparse.Drop:
		w.drop(p, DropRetry)
		return
	case netparse.NoData:
		if pkt.Flags&netparse.FlagRST != 0 {
			// The guest reset the connection: what it held is moot.
			w.accept(p, AcceptControl)
			w.clientGone(f, "the guest reset the connection")
			w.forgetFlow(f, DropStale)
			return
		}
		if syn && !f.hasRange && !f.open {
			// The handshake carries no effect; data after the SYN is
			// queued beyond this range and decided. The fast path learns
			// it before the SYN leaves, so the handshake's ACK passes
			// there.
			f.decidedTo, f.hasRange = seq, true
			if w.c.dp != nil {
				w.c.dpErr("release", f.key, w.c.dp.Release(f.key, seq))
			}
		}
		w.accept(p, AcceptControl)
		w.submitTCP(f, res, p.local)
		w.settle(f)
		return
	case netparse.Covered:
		if len(f.pending) == 0 && len(f.held) == 0 {
			if f.redecide && f.openEv != nil {
				break // decided again below
			}
			if recheck = w.readSince(f, len(pkt.Payload) > 0); recheck {
				break // asked again below
			}
			if f.open || f.hasRange && seqLE(p.end, f.decidedTo) {
				w.accept(p, AcceptCovered)
				return
			}
		}
	}
	// Hold, Decide, Covered: the packet waits for the effects its bytes
	// belong to.
	for _, h := range f.held {
		if h.seq == p.seq && h.end == p.end {
			// A retransmission: the client waits for acknowledgments
			// of bytes the loop holds.
			w.drop(p, DropDuplicate)
			w.submitTCP(f, res, p.local)
			w.settle(f)
			w.part(f, p.time)
			return
		}
	}
	if len(f.held)+1 > w.c.cfg.FlowPackets || f.bytes+len(pkt.Payload) > w.c.cfg.FlowBytes {
		w.drop(p, DropFlowLimit)
		w.refuseFlow(f, DropFlowLimit, true)
		return
	}
	if w.hold(p) {
		f.held = append(f.held, p)
		f.bytes += int(p.end - p.seq)
		f.lastHeld = p.time
		w.holding[f] = struct{}{}
	}
	if res.Action == netparse.Covered && f.redecide && f.openEv != nil && len(f.pending) == 0 {
		f.redecide, f.open = false, false
		ev := *f.openEv
		ev.Time = p.time
		e := &effect{flow: f, tcp: true, span: netparse.SpanOpen, seq: p.seq, ev: &ev}
		f.pending = append(f.pending, e)
		w.holding[f] = struct{}{}
		w.submit(e, Meta{Flow: f.key, Kind: netparse.KindTCPOpaque, Span: netparse.SpanOpen, Seq: p.seq, Time: p.time, Local: p.local, Redecide: true})
	}
	if recheck && len(f.pending) == 0 {
		w.startRecheck(f, p)
	}
	w.submitTCP(f, res, p.local)
	w.settle(f)
}

// submitTCP hands the effects of a TCP result to the decider, in stream
// order.
func (w *worker) submitTCP(f *flowState, res *netparse.Result, local bool) {
	for i := range res.Effects {
		if f.refused {
			return
		}
		w.submitStream(f, &res.Effects[i], local)
	}
}

// submitStream hands one effect of a TCP stream to the decider.
func (w *worker) submitStream(f *flowState, e *netparse.Effect, local bool) {
	ev := e.Event()
	fe := &effect{flow: f, tcp: true, span: e.Span, seq: e.Seq, end: e.End, ev: &ev,
		headOnly: e.Kind == netparse.KindHTTP && e.HTTP.HeadOnly}
	f.pending = append(f.pending, fe)
	w.holding[f] = struct{}{}
	w.submit(fe, Meta{Flow: f.key, Kind: e.Kind, Span: e.Span, Seq: e.Seq, End: e.End, Time: e.Time, Local: local})
}

// submit hands an effect to the decision pool; when the pool's queue is
// full the effect is refused at once.
func (w *worker) submit(e *effect, m Meta) {
	w.readStamp(e)
	w.nextID++
	e.id = w.nextID
	w.effects[e.id] = e
	now := time.Now()
	e.submitted = now
	e.deadline = now.Add(w.c.cfg.HoldTimeout)
	if m.Time.IsZero() {
		m.Time = now
	}
	if w.decideNow(e, m) {
		return
	}
	dctx, cancelDeadline := context.WithDeadline(w.c.ctx, e.deadline)
	ctx, cancel := context.WithCancelCause(dctx)
	e.cancel = func(cause error) { cancel(cause); cancelDeadline() }
	select {
	case w.c.jobs <- &job{w: w, id: e.id, meta: m, ev: *e.ev, ctx: ctx, cancel: e.cancel, timed: w.c.cfg.Timing != nil}:
	default:
		e.cancel(nil)
		w.finish(e, Refuse, DropOverload)
	}
}

// decideNow decides e on the worker's goroutine when the Decider can
// without blocking (InlineDecider): no hand-off to the decision pool and
// back. It reports false when e goes to the pool.
func (w *worker) decideNow(e *effect, m Meta) bool {
	d := w.c.inline
	if d == nil || w.c.cfg.handOff {
		return false
	}
	var start time.Time
	timed := w.c.cfg.Timing != nil
	if timed {
		start = time.Now()
	}
	out, ok, err := w.c.safeDecideNow(d, m, *e.ev)
	if err == nil && !ok {
		return false
	}
	r := w.c.outcome(w, e.id, out, err)
	if timed {
		now := time.Now()
		r.tm = &decTiming{start: start, end: now, result: now}
	}
	w.result(r)
	if len(out.Resolutions) > 0 {
		// Through the workers' result channels, as from the pool: this
		// worker's own may be among them, and it must not wait on itself.
		go func() {
			for _, res := range out.Resolutions {
				w.c.resolve(res)
			}
		}()
	}
	return true
}

func (w *worker) handleDatagram(p *packet, pkt *netparse.Packet, res *netparse.Result) {
	switch res.Action {
	case netparse.Decide:
	case netparse.Drop:
		w.drop(p, DropRetry)
		return
	default:
		w.drop(p, DropParser)
		if pkt.Reassembled {
			w.dropFrags(pkt.Datagram, DropFragment)
		}
		return
	}
	if len(res.Effects) != 1 {
		w.drop(p, DropParser)
		return
	}
	e := &res.Effects[0]
	key := datagramKey(pkt)
	flowVerdict, recheck := false, false
	if pkt.Proto == netparse.ProtoUDP && e.Kind != netparse.KindDNS {
		quic := e.Kind == netparse.KindQUIC || errors.Is(e.Opaque, netparse.ErrOpaqueQUIC)
		flowVerdict = quic || w.c.cfg.ReleaseUDPFlows
		if f := w.flows[key]; f != nil && f.open && !f.redecide && !pkt.Reassembled {
			if recheck = w.readSince(f, true); !recheck {
				w.accept(p, AcceptCovered)
				return
			}
		}
	}
	if p.gso && pkt.Proto == netparse.ProtoUDP && (e.Kind == netparse.KindDNS || e.Kind == netparse.KindUDP) {
		e.Kind, e.Opaque = netparse.KindUDP, errUDPSuperPacket
	}
	ev := e.Event()
	de := &effect{ev: &ev, flowVerdict: flowVerdict, span: netparse.SpanNone, udp: pkt.Proto == netparse.ProtoUDP, key: key}
	if pkt.Reassembled {
		de.packets = append(de.packets, w.frags[pkt.Datagram]...)
		delete(w.frags, pkt.Datagram)
	}
	if !w.hold(p) {
		w.dropAll(de.packets, DropBudget)
		return
	}
	de.packets = append(de.packets, p)
	if flowVerdict {
		f := w.flow(key, p.time)
		f.udp = true
		if f.redecide {
			f.redecide, f.open = false, false
		}
		de.flow = f
	}
	w.dgq[key] = append(w.dgq[key], de)
	m := Meta{Flow: key, Kind: e.Kind, Span: e.Span, Time: e.Time, Local: p.local}
	if recheck && de.flow != nil {
		m = asRecheck(de, m)
	}
	w.submit(de, m)
}

// errUDPSuperPacket is why a UDP packet queued whole as a GSO packet is
// decided as opaque: with UDP segmentation offload (a guest's
// UDP_SEGMENT, a VMM's tap with TUN_F_USO) it is several datagrams
// that the kernel splits only after the verdict, and the queue shows
// neither its segment size nor where each datagram starts. Parsed as one
// datagram, a DNS super-packet would be decided by its first query while
// the others ride along. (A UFO datagram, one datagram the kernel
// fragments, looks the same from the queue and is decided the same.)
var errUDPSuperPacket = errors.New("nfq: udp gso packet: datagram boundaries not visible")

// datagramKey is the fast path's key of a non-TCP packet.
func datagramKey(pk *netparse.Packet) tcx.FlowKey {
	k := tcx.FlowKey{Src: pk.Src, Dst: pk.Dst, Proto: pk.Proto}
	switch pk.Proto {
	case netparse.ProtoUDP:
		k.SrcPort, k.DstPort = pk.SrcPort, pk.DstPort
	case netparse.ProtoICMP, netparse.ProtoICMPv6:
		k.DstPort = uint16(pk.ICMPType)<<8 | uint16(pk.ICMPCode)
		if echoType(pk.Proto, pk.ICMPType) {
			k.SrcPort = pk.ICMPID
		}
	}
	return k
}

func (w *worker) dropFrags(k netparse.FragKey, r Reason) {
	if ps, ok := w.frags[k]; ok {
		w.dropAll(ps, r)
		delete(w.frags, k)
	}
}

// result applies a decision.
func (w *worker) result(r result) {
	e := w.effects[r.id]
	if e == nil || !e.tcp && e.verdict != 0 {
		w.c.late.Add(1)
		return
	}
	if r.tm != nil {
		if r.tm.result.IsZero() {
			r.tm.result = time.Now()
		}
		e.tm = r.tm
	}
	switch r.verdict {
	case Hold:
		e.ticket = r.ticket
		w.c.deferred.Add(1)
	case Release:
		w.c.released.Add(1)
		w.finish(e, Release, r.reason)
	default:
		if e.recheck != nil {
			w.recheckFailed(e)
			return
		}
		w.c.refused.Add(1)
		w.finish(e, Refuse, r.reason)
	}
}

// finish settles an effect with its final verdict. A TCP effect's
// verdict applies in stream order (settle); a datagram's in the order
// the flow's datagrams arrived, so the loop never reorders a flow.
func (w *worker) finish(e *effect, v Verdict, r Reason) {
	if e.tcp {
		w.forgetEffect(e)
		e.verdict, e.reason = v, r
		w.settle(e.flow)
		return
	}
	if e.verdict != 0 {
		return
	}
	e.verdict, e.reason = v, r
	if e.ticket != 0 {
		w.c.unregister(e.ticket)
		e.ticket = 0
	}
	q := w.dgq[e.key]
	for len(q) > 0 && q[0].verdict != 0 {
		w.applyDatagram(q[0])
		q[0] = nil
		q = q[1:]
	}
	if len(q) == 0 {
		delete(w.dgq, e.key)
	} else {
		w.dgq[e.key] = q
	}
}

// applyDatagram gives a decided datagram effect's packets their verdict.
func (w *worker) applyDatagram(e *effect) {
	delete(w.effects, e.id)
	v, r := e.verdict, e.reason
	accept := v == Release
	if !accept && r.Accept() {
		r = DropRefused
	}
	if f := e.flow; f != nil && e.flowVerdict {
		switch {
		case accept:
			f.open, f.openEv, f.stamp = true, e.ev, e.stamp
			w.releaseOpen(f)
		case e.ev.Op == "quic:initial" || errors.Is(errOpaque(e.ev), netparse.ErrOpaqueQUIC):
			f.refused = true
			if w.c.dp != nil {
				w.c.dpErr("refuse", f.key, w.c.dp.Refuse(f.key))
			}
		}
	}
	if !accept && len(e.packets) == 1 && e.udp && !w.c.cfg.NoReject {
		// Tell the client, so that it fails at once rather than waiting
		// for an answer that never comes (a resolver's timeout).
		last := e.packets[len(e.packets)-1]
		if last.hasHW && len(last.data) > 0 {
			dns := w.c.cfg.DNSRefusal && e.ev != nil && e.ev.Op == "dns:query"
			if err := w.c.out.unreachable(unreachInfo{orig: last.data, hw: last.hw, ifindex: last.indev, dns: dns}); err != nil {
				w.c.rstErrs.Add(1)
			} else {
				w.c.unreach.Add(1)
			}
		}
	}
	for _, p := range e.packets {
		stampDecision(p, e)
		w.unhold(p, accept, r)
	}
	e.packets = nil
}

// errOpaque says whether an event was opaque QUIC (the parser's reason is
// kept in a field).
func errOpaque(ev *decide.Event) error {
	for _, f := range ev.Fields {
		if f.Name == netparse.FieldOpaqueReason && f.Value == netparse.ErrOpaqueQUIC.Error() {
			return netparse.ErrOpaqueQUIC
		}
	}
	return nil
}

// forgetEffect removes an effect from the worker's table and its ticket.
func (w *worker) forgetEffect(e *effect) {
	delete(w.effects, e.id)
	if e.ticket != 0 {
		w.c.unregister(e.ticket)
		e.ticket = 0
	}
}

// dropEffect drops a datagram effect's packets (TCP effects' packets are
// held by their flow).
func (w *worker) dropEffect(e *effect, r Reason) {
	w.forgetEffect(e)
	w.dropAll(e.packets, r)
	e.packets = nil
}

// settle applies the decided effects at the front of a flow, in stream
// order: a refusal refuses the flow; releases move the released range and
// accept the held packets it now covers.
func (w *worker) settle(f *flowState) {
	if f.refused {
		return
	}
	changed := false
	var by *effect // the last effect released here (Config.Timing)
	partReleased := false
	for len(f.pending) > 0 && f.pending[0].verdict != 0 {
		e := f.pending[0]
		by = e
		if e.verdict != Release {
			w.refuseFlow(f, e.reason, true)
			return
		}
		switch e.span {
		case netparse.SpanBytes:
			if !f.hasRange || seqLE(f.decidedTo, e.end) {
				f.decidedTo, f.hasRange = e.end, true
			}
		default: // open, flow: the rest of the connection
			f.open, f.openEv, f.stamp = true, e.ev, e.stamp
		}
		switch {
		case e.headOnly:
			f.bodyOf = e.ev
		case !e.part:
			f.bodyOf = nil
		default:
			partReleased = true
		}
		changed = true
		f.pending[0] = nil
		f.pending = f.pending[1:]
	}
	for _, e := range f.pending {
		if e.verdict != 0 && e.verdict != Release {
			w.refuseFlow(f, e.reason, true)
			return
		}
	}
	if partReleased {
		w.parser.Touch(netip.AddrPortFrom(f.key.Src, f.key.SrcPort), netip.AddrPortFrom(f.key.Dst, f.key.DstPort), time.Now())
	}
	// The fast path first, so that what follows the released packets
	// (ACKs, retransmissions) no longer needs the queue.
	if changed && w.c.dp != nil {
		if f.open {
			w.releaseOpen(f)
		} else {
			w.c.dpErr("release", f.key, w.c.dp.Release(f.key, f.decidedTo))
		}
	}
	keep := f.held[:0]
	for _, p := range f.held {
		if f.open || f.hasRange && seqLE(p.end, f.decidedTo) {
			f.bytes -= int(p.end - p.seq)
			stampDecision(p, by)
			w.unhold(p, true, AcceptReleased)
			continue
		}
		keep = append(keep, p)
	}
	clear(f.held[len(keep):])
	f.held = keep
	if len(f.held) == 0 && len(f.pending) == 0 {
		delete(w.holding, f)
	}
}

// refuseFlow drops everything a TCP flow holds, refuses it on the fast
// path, forgets its parser state and, with rst, resets its client.
func (w *worker) refuseFlow(f *flowState, r Reason, rst bool) {
	if r.Accept() {
		r = DropRefused
	}
	f.refused = true
	w.dropAll(f.held, r)
	f.held, f.bytes = nil, 0
	for _, e := range f.pending {
		w.forgetEffect(e)
	}
	f.pending = nil
	f.open = false
	delete(w.holding, f)
	if f.udp {
		return
	}
	if w.c.dp != nil {
		w.c.dpErr("refuse", f.key, w.c.dp.Refuse(f.key))
	}
	w.parser.Forget(netip.AddrPortFrom(f.key.Src, f.key.SrcPort), netip.AddrPortFrom(f.key.Dst, f.key.DstPort))
	if rst && f.hasRST && !w.c.cfg.NoReject {
		f.hasRST = false
		if err := w.c.out.rst(f.rst); err != nil {
			w.c.rstErrs.Add(1)
			w.c.cfg.Logger.Warn("nfq: send rst", "flow", f.key.String(), "err", err)
		} else {
			w.c.rsts.Add(1)
		}
	}
}

// forgetFlow drops a flow's held packets and state without refusing it
// (the guest replaced or reset the connection).
func (w *worker) forgetFlow(f *flowState, r Reason) {
	w.dropAll(f.held, r)
	f.held = nil
	for _, e := range f.pending {
		w.forgetEffect(e)
	}
	f.pending = nil
	delete(w.holding, f)
	delete(w.flows, f.key)
}

// clientGone tells the decisions of a flow's effects still undecided
// that nobody waits for them any more.
func (w *worker) clientGone(f *flowState, reason string) {
	for _, e := range f.pending {
		w.effectGone(e, reason)
	}
}

// effectGone: nobody waits for e any more. A decision in progress ends
// (its context's cause is decide.ErrClientGone); a held one is reported
// to Config.ClientGone. Either way the verdict comes as usual (refused).
func (w *worker) effectGone(e *effect, reason string) {
	if e.gone || e.verdict != 0 {
		return
	}
	e.gone = true
	if e.cancel != nil {
		e.cancel(fmt.Errorf("%w: %s", decide.ErrClientGone, reason))
	}
	if e.ticket != 0 && w.c.cfg.ClientGone != nil {
		w.c.cfg.ClientGone(e.ticket, reason)
	}
}

// dnsClientsGone gives up the undecided DNS queries of flows whose
// client sent nothing for DNSClientWindow.
func (w *worker) dnsClientsGone(now time.Time) {
	for _, q := range w.dgq {
		last := q[len(q)-1]
		if len(last.packets) == 0 || now.Sub(last.packets[len(last.packets)-1].time) < w.c.cfg.DNSClientWindow {
			continue
		}
		for _, e := range q {
			if e.ev != nil && e.ev.Op == "dns:query" {
				w.effectGone(e, fmt.Sprintf("the client stopped retransmitting the query for %s", w.c.cfg.DNSClientWindow))
			}
		}
	}
}

// wake makes the next tick come within tickEvery: the worker's state may
// have changed (a packet, a decision, a control function). Called with
// w.mu held, after every change; it costs a comparison when the timer
// runs at tickEvery already. The tick then sets its own next delay.
func (w *worker) wake() {
	if w.armed != tickEvery {
		w.armed = tickEvery
		w.timer.Reset(tickEvery)
	}
}

// nextTick is the delay before the next tick (0: none until something
// happens, see wake): tickEvery while the worker holds anything a timeout
// applies to (held packets, pending effects, fragments, DNS queries, a
// resolution kept for a ticket not yet registered); while it only
// remembers idle flows, until the first of them is idle for FlowIdle (the
// parser's flows follow the worker's: the same packets update both; its
// flows without one of the worker's go at most FlowIdle later).
func (w *worker) nextTick(now time.Time) time.Duration {
	if len(w.holding) > 0 || len(w.effects) > 0 || len(w.frags) > 0 || len(w.dgq) > 0 || w.c.hasEarly() {
		return tickEvery
	}
	idle := w.parser.Config().FlowIdle
	var next time.Duration
	for _, f := range w.flows {
		if d := f.last.Add(idle).Sub(now); next == 0 || d < next {
			next = max(d, tickEvery)
		}
	}
	if next == 0 && w.parser.Flows() > 0 {
		next = idle
	}
	return next
}

// tick expires what waited too long.
func (w *worker) tick(now time.Time) {
	w.dnsClientsGone(now)
	if now.Sub(w.expired) >= 100*time.Millisecond {
		w.expired = now
		res := w.parser.Expire(w.expireClock(now))
		for _, k := range res.Expired {
			w.dropFrags(k, DropFragment)
		}
		for i := range res.Effects {
			e := &res.Effects[i]
			if e.Proto != netparse.ProtoTCP {
				continue
			}
			k := tcx.FlowKey{Src: e.Src.Addr(), Dst: e.Dst.Addr(), SrcPort: e.Src.Port(), DstPort: e.Dst.Port(), Proto: tcx.ProtoTCP}
			if f := w.flow(k, now); !f.refused {
				w.submitStream(f, e, false)
			}
		}
		w.c.sweepEarly(now)
	}
	for _, e := range w.effects {
		if now.After(e.deadline) && e.verdict == 0 {
			w.c.refused.Add(1)
			if e.tcp {
				w.refuseFlow(e.flow, DropHoldTimeout, true)
			} else {
				w.finish(e, Refuse, DropHoldTimeout)
			}
		}
	}
	for f := range w.holding {
		switch {
		case len(f.held) > 0 && now.Sub(f.held[0].time) > w.c.cfg.HoldTimeout:
			w.refuseFlow(f, DropHoldTimeout, true)
		case f.bodyOf != nil && len(f.held) > 0 && now.Sub(f.lastHeld) >= w.c.cfg.PartAfter:
			w.part(f, now)
		}
	}
	for k, ps := range w.frags {
		if len(ps) > 0 && now.Sub(ps[0].time) > w.c.cfg.HoldTimeout {
			w.dropFrags(k, DropFragment)
		}
	}
	idle := w.parser.Config().FlowIdle
	for k, f := range w.flows {
		if _, busy := w.holding[f]; !busy && now.Sub(f.last) > idle {
			delete(w.flows, k)
		}
	}
}

// revokeOpen makes every flow released to its end decided again at its
// next packet.
func (w *worker) revokeOpen() int {
	n := 0
	for _, f := range w.flows {
		if !f.open || f.refused || f.openEv == nil {
			continue
		}
		f.open, f.redecide = false, true
		n++
		if w.c.dp != nil {
			w.c.dpErr("forget", f.key, w.c.dp.Forget(f.key))
		}
	}
	return n
}

// part decides the body bytes a flow holds as one part of the body whose
// head was released, when the client stalls (it sends at most its
// congestion window without acknowledgments, and held bytes are not
// acknowledged). The parser still sees the whole body: when it completes,
// the body is decided once more as a whole.
func (w *worker) part(f *flowState, now time.Time) {
	if f.bodyOf == nil || len(f.pending) > 0 || !f.hasRange || f.refused || f.open {
		return
	}
	end := f.decidedTo
	var content []byte
	var ends []uint32 // where the contiguous held packets end, in order
	for progress := true; progress; {
		progress = false
		for _, p := range f.held {
			if seqLE(p.seq, end) && !seqLE(p.end, end) && len(p.payload) == int(p.end-p.seq) {
				content = append(content, p.payload[end-p.seq:]...)
				end, progress = p.end, true
				ends = append(ends, end)
			}
		}
	}
	// The part is decided on every byte held, but released only up to a
	// packet end PartHoldBack bytes short of the newest: what straddles
	// the stall is decided again, whole, with what follows it.
	rel := f.decidedTo
	for _, x := range ends {
		if seqLE(x+uint32(w.c.cfg.PartHoldBack), end) {
			rel = x
		}
	}
	if rel == f.decidedTo {
		return
	}
	ev := partEvent(f.bodyOf, content, now)
	e := &effect{flow: f, tcp: true, span: netparse.SpanBytes, seq: f.decidedTo, end: rel, ev: &ev, part: true}
	f.pending = append(f.pending, e)
	w.holding[f] = struct{}{}
	w.submit(e, Meta{Flow: f.key, Kind: netparse.KindHTTP, Span: netparse.SpanBytes, Seq: e.seq, End: e.end, Time: now})
}

// partEvent is the event of a body part: the head's fields (part=body)
// with the part as content.
func partEvent(head *decide.Event, content []byte, now time.Time) decide.Event {
	ev := *head
	ev.Time = now
	ev.Fields = make([]decide.Field, 0, len(head.Fields)+1)
	for _, f := range head.Fields {
		if f.Name == netparse.FieldPart || f.Name == netparse.FieldBody {
			continue
		}
		ev.Fields = append(ev.Fields, f)
	}
	ev.Fields = append(ev.Fields,
		decide.Field{Name: netparse.FieldPart, Role: decide.RoleControl, Value: "body"},
		decide.Field{Name: netparse.FieldBody, Role: decide.RoleContent, Value: string(content)})
	ev.Content = string(content)
	return ev
}

// expireClock is the time the parser's Expire sees: held back while a
// body part is being decided, so that the parser does not give up on the
// body (and decide the rest of the connection as one opaque effect)
// because the client stalls waiting for that decision.
func (w *worker) expireClock(now time.Time) time.Time {
	limit := now
	pt := w.parser.Config().PendingTimeout
	for f := range w.holding {
		for _, e := range f.pending {
			if e.part {
				if t := e.submitted.Add(pt / 2); t.Before(limit) {
					limit = t
				}
			}
		}
	}
	return limit
}
