package nfq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// Verdict is what a Decider says about one effect.
type Verdict uint8

const (
	// Release lets the effect's packets through and moves what it covers
	// to the fast path.
	Release Verdict = iota + 1
	// Refuse drops the effect's packets; a TCP flow is refused as a whole
	// and its client gets a RST.
	Refuse
	// Hold keeps the effect's packets queued, unverdicted, until
	// Loop.Resolve gives the final verdict for Outcome.Ticket or the hold
	// deadline passes (then: Refuse).
	Hold
)

func (v Verdict) String() string {
	switch v {
	case Release:
		return "release"
	case Refuse:
		return "refuse"
	case Hold:
		return "hold"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// Outcome is a Decider's answer for one effect.
type Outcome struct {
	Verdict Verdict
	// Reason is a short machine-readable reason, for logs and audits.
	Reason string
	// Ticket names a held effect (Verdict Hold): the Decider later calls
	// Loop.Resolve(Ticket, ...). Tickets must be unique and non-zero.
	Ticket uint64
	// Resolutions are final verdicts of effects held earlier that this
	// decision settled (a scope the engine resolved on the way).
	Resolutions []Resolution
}

// Resolution is the final verdict of a held effect.
type Resolution struct {
	Ticket  uint64
	Verdict Verdict // Release or Refuse
	Reason  string
}

// Meta is what the loop knows about an effect besides its decide.Event.
type Meta struct {
	// Flow is the flow that carries the effect, in the guest's direction.
	// For ICMP it is the key the fast path uses (tcx.ICMPEchoKey for echo
	// requests); for other protocols the ports are 0.
	Flow tcx.FlowKey
	// Kind is what the parser recognised.
	Kind netparse.Kind
	// Span, Seq, End: which client-to-server TCP bytes the effect covers.
	Span     netparse.Span
	Seq, End uint32
	// Time is when the effect's first packet was queued (or when the
	// parser gave up waiting for the rest of it).
	Time time.Time
	// Local: the packet is addressed to the host itself (netfilter's INPUT
	// hook) rather than forwarded.
	Local bool
	// Redecide: a released opaque flow being decided again after Revoke.
	Redecide bool
	// Recheck: not a decision but a question (Config.Recheck): the agent
	// read again since this flow was released to its end; does its
	// release still stand? Release: it does (the flow is released again
	// at the current read generation); Refuse: the flow is decided again
	// (Redecide), not refused. The answer needs the file tracer brought up
	// to date, which waits: an InlineDecider declines it in DecideNow.
	Recheck bool
}

// Decider decides effects; the daemon implements it over the engine
// (EngineDecider). Decide may block (an oracle); the loop calls it from a
// bounded pool of goroutines, never from the packet path, with a context
// that ends at the effect's hold deadline. It must be safe for concurrent
// use. A panic in Decide refuses the effect.
type Decider interface {
	Decide(ctx context.Context, m Meta, ev decide.Event) Outcome
}

// InlineDecider is a Decider that can decide some effects at once,
// without anything that waits: policy alone, no oracle, no lock held by
// a decision that waits. The loop asks DecideNow first, on the goroutine
// that handles the packet, and hands the effect to the decision pool
// (Decide) only when DecideNow declines: a decision that needs nothing
// costs no goroutine hand-off to the pool and back, and a question to a
// person still never stalls the packet path.
type InlineDecider interface {
	Decider
	// DecideNow decides ev and returns true when it can without
	// blocking; it returns false, having changed nothing, when the
	// decision may wait (then Decide is called on the pool). Its Outcome
	// means what Decide's does. It must be safe for concurrent use and
	// must never block; a panic refuses the effect.
	DecideNow(m Meta, ev decide.Event) (Outcome, bool)
}

// DeciderFunc adapts a function to Decider.
type DeciderFunc func(ctx context.Context, m Meta, ev decide.Event) Outcome

func (f DeciderFunc) Decide(ctx context.Context, m Meta, ev decide.Event) Outcome {
	return f(ctx, m, ev)
}

// Datapath is the fast path's verdict map (pkg/hooks/tcx's *Datapath
// implements it). The loop calls it from its workers.
type Datapath interface {
	Release(k tcx.FlowKey, tcpSeqEnd uint32) error
	ReleaseFlow(k tcx.FlowKey) error
	Refuse(k tcx.FlowKey) error
	Forget(k tcx.FlowKey) error
	Verdict(k tcx.FlowKey) (tcx.Verdict, error)
}

// Defaults.
const (
	DefaultReadBuffer     = 8 << 20
	DefaultHoldTimeout    = 10 * time.Second
	DefaultFlowPackets    = 512
	DefaultFlowBytes      = 2 << 20
	DefaultDecideWorkers  = 4
	DefaultMaxPacketLen   = 0xffff
	DefaultVerdictTimeout = time.Second
	DefaultPartAfter      = 50 * time.Millisecond
	DefaultPartHoldBack   = 4096
	DefaultPendingTimeout = 500 * time.Millisecond
)

// Config configures a Loop. The zero value of an optional field selects
// its default.
type Config struct {
	// QueueNum is the NFQUEUE number (pkg/hooks/nfrules' QueueNum).
	QueueNum uint16
	// NetNS is the path of the network namespace the queue lives in
	// (/run/netns/NAME, /proc/PID/ns/net); empty: the caller's.
	NetNS string
	// MaxQueueLen bounds the packets the kernel keeps queued for this
	// loop, held ones included; beyond it the kernel drops (never accepts:
	// the fail-open flag is never set). Required: there is no good
	// default, it bounds how many packets can be held at once.
	MaxQueueLen uint32
	// MaxPacketLen is how much of each packet the kernel copies; shorter
	// than a packet means a truncated copy, which is dropped. Default
	// 65535.
	MaxPacketLen uint32
	// ReadBuffer is the netlink socket's receive buffer in bytes
	// (SO_RCVBUFFORCE; the kernel doubles it). A burst of queued packets
	// that overflows it is dropped by the kernel (counted as
	// user_dropped). Measured: a burst of 4000 new flows lost none with 1
	// MiB of small packets and 4 MiB of any; a queued full-size packet
	// takes about 2 KiB. Default: 2 KiB per MaxQueueLen, at least 8 MiB,
	// at most 128 MiB.
	ReadBuffer int
	// GSO asks the kernel to queue GSO packets whole (NFQA_CFG_F_GSO)
	// instead of segmenting them first: fewer, larger messages for big
	// requests. Their checksums may be unfinished, which the parser then
	// does not check.
	GSO bool
	// Workers is the number of packet workers; each owns the flows that
	// hash to it (by address pair, so IP fragments land with their flow)
	// and handles their packets in order. Default: GOMAXPROCS.
	Workers int
	// DecideWorkers bounds the concurrent Decide calls. Default 4.
	DecideWorkers int
	// HoldTimeout is the longest any packet stays queued without a
	// verdict: an incomplete request, a decision that does not come, a
	// held effect nobody resolves. Past it the effect is refused (a TCP
	// flow with a RST). Default 10 s. Keep it above the parser's
	// PendingTimeout (2 s by default), which first decides what an
	// incomplete request has sent.
	HoldTimeout time.Duration
	// FlowPackets and FlowBytes bound what one flow may have held at
	// once; beyond, the flow is refused. Default 512 packets, 2 MiB.
	FlowPackets int
	FlowBytes   int
	// MaxHeld bounds the packets held by the whole loop (they occupy the
	// kernel queue): a packet that would exceed it is dropped (TCP
	// retransmits). Default: three quarters of MaxQueueLen, so that new
	// flows always find room in the queue.
	MaxHeld int
	// Parser configures the packet parser (one per worker). Its
	// PendingTimeout defaults to 500 ms here (not the parser's 2 s): a
	// request larger than the client's congestion window (about 14 kB on
	// a new connection) stalls until its head is decided, since held
	// segments are not acknowledged.
	Parser netparse.Config
	// PartAfter: the body of an HTTP request whose head was released is
	// decided in parts: when the client has sent nothing new for
	// PartAfter (or retransmits), the body bytes held so far are decided
	// as one part (an event with the head's fields and the part as
	// content), so a body larger than the client's window can complete.
	// Default 50 ms.
	PartAfter time.Duration
	// PartHoldBack: a part releases the body only up to the last packet
	// that ends PartHoldBack bytes before the newest byte held, and the
	// next part is decided from there: a value of up to PartHoldBack
	// bytes that straddles a stall is always seen whole before any of it
	// goes out. The cost: a body that stalls longer than HoldTimeout
	// with its last bytes held is refused. Default 4096.
	PartHoldBack int
	// Decider decides every effect. Required.
	Decider Decider
	// Datapath is the fast path to update on decisions; nil: none (every
	// packet then reaches the loop, and only this loop's verdicts apply).
	Datapath Datapath
	// ReleaseUDPFlows: a released plain UDP datagram releases its whole
	// flow on the fast path. Off by default: each datagram is an effect
	// and is decided on its own. (QUIC flows are released whole after
	// their Initial; DNS is always decided per query.)
	ReleaseUDPFlows bool
	// Recheck: a flow released to its end (an opaque stream, a QUIC
	// flow) is released at the fast path's read generation, read before
	// its decision (a Datapath with read generations: tcx's
	// ReleaseFlowAt). A packet with data that reaches the loop after the
	// generation moved (the agent read again) is held and the Decider is
	// asked again with Meta.Recheck set, before anything more of the flow
	// passes. Without it (or without such a Datapath) those flows pass
	// until RevokeOpen.
	Recheck bool
	// NoReject: do not answer the client of a refused TCP flow with a
	// RST, nor that of a refused UDP datagram with an ICMP
	// "administratively prohibited" error (then they wait for their own
	// timeouts).
	NoReject bool
	// DNSRefusal: a refused DNS query over UDP is answered with an
	// NXDOMAIN response from the address it was sent to (as a DNS
	// firewall's response policy zone answers), instead of the ICMP
	// error: stub resolvers (glibc, c-ares, Go) then stop at once
	// rather than retry the server. Ignored with NoReject.
	DNSRefusal bool
	// MarkMask and PassMark: an accepted packet goes back to netfilter
	// (NF_REPEAT) with mark = mark&^MarkMask | PassMark, so carbd's chain
	// returns it to the host's own rules. Default tcx.MarkMask,
	// tcx.MarkPass.
	MarkMask, PassMark uint32
	// VerdictTimeout bounds the send of one verdict. Default 1 s.
	VerdictTimeout time.Duration
	// Logger gets warnings (verdict send failures, receive errors, worker
	// panics). Nil: discarded.
	Logger *slog.Logger
	// ClientGone, when set, is told when nobody waits for a held effect
	// (Outcome.Ticket) any more: its client reset or closed the
	// connection, or replaced it, or a DNS query's client stopped
	// retransmitting (DNSClientWindow). An effect still being decided
	// learns it from its context instead: it ends with
	// decide.ErrClientGone as its cause. Called from a worker: it must
	// not block. The effect's packets stay held until its verdict.
	ClientGone func(ticket uint64, reason string)
	// DNSClientWindow: a DNS query over UDP still undecided whose client
	// sent nothing on its flow (no retransmission) for this long is
	// given up as above. Default 11 s: a stub resolver retransmits
	// within 5 s (glibc's timeout) and gives up after its attempts.
	DNSClientWindow time.Duration
	// Timing, when set, is given every packet's Timing right after its
	// verdict was written, on the goroutine that wrote it: it must be
	// quick. For measurements (the first-packet latency breakdown); nil
	// in production.
	Timing func(Timing)

	// handOff (tests and benchmarks only): every packet goes through its
	// worker's channel and every decision through the pool, as before the
	// inline paths, for same-run comparisons.
	handOff bool
}

// DefaultDNSClientWindow is Config.DNSClientWindow's default.
const DefaultDNSClientWindow = 11 * time.Second

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("nfq: invalid config")

// withDefaults validates c and fills its defaults.
func (c Config) withDefaults(numCPU int) (Config, error) {
	bad := func(format string, a ...any) (Config, error) {
		return c, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...)
	}
	if c.MaxQueueLen == 0 {
		return bad("MaxQueueLen is required (the kernel queue's bound)")
	}
	if c.Decider == nil {
		return bad("Decider is required")
	}
	if c.NetNS != "" && !filepath.IsAbs(c.NetNS) {
		return bad("NetNS %q is not an absolute path", c.NetNS)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"ReadBuffer", int64(c.ReadBuffer)}, {"Workers", int64(c.Workers)}, {"DecideWorkers", int64(c.DecideWorkers)},
		{"HoldTimeout", int64(c.HoldTimeout)}, {"FlowPackets", int64(c.FlowPackets)}, {"FlowBytes", int64(c.FlowBytes)},
		{"MaxHeld", int64(c.MaxHeld)}, {"VerdictTimeout", int64(c.VerdictTimeout)}, {"PartAfter", int64(c.PartAfter)},
		{"PartHoldBack", int64(c.PartHoldBack)},
	} {
		if f.v < 0 {
			return bad("%s is negative (%d)", f.name, f.v)
		}
	}
	if c.MaxPacketLen == 0 {
		c.MaxPacketLen = DefaultMaxPacketLen
	}
	if c.MaxPacketLen < 1280 {
		return bad("MaxPacketLen %d is below 1280: packets would be truncated", c.MaxPacketLen)
	}
	if c.ReadBuffer == 0 {
		c.ReadBuffer = min(max(DefaultReadBuffer, int(c.MaxQueueLen)*2048), 128<<20)
	}
	if c.Workers == 0 {
		c.Workers = max(numCPU, 1)
	}
	if c.DecideWorkers == 0 {
		c.DecideWorkers = DefaultDecideWorkers
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = DefaultHoldTimeout
	}
	if c.FlowPackets == 0 {
		c.FlowPackets = DefaultFlowPackets
	}
	if c.FlowBytes == 0 {
		c.FlowBytes = DefaultFlowBytes
	}
	if c.MaxHeld == 0 {
		c.MaxHeld = max(int(c.MaxQueueLen)*3/4, 1)
	}
	if c.MaxHeld > int(c.MaxQueueLen) {
		return bad("MaxHeld %d exceeds MaxQueueLen %d: held packets would fill the queue", c.MaxHeld, c.MaxQueueLen)
	}
	if c.PartHoldBack == 0 {
		c.PartHoldBack = DefaultPartHoldBack
	}
	if c.PartAfter == 0 {
		c.PartAfter = DefaultPartAfter
	}
	if c.Parser.PendingTimeout == 0 {
		c.Parser.PendingTimeout = DefaultPendingTimeout
	}
	if c.Parser.PendingTimeout >= c.HoldTimeout {
		return bad("Parser.PendingTimeout %v must be below HoldTimeout %v", c.Parser.PendingTimeout, c.HoldTimeout)
	}
	if c.VerdictTimeout == 0 {
		c.VerdictTimeout = DefaultVerdictTimeout
	}
	if c.MarkMask == 0 && c.PassMark == 0 {
		c.MarkMask, c.PassMark = tcx.MarkMask, tcx.MarkPass
	}
	if c.PassMark&^c.MarkMask != 0 || c.PassMark == 0 {
		return bad("PassMark %#x must be non-zero and inside MarkMask %#x", c.PassMark, c.MarkMask)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.DNSClientWindow <= 0 {
		c.DNSClientWindow = DefaultDNSClientWindow
	}
	return c, nil
}

// Reason is why a packet got its verdict. Every packet the loop receives
// gets exactly one verdict, counted under exactly one reason.
type Reason uint8

const (
	AcceptReleased Reason = iota // the effects its bytes belong to were released
	AcceptControl                // TCP with no payload (SYN, ACK, FIN, RST): no effect
	AcceptCovered                // bytes of effects released earlier (a retransmission, an open stream)

	DropRefused     // an effect it carries was refused
	DropFlowRefused // its flow was refused earlier
	DropMalformed   // not a decodable IP packet, or a truncated copy
	DropParser      // the parser refused it (conflicting retransmission, flow table full, bad fragment)
	DropRetry       // the parser could not take it now (checksum, window, memory): the sender retransmits
	DropDuplicate   // a copy of a packet already held
	DropHoldTimeout // held past HoldTimeout
	DropFlowLimit   // its flow held more than FlowPackets or FlowBytes
	DropBudget      // the loop held MaxHeld packets already
	DropOverload    // the decision queue was full
	DropDecideError // the Decider panicked or answered nonsense
	DropPanic       // the worker panicked on it or on its flow
	DropShutdown    // the loop stopped while it was queued
	DropFragment    // a fragment whose datagram expired or was refused
	DropStale       // held for a connection the guest reset or replaced (a new SYN on the same ports)
	NumReasons
)

var reasonNames = [NumReasons]string{
	AcceptReleased: "accept-released", AcceptControl: "accept-control", AcceptCovered: "accept-covered",
	DropRefused: "drop-refused", DropFlowRefused: "drop-flow-refused", DropMalformed: "drop-malformed",
	DropParser: "drop-parser", DropRetry: "drop-retry", DropDuplicate: "drop-duplicate",
	DropHoldTimeout: "drop-hold-timeout", DropFlowLimit: "drop-flow-limit", DropBudget: "drop-budget",
	DropOverload: "drop-overload", DropDecideError: "drop-decide-error", DropPanic: "drop-panic",
	DropShutdown: "drop-shutdown", DropFragment: "drop-fragment", DropStale: "drop-stale",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Accept reports whether packets counted under r were accepted.
func (r Reason) Accept() bool { return r <= AcceptCovered }

// Stats are the loop's counters. Every packet received is, at any moment,
// either held or counted under exactly one verdict reason:
// Received == Accepted() + Dropped() + Held.
type Stats struct {
	Received uint64
	Held     int64 // packets queued now without a verdict
	Verdicts [NumReasons]uint64
	// Effects decided, by final verdict; Held effects are counted once
	// they resolve. Late counts decisions that arrived after their effect
	// was already settled (hold timeout, shutdown).
	Released, Refused, Deferred, Late uint64
	// DoubleVerdicts counts attempts to give a packet a second verdict
	// (always refused; a bug if not zero).
	DoubleVerdicts uint64
	VerdictErrors  uint64 // verdicts the kernel did not take (it drops those packets)
	RecvErrors     uint64 // receive errors other than overruns
	RecvOverruns   uint64 // ENOBUFS: the socket buffer overflowed, the kernel dropped
	Panics         uint64
	RSTs           uint64 // RSTs sent to clients of refused TCP flows
	Unreachables   uint64 // ICMP errors sent to clients of refused UDP datagrams
	RSTErrors      uint64 // RSTs and ICMP errors that could not be sent
	DatapathErrors uint64 // fast-path updates that failed
	// ReadBuffer is the socket's receive buffer as the kernel reports it.
	ReadBuffer int
	// Kernel is the queue's line of /proc/net/netfilter/nfnetlink_queue
	// (zero when unavailable; KernelErr says why).
	Kernel    QueueProc
	KernelErr string
}

// Accepted sums the accept reasons.
func (s *Stats) Accepted() uint64 {
	var n uint64
	for r := Reason(0); r < NumReasons; r++ {
		if r.Accept() {
			n += s.Verdicts[r]
		}
	}
	return n
}

// Dropped sums the drop reasons.
func (s *Stats) Dropped() uint64 {
	var n uint64
	for r := Reason(0); r < NumReasons; r++ {
		if !r.Accept() {
			n += s.Verdicts[r]
		}
	}
	return n
}

// String renders the non-zero verdict counters.
func (s *Stats) String() string {
	out := fmt.Sprintf("received %d held %d", s.Received, s.Held)
	for r := Reason(0); r < NumReasons; r++ {
		if s.Verdicts[r] != 0 {
			out += fmt.Sprintf(" %s=%d", r, s.Verdicts[r])
		}
	}
	return out + fmt.Sprintf(" | effects released %d refused %d deferred %d late %d | kernel dropped %d user_dropped %d",
		s.Released, s.Refused, s.Deferred, s.Late, s.Kernel.Dropped, s.Kernel.UserDropped)
}
