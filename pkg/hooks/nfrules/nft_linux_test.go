package nfrules

import (
	"fmt"
	"math/bits"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// TestNFTBackendStructure installs the native backend's table through
// netlink and compares what the kernel lists with the plan's nft script;
// then sends traffic through it. Kernels without nft_queue (ours) cannot
// hold the queue rules, so there they become drops, which is what a
// queue does with no listener; everything else is the real backend.
func TestNFTBackendStructure(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "nft")
	topo := tcxtest.New(t)
	ns := tcxtest.Path(topo.Router)
	cfg := Config{SandboxID: testutil.UniqueName("sb"), Iface: topo.RouterIf, QueueNum: 9, NetNS: ns, Backend: BackendNFT}
	b, err := DetectIn(ns)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(cfg, BackendNFT)
	if err != nil {
		t.Fatal(err)
	}
	if b != BackendNFT {
		for i := range p.Chains {
			for j := range p.Chains[i].Rules {
				if r := &p.Chains[i].Rules[j]; r.Action == Queue {
					r.Action = Drop
				}
			}
		}
	}
	if err := applyNFT(p, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeNFT(p, ns) })
	// Applying again replaces the rules in place.
	if err := applyNFT(p, ns); err != nil {
		t.Fatal(err)
	}

	listed := testutil.Run(t, "ip", "netns", "exec", topo.Router, "nft", "list", "table", "inet", p.Table)
	norm := func(s string) []string {
		s = regexp.MustCompile(`counter packets \d+ bytes \d+`).ReplaceAllString(s, "counter")
		s = strings.ReplaceAll(s, "ct state != 0x0", "ct state != 0")
		s = regexp.MustCompile(`priority filter - 10`).ReplaceAllString(s, "priority -10")
		// nft prints a mask of leading ones as a prefix length.
		s = regexp.MustCompile(`meta mark & (0x[0-9a-f]+) == (0x[0-9a-f]+)`).ReplaceAllStringFunc(s, func(m string) string {
			var mask, val uint32
			fmt.Sscanf(m, "meta mark & %v == %v", &mask, &val)
			ones := bits.LeadingZeros32(^mask)
			if mask != ^uint32(0)<<(32-ones) {
				return m
			}
			return fmt.Sprintf("meta mark %#08x/%d", val, ones)
		})
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	want, got := norm(p.NFTScript()), norm(listed)
	if strings.Join(want, "\n") != strings.Join(got, "\n") {
		t.Errorf("kernel lists:\n%s\nplan says:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Unmarked traffic is dropped; with the program, a released flow
	// passes and an undecided one is dropped (queued to no listener).
	if tcxtest.Ping(topo.Guest, topo.World4, 1, 1) {
		t.Error("unmarked ping passed")
	}
	d, err := tcx.Attach(tcx.Config{SandboxID: cfg.SandboxID, Ifname: topo.RouterIf, NetNS: ns, PinDir: "/sys/fs/bpf/carbd-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.RenewLease(time.Hour); err != nil {
		t.Fatal(err)
	}
	sink := tcxtest.UDPSink(t, topo.World, netip.AddrPortFrom(topo.World6, 9200))
	rel := tcx.FlowKey{Src: topo.Guest6, Dst: topo.World6, SrcPort: 46000, DstPort: 9200, Proto: tcx.ProtoUDP}
	if err := d.ReleaseFlow(rel); err != nil {
		t.Fatal(err)
	}
	for _, sport := range []uint16{46000, 46001} {
		c, err := tcxtest.Dial(topo.Guest, "udp", netip.AddrPortFrom(topo.World6, 9200), netip.AddrPortFrom(topo.Guest6, sport), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			c.Write([]byte("datagram"))
		}
		c.Close()
	}
	if !tcxtest.Eventually(5*time.Second, func() bool { return sink.Packets.Load() >= 3 }) {
		t.Fatalf("released flow: world got %d of 3", sink.Packets.Load())
	}
	time.Sleep(200 * time.Millisecond)
	if n := sink.Packets.Load(); n != 3 {
		t.Errorf("world got %d datagrams, want only the 3 released", n)
	}

	if err := removeNFT(p, ns); err != nil {
		t.Fatal(err)
	}
	if out := testutil.Run(t, "ip", "netns", "exec", topo.Router, "nft", "list", "ruleset"); strings.Contains(out, "carbd") {
		t.Errorf("after remove:\n%s", out)
	}
}
