package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/intercept"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/nfq"
)

// The policy's intercept section in carbd run (docs/interception.md):
// server names passed through opaque, clients that refuse carbd's CA,
// and QUIC to the intercepted ports.

// codeQUICRefused is the reason of a UDP datagram to an intercepted port
// refused while interception is on.
const codeQUICRefused = "quic-not-intercepted"

// passes reports whether a connection with server name sni passes
// through opaque: the policy's intercept.pass, or (on_refused_ca: pass)
// a server name whose client refused carbd's CA earlier in the run.
func (ic *interceptor) passes(sni string) bool {
	pol := ic.nc.d.engine.Policy()
	if pol.Intercept.Passes(sni) {
		return true
	}
	if sni == "" || pol.Intercept.OnRefusedCA != decide.RefusedCAPass {
		return false
	}
	ic.mu.Lock()
	defer ic.mu.Unlock()
	return ic.refusedCA[sni]
}

// route chooses, from a redirected connection's ClientHello, between
// interception (the proxy decides tls:connect, then each request) and an
// opaque pass-through decided here, before any byte goes upstream, as
// TLS was before interception: one tls:connect effect by its server
// name, opaque (carrying everything the agent read so far).
func (ic *interceptor) route(ctx context.Context, client, dst netip.AddrPort, h *intercept.Hello) intercept.Route {
	if !ic.passes(h.SNI) {
		return intercept.RouteIntercept
	}
	// The level read before the decision: whatever is read while it is
	// decided makes the next chunk decided again.
	lvl := ic.nc.d.engine.ReadLevel()
	if v := ic.decide(ctx, client, dst, ic.connectEvent(dst, h.SNI, true)); !v.Release {
		ic.nc.d.log.Info("opaque tls refused", "client", client, "dst", dst, "sni", h.SNI)
		return intercept.RouteRefuse
	}
	ic.mu.Lock()
	ic.passing[client] = lvl
	ic.mu.Unlock()
	ic.noteVerdict(client, dst, "passed", "")
	return intercept.RoutePass
}

// recheck runs before each chunk a passed connection's client sends: the
// connection is decided again once the agent has read something more
// sensitive than when it was last decided (its content is opaque), and
// nothing passes after a component failed.
func (ic *interceptor) recheck(ctx context.Context, client, dst netip.AddrPort, h *intercept.Hello) error {
	d := ic.nc.d
	if cf := d.sup.Err(); cf != nil {
		return fmt.Errorf("carbd: %s failed: nothing is released", cf.Component)
	}
	// What the agent read before it sent this chunk must be known (as
	// for every decision): fail closed if it cannot be.
	if err := d.files.syncTracing(ctx); err != nil {
		return fmt.Errorf("carbd could not establish what the agent read before this data: %w", err)
	}
	lvl := d.engine.ReadLevel()
	ic.mu.Lock()
	at, ok := ic.passing[client]
	ic.mu.Unlock()
	if ok && lvl <= at {
		return nil
	}
	if v := ic.decide(ctx, client, dst, ic.connectEvent(dst, h.SNI, true)); !v.Release {
		return errors.New(v.Notice)
	}
	ic.mu.Lock()
	ic.passing[client] = lvl
	ic.mu.Unlock()
	return nil
}

// passed ends a passed connection.
func (ic *interceptor) passed(client, dst netip.AddrPort, h *intercept.Hello, up, down int64, err error) {
	ic.mu.Lock()
	delete(ic.passing, client)
	ic.mu.Unlock()
	what := fmt.Sprintf("passed opaque: %d bytes up, %d down", up, down)
	if err != nil {
		what += ", ended: " + err.Error()
	}
	ic.noteVerdict(client, dst, "passed", what)
	ic.nc.d.log.Debug("opaque tls ended", "client", client, "dst", dst, "sni", h.SNI, "up", up, "down", down, "err", err)
}

// caRefused records a client that refused carbd's certificate: a
// tls:ca-refused audit record naming the server name; with
// on_refused_ca: pass, that server name passes through opaque from now
// on.
func (ic *interceptor) caRefused(client, dst netip.AddrPort, h *intercept.Hello, alert string) {
	d := ic.nc.d
	onRefused := d.engine.Policy().Intercept.OnRefusedCA
	if onRefused == decide.RefusedCAPass && h.SNI != "" {
		ic.mu.Lock()
		ic.refusedCA[h.SNI] = true
		ic.mu.Unlock()
	}
	d.log.Warn("a TLS client refused carbd's CA", "client", client, "dst", dst, "sni", h.SNI, "alert", alert, "on_refused_ca", onRefused.String())
	ic.noteVerdict(client, dst, "closed", "tls:ca-refused ("+alert+")")
	if d.audit == nil {
		return
	}
	rec := struct {
		Type        string    `json:"type"`
		Time        time.Time `json:"time"`
		SNI         string    `json:"sni"`
		Client      string    `json:"client"`
		Dst         string    `json:"dst"`
		Alert       string    `json:"alert"`
		OnRefusedCA string    `json:"on_refused_ca"`
	}{"tls:ca-refused", time.Now().UTC(), h.SNI, client.String(), dst.String(), alert, onRefused.String()}
	d.auditRecord(rec)
}

// refusesUDP reports whether a UDP effect is refused because it goes to
// an intercepted port while interception is on: QUIC cannot be
// intercepted, and clients fall back to TCP, which is. A QUIC Initial
// whose server name passes through opaque is decided as before.
func (ic *interceptor) refusesUDP(m nfq.Meta, ev *decide.Event) bool {
	if ic == nil || m.Flow.Proto != 17 || !slices.Contains(ic.redirect, m.Flow.DstPort) {
		return false
	}
	for _, f := range ev.Fields {
		if f.Name == netparse.FieldSNI && ic.passes(f.Value) {
			return false
		}
	}
	return true
}

// refuseUDP is the verdict loop's answer to refusesUDP.
func (ic *interceptor) refuseUDP(m nfq.Meta) nfq.Outcome {
	ic.nc.d.log.Debug("udp to an intercepted port refused", "flow", m.Flow)
	return nfq.Outcome{Verdict: nfq.Refuse, Reason: codeQUICRefused}
}
