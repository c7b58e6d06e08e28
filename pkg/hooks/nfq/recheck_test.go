package nfq

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// genDatapath records fast-path updates and has a read generation.
type genRecDatapath struct {
	*recDatapath
	gen atomic.Uint64
}

func (d *genRecDatapath) Generation() (uint64, error) { return d.gen.Load(), nil }
func (d *genRecDatapath) ReleaseFlowAt(k tcx.FlowKey, gen uint64) error {
	return d.add(fmt.Sprintf("release-at %d %d", k.SrcPort, gen))
}

// TestCoreRecheck: with Config.Recheck, a flow released to its end is
// released at the read generation read before its decision; while the
// generation stays, its data is covered without a question; once it
// moved, its next data is held and the Decider asked (Meta.Recheck): a
// yes releases the flow again at the new generation, a no has the flow
// decided again (here refused: the data never passes). Datagrams of a
// QUIC-like flow released whole are asked about the same way.
func TestCoreRecheck(t *testing.T) {
	var stands atomic.Bool
	stands.Store(true)
	var rechecks, redecides atomic.Int32
	dec := newDecider(func(m Meta, ev decide.Event) Outcome {
		switch {
		case m.Recheck:
			rechecks.Add(1)
			if stands.Load() {
				return Outcome{Verdict: Release}
			}
			return Outcome{Verdict: Refuse}
		case m.Redecide:
			redecides.Add(1)
			return Outcome{Verdict: Refuse}
		}
		return Outcome{Verdict: Release}
	})
	gdp := &genRecDatapath{recDatapath: &recDatapath{}}
	h := newHarness(t, dec, func(c *Config) { c.Datapath, c.Recheck, c.ReleaseUDPFlows = gdp, true, true })
	gdp.gen.Store(7)
	c := h.dial(cli4, srv4, 40000, 9150)
	h.want(c.write("\x00\x01opaque protocol hello"), true)
	if !slices.Contains(gdp.log(), "release-at 40000 7") {
		t.Fatalf("fast path %q, want the flow released at generation 7", gdp.log())
	}
	decided := len(dec.events())
	h.want(c.write("more of the stream"), true)
	if n := len(dec.events()); n != decided {
		t.Fatalf("%d decisions for data at the same generation, want none", n-decided)
	}

	gdp.gen.Store(8) // the agent read something that did not change what it has read
	h.want(c.write("after a read"), true)
	if rechecks.Load() != 1 || !slices.Contains(gdp.log(), "release-at 40000 8") {
		t.Fatalf("%d questions, fast path %q: want one, and the flow released at generation 8", rechecks.Load(), gdp.log())
	}
	h.want(c.write("still at 8"), true)

	gdp.gen.Store(9) // the agent read more
	stands.Store(false)
	h.want(c.write("the secret"), false)
	if rechecks.Load() != 2 || redecides.Load() != 1 {
		t.Fatalf("%d questions, %d re-decisions: want 2 and 1", rechecks.Load(), redecides.Load())
	}
	log := gdp.log()
	if i := slices.Index(log, "forget 40000"); i < 0 || !slices.Contains(log[i:], "refuse 40000") {
		t.Errorf("fast path %q: want the flow forgotten, then refused", log)
	}
	h.want(c.write("more after the refusal"), false)

	// A datagram flow released whole.
	stands.Store(true)
	gdp.gen.Store(20)
	h.want(h.send(udpPkt(t, cli4, srv4, 5000, 9999, []byte("first"))), true)
	h.want(h.send(udpPkt(t, cli4, srv4, 5000, 9999, []byte("second"))), true)
	if !slices.Contains(gdp.log(), "release-at 5000 20") {
		t.Fatalf("fast path %q, want the datagram flow released at generation 20", gdp.log())
	}
	gdp.gen.Store(21)
	h.want(h.send(udpPkt(t, cli4, srv4, 5000, 9999, []byte("after a read"))), true)
	if rechecks.Load() != 3 || !slices.Contains(gdp.log(), "release-at 5000 21") {
		t.Fatalf("%d questions, fast path %q: want 3, and the flow released at 21", rechecks.Load(), gdp.log())
	}
	gdp.gen.Store(22)
	stands.Store(false)
	before := len(dec.events())
	h.want(h.send(udpPkt(t, cli4, srv4, 5000, 9999, []byte("the secret"))), true) // decided again: released by the decider's default
	if rechecks.Load() != 4 || len(dec.events())-before != 2 {
		t.Fatalf("%d questions and %d calls for the datagram, want 4 and 2 (the question, then its decision)", rechecks.Load(), len(dec.events())-before)
	}
}
