package nfq

import (
	"time"

	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// Timing is when one packet passed each stage of the loop, for
// Config.Timing (the first-packet latency breakdown of
// docs/verdict-loop.md). Stages a packet did not pass are zero.
type Timing struct {
	ID       uint32
	Flow     tcx.FlowKey // zero for a packet without one (a fragment, a malformed packet)
	TCPFlags uint8       // with Flow.Proto TCP
	Payload  int         // TCP payload bytes
	Accept   bool
	Reason   Reason
	// Kernel is NFQA_TIMESTAMP: the packet's software receive stamp
	// (wall clock, microseconds), taken on the receive path of the
	// interface it came in on, ahead of the TC program and netfilter.
	// Zero when the kernel gives none: it stamps packets only while some
	// socket asked for receive timestamps (SO_TIMESTAMP*).
	Kernel time.Time
	// Read: the receive goroutine had the message (netlink read and
	// attribute parsing done). Worker: the flow's worker began handling
	// the packet.
	Read, Worker time.Time
	// The decision that released (or refused) the packet: handed to the
	// decision pool (Submit), Decide called (DecideStart) and returned
	// (DecideEnd), the result taken by the worker (Result). Zero for a
	// packet given its verdict without one (a SYN, an ACK), and for one
	// decided inline (then DecideStart and DecideEnd are set, on the
	// worker).
	Submit, DecideStart, DecideEnd, Result time.Time
	// Verdict: the verdict's write began; Written: it returned.
	Verdict, Written time.Time
}

// decTiming is when a decision started and ended on the pool, carried
// back to the worker with its result when Config.Timing is set.
type decTiming struct {
	start, end, result time.Time
}

// stampWorker notes when the worker took p (Config.Timing only).
func stampWorker(p *packet) {
	if p.tm != nil {
		p.tm.Worker = time.Now()
	}
}

// stampDecision copies the timing of the decision that settles p.
func stampDecision(p *packet, e *effect) {
	if p.tm == nil || e == nil || e.tm == nil {
		return
	}
	p.tm.Submit, p.tm.DecideStart, p.tm.DecideEnd, p.tm.Result = e.submitted, e.tm.start, e.tm.end, e.tm.result
}
