package daemon

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func keys(t *lruTable[int, string]) []int {
	var ks []int
	for el := t.order.Front(); el != nil; el = el.Next() {
		ks = append(ks, el.Value.(*lruEntry[int, string]).key)
	}
	return ks
}

func TestLRUTable(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	tab := newLRUTable[int, string](3, time.Minute, clk.now)
	for i := 1; i <= 3; i++ {
		tab.put(i, fmt.Sprint(i))
	}
	if _, ok := tab.get(1); !ok { // 1 is now the most recent
		t.Fatal("1 missing")
	}
	tab.put(4, "4") // over the bound: 2, the least recently touched, goes
	if diff := cmp.Diff([]int{4, 1, 3}, keys(tab)); diff != "" {
		t.Errorf("after the bound (-want +got):\n%s", diff)
	}
	if _, ok := tab.peek(2); ok {
		t.Error("2 kept over the bound")
	}
	clk.t = clk.t.Add(40 * time.Second)
	tab.put(5, "5") // evicts 3 (bound)
	if v, ok := tab.peek(4); !ok || v != "4" {
		t.Errorf("peek 4: %q %v", v, ok)
	}
	clk.t = clk.t.Add(30 * time.Second) // 4 and 1 are 70 s idle, 5 is 30 s
	if _, ok := tab.get(4); ok {
		t.Error("4 kept after idling a minute")
	}
	if diff := cmp.Diff([]int{5}, keys(tab)); diff != "" {
		t.Errorf("after idling (-want +got):\n%s", diff)
	}
	if tab.evicted != 4 {
		t.Errorf("evicted %d, want 4", tab.evicted)
	}
	tab.put(5, "five") // an update touches, adds nothing
	if v, _ := tab.get(5); v != "five" || tab.len() != 1 {
		t.Errorf("update: %q, %d entries", v, tab.len())
	}
}

// The network channel's name and flow tables stay bounded however many
// answers and flows a sandbox produces, and keep the recent ones.
func TestNetChannelTablesBounded(t *testing.T) {
	nc := &netChannel{flows: newLRUTable[flowID, flowNote](maxFlowNotes, flowNoteIdle, nil),
		bySeq: map[uint64]flowID{}, names: newLRUTable[netip.Addr, []string](maxNamedAddrs, nameIdle, nil)}
	const n = 3 * maxNamedAddrs
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}) }
	for i := 0; i < n; i++ {
		nc.learn(map[string][]netip.Addr{fmt.Sprintf("h%d.example", i): {addr(i)}})
	}
	if got := nc.names.len(); got > maxNamedAddrs {
		t.Errorf("%d addresses named, bound %d", got, maxNamedAddrs)
	}
	if !nc.resolved(fmt.Sprintf("h%d.example", n-1), addr(n-1)) {
		t.Error("the latest answer was forgotten")
	}
	if nc.resolved("h0.example", addr(0)) {
		t.Error("the oldest answer was kept over the bound")
	}
	// Many names for one address (a CDN): at most maxNamesPerAddr, the
	// latest last.
	cdn := netip.MustParseAddr("192.0.2.1")
	for i := 0; i < 100; i++ {
		nc.learn(map[string][]netip.Addr{fmt.Sprintf("site%d.example", i): {cdn}})
	}
	names, _ := nc.names.peek(cdn)
	if len(names) != maxNamesPerAddr || names[len(names)-1] != "site99.example" {
		t.Errorf("names of a shared address: %d, last %q", len(names), names[len(names)-1])
	}
	for i := 0; i < n; i++ {
		k := tcx.FlowKey{Src: addr(i), Dst: cdn, SrcPort: uint16(i), DstPort: 443, Proto: 6}
		nc.note(k, decide.Decision{Seq: uint64(i), Verdict: decide.Release})
	}
	if got := nc.flows.len(); got > maxFlowNotes {
		t.Errorf("%d flow notes, bound %d", got, maxFlowNotes)
	}
}
