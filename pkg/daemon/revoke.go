package daemon

import (
	"sync/atomic"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/nfq"
)

// openFlows is the verdict loop whose released opaque flows are decided
// again when the agent reads something more sensitive than it had (DESIGN:
// "a released connection whose agent has read new sensitive values since
// the decision is decided again before more data passes"). An opaque flow
// (TLS without interception, a stream carbd cannot parse) is released to
// its end on a decision that took it to carry what the agent had read then;
// once the agent has read more, that decision no longer covers it.
type openFlows struct {
	loop atomic.Pointer[nfq.Loop]
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
