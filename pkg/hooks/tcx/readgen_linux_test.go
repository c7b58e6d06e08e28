package tcx

import (
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// TestSharedReadGen: a flow released at a read generation carries
// datagrams to the world until the generation moves in the map handed to
// Attach (as the file tracer moves it), then its datagrams are queued; a
// release at the new generation passes them again. The map is pinned
// with the others, an adopter reads the same generation, and a replaced
// program keeps comparing against it.
func TestSharedReadGen(t *testing.T) {
	gen, err := NewReadGen()
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	e := newEnv(t, envOpt{rules: true, readGen: gen})
	q := e.dropQueue(t)
	guest, world := e.addrs(4)
	sink := tcxtest.UDPSink(t, e.topo.World, netip.AddrPortFrom(world, 9100))
	k := FlowKey{Src: guest, Dst: world, SrcPort: 41100, DstPort: 9100, Proto: ProtoUDP}
	bump := func(to uint64) {
		t.Helper()
		if err := gen.Update(uint32(0), to, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if g, err := e.d.Generation(); err != nil || g != to {
			t.Fatalf("datapath reads generation %d (%v), want %d", g, err, to)
		}
	}
	bump(3)
	if err := e.d.ReleaseFlowAt(k, 3); err != nil {
		t.Fatal(err)
	}
	if v, err := e.d.Verdict(k); err != nil || v != (Verdict{Action: Released, ReadGen: true, Gen: 3}) {
		t.Fatalf("verdict %+v (%v)", v, err)
	}
	base := e.counters(t)
	sendUDP(t, e.topo.Guest, k, 3, 50)
	if !tcxtest.Eventually(hangGuard, func() bool { return sink.Packets.Load() == 3 }) {
		t.Fatalf("world got %d of 3 datagrams released at the current generation", sink.Packets.Load())
	}

	bump(4) // the agent read something
	sendUDP(t, e.topo.Guest, k, 2, 50)
	e.waitCount(t, base, QueueRead, 2)
	settle()
	if n := sink.Packets.Load(); n != 3 {
		t.Errorf("world got %d datagrams, want 3: those sent after the read must wait in the queue", n)
	}
	if got := queuedFrom(q, ProtoUDP, guest, world); len(got) != 2 {
		t.Errorf("%d datagrams queued, want 2", len(got))
	}

	// Released again at the new generation: passes.
	if err := e.d.ReleaseFlowAt(k, 4); err != nil {
		t.Fatal(err)
	}
	sendUDP(t, e.topo.Guest, k, 1, 50)
	if !tcxtest.Eventually(hangGuard, func() bool { return sink.Packets.Load() == 4 }) {
		t.Fatalf("world got %d datagrams, want 4 after the release at the new generation", sink.Packets.Load())
	}

	// Pinned, adopted and kept by a replaced program.
	if _, err := os.Stat(filepath.Join(testPinDir, e.cfg.SandboxID, readGenName)); err != nil {
		t.Fatalf("read generation not pinned: %v", err)
	}
	if err := e.d.Leave(); err != nil {
		t.Fatal(err)
	}
	d, err := Adopt(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
	t.Cleanup(func() { d.Close() })
	if err := d.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := d.ReplaceProgram(); err != nil {
		t.Fatal(err)
	}
	bump(5)
	base = e.counters(t)
	sendUDP(t, e.topo.Guest, k, 1, 50)
	e.waitCount(t, base, QueueRead, 1)
	if n := sink.Packets.Load(); n != 4 {
		t.Errorf("world got %d datagrams after the replaced program saw a read, want 4", n)
	}
}
