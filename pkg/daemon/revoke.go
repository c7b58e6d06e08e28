package daemon

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/nfq"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// openFlows is the verdict loop whose released opaque flows are decided
// again when the agent reads something more sensitive than it had (DESIGN:
// "a released connection whose agent has read new sensitive values since
// the decision is decided again before more data passes"). An opaque flow
// (TLS without interception, a stream carbd cannot parse) is released to
// its end on a decision that took it to carry what the agent had read then;
// once the agent has read more, that decision no longer covers it.
//
// Two mechanisms, the second closing the first one's window:
//
//   - observe: when a read the file tracer delivered (or a response) raised
//     the read level, RevokeOpen makes every such flow decided again at its
//     next packet. Bytes sent between the read and its delivery would pass.
//   - the read generation: the file tracer's BPF program bumps a counter
//     shared with the TC program after every read of the working tree
//     (bpf/include/carbd/read_gen.h); the fast path releases such a flow at
//     the generation read before its decision, and queues its next data
//     packet once the generation moved. The verdict loop then asks again
//     (nfq Meta.Recheck, recheck): the tracer is drained, and the flow is
//     released again at once if the read level is still the one it was
//     decided at (one queue round trip), else decided again.
type openFlows struct {
	loop atomic.Pointer[nfq.Loop]

	mu sync.Mutex // guards levels
	// levels is the read level each flow's latest decision was made at
	// (before it); a flow whose entry is gone is decided again.
	levels *lruTable[tcx.FlowKey, decide.Level]
}

// Bounds of openFlows.levels: beyond them a flow released to its end is
// decided again at its next data after a read, not released again.
const (
	maxFlowLevels = 1 << 16
	flowLevelIdle = time.Hour
)

// noteLevel records the read level a decision of flow is made at, read
// before the decision.
func (o *openFlows) noteLevel(flow tcx.FlowKey, l decide.Level) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.levels == nil {
		o.levels = newLRUTable[tcx.FlowKey, decide.Level](maxFlowLevels, flowLevelIdle, nil)
	}
	o.levels.put(flow, l)
}

func (o *openFlows) level(flow tcx.FlowKey) (decide.Level, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.levels == nil {
		return 0, false
	}
	return o.levels.get(flow)
}

// shareReadGen creates the sandbox's read generation, for its file
// tracer and its TC program (the same map in both); the network channel
// closes it.
func (d *daemon) shareReadGen(nc *netChannel) (*ebpf.Map, error) {
	m, err := tcx.NewReadGen()
	if err != nil {
		return nil, fmt.Errorf("read generation: %w", err)
	}
	nc.closers = append(nc.closers, m.Close)
	if d.files != nil {
		d.files.readGen = m
	}
	return m, nil
}

// recheck answers the verdict loop's question about a flow released to
// its end whose data came after the agent read again (nfq Meta.Recheck):
// once every read before it is handled (the tracer drained), the release
// stands if the read level is still the one the flow was decided at.
// Refuse means "decide it again" (the loop does), never a refusal by
// itself. An intercepted connection carries nothing undecided: the proxy
// decides each of its requests.
func (nc *netChannel) recheck(ctx context.Context, m nfq.Meta) nfq.Outcome {
	if nc.icpt.handles(m.Flow.Dst, m.Flow.DstPort, m.Flow.Proto) {
		return nfq.Outcome{Verdict: nfq.Release, Reason: "intercepted"}
	}
	at, ok := nc.d.open.level(m.Flow)
	if !ok {
		return nfq.Outcome{Verdict: nfq.Refuse, Reason: "read-level-unknown"}
	}
	if t := nc.traced; t != nil {
		<-t // the file tracer is set up (startNetns)
	}
	if err := nc.d.files.syncTracing(ctx); err != nil {
		nc.d.log.Warn("released flow decided again: the file trace could not be brought up to date", "flow", m.Flow.String(), "err", err)
		return nfq.Outcome{Verdict: nfq.Refuse, Reason: "tracing-sync"}
	}
	if lvl := nc.d.engine.ReadLevel(); lvl > at {
		return nfq.Outcome{Verdict: nfq.Refuse, Reason: "read-level-rose"}
	}
	nc.d.log.Debug("released flow released again: what the agent read since is no more sensitive", "flow", m.Flow.String(), "level", at)
	return nfq.Outcome{Verdict: nfq.Release, Reason: "read-level-unchanged"}
}

// observe gives the engine a read and, when it raised the level of what
// the agent has read (decide.Engine.ReadLevel), has the verdict loop
// decide every flow released to its end again at its next packet.
// Intercepted HTTPS is decided request by request and needs no revoking;
// the pass-through parties of the intercept section are re-checked by
// their splice (intercept_pass.go).
func (d *daemon) observe(ev decide.Event) {
	before := d.engine.ReadLevel()
	d.engine.Observe(ev)
	if d.engine.ReadLevel() <= before {
		return
	}
	if l := d.open.loop.Load(); l != nil {
		if n := l.RevokeOpen(); n > 0 {
			d.log.Info("released opaque flows decided again: the agent read more sensitive data", "flows", n, "source", ev.Origin())
		}
	}
}
