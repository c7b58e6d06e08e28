package tcx

import (
	"testing"

	"github.com/cilium/ebpf"
)

// FuzzProgram feeds arbitrary frames to the program with no verdicts and
// checks the property the whole data path rests on: nothing undecided
// passes. Each frame must be dropped, queued (queue mark) or passed as
// link-local (link mark), be counted exactly once; and with the lease
// expired nothing but link-local traffic may leave the program.
func FuzzProgram(f *testing.F) {
	h := newHarness(f)
	for _, s := range [][]byte{
		ether(ethARP, arp()),
		ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 1, tcpSYN, nil))),
		ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 53, bytesN(20)), withOptions(2))),
		ether(ethIPv4, ipv4(1, g4, w4, icmp(8, 0, 7), withFrag(true, 0))),
		ether(ethIPv6, ipv6(0, g6, w6, 64, ext6(60, 0, ext6(43, 0, ah6(6, tcp(1, 2, 3, tcpACK, bytesN(10))))))),
		ether(ethIPv6, ipv6(44, g6, w6, 64, frag6(17, 0, true, udp(1, 2, bytesN(8))))),
		ether(ethIPv6, ipv6(58, "fe80::1", "ff02::1", 255, icmp(135, 0, 0))),
		ether(0x8100, append([]byte{0, 1, 0x86, 0xdd}, ipv6(6, g6, w6, 64, tcp(1, 2, 3, tcpSYN, nil))...)),
	} {
		f.Add(s, uint32(0))
	}
	f.Fuzz(func(t *testing.T, frame []byte, gso uint32) {
		gso &= 0xffff
		for _, alive := range []bool{true, false} {
			h.setLease(t, alive)
			before, err := h.d.Counters()
			if err != nil {
				t.Fatal(err)
			}
			var out skbCtx
			ret, err := h.d.prog.Run(&ebpf.RunOptions{Data: frame, Context: skbCtx{GsoSize: gso, GsoSegs: min(gso, 1)}, ContextOut: &out})
			if err != nil {
				return // the kernel refuses the frame itself (too short, too long, bad L3 header)
			}
			diff := mustCounters(t, h).Sub(before)
			var reason Reason = NumReasons
			for r, c := range diff {
				if c.Packets != 0 {
					if reason != NumReasons || c.Packets != 1 {
						t.Fatalf("counted more than once: %+v", diff)
					}
					reason = Reason(r)
				}
			}
			mark := out.Mark & MarkMask
			switch {
			case reason == NumReasons:
				t.Fatalf("not counted (ret %d mark %#x)", ret, out.Mark)
			case reason == PassFast || mark == MarkPass:
				t.Fatalf("an undecided frame passed on the fast path: reason %s mark %#x\n%x", reason, out.Mark, frame)
			case ret == actShot && reason.Outcome() != Dropped,
				ret == actOK && reason.Outcome() == Dropped,
				ret != actOK && ret != actShot:
				t.Fatalf("returned %d but counted %s", ret, reason)
			case reason == PassLinkLocal && mark != MarkLinkLocal,
				reason.Outcome() == Queued && mark != MarkQueue:
				t.Fatalf("reason %s with mark %#x", reason, out.Mark)
			case !alive && reason.Outcome() == Queued:
				t.Fatalf("queued with the lease expired: %s", reason)
			}
		}
		h.setLease(t, true)
		// Leave the flow table as it was.
		var k RawFlowKey
		var st rawFlowStats
		for it := h.d.objs.flows.Iterate(); it.Next(&k, &st); {
			h.d.objs.flows.Delete(&k)
		}
	})
}

func mustCounters(t *testing.T, h *harness) Counters {
	t.Helper()
	c, err := h.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
