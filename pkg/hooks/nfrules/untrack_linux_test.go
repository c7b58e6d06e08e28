package nfrules_test

import (
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// TestUntrackedTraffic sends released TCP and UDP flows through the
// rules, tracked and untracked, and reads the router's conntrack table:
// tracked, the flows are in it (the queue rule's conntrack match turns
// tracking on for the namespace); untracked, neither direction of them
// is, undecided traffic is still queued (no listener: dropped), and the
// kernel lists the raw table as the plan's script says. Re-applying
// without Untracked, and Remove, take the table away.
func TestUntrackedTraffic(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "nft")
	for _, b := range backends(t) {
		t.Run(b.String(), func(t *testing.T) {
			topo := tcxtest.New(t)
			rns := tcxtest.Path(topo.Router)
			d, err := tcx.Attach(tcx.Config{SandboxID: testutil.UniqueName("sb"), Ifname: topo.RouterIf, NetNS: rns, PinDir: "/sys/fs/bpf/carbd-test"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			if err := d.RenewLease(time.Hour); err != nil {
				t.Fatal(err)
			}
			l := tcxtest.Listen(t, topo.World, netip.AddrPortFrom(topo.World4, 8095))
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() { io.Copy(c, c); c.Close() }()
				}
			}()
			udp := tcxtest.UDPSink(t, topo.World, netip.AddrPortFrom(topo.World6, 8096))
			cfg := nfrules.Config{SandboxID: testutil.UniqueName("sb"), Iface: topo.RouterIf, QueueNum: tcxtest.QueueNum(), NetNS: rns, Backend: b}
			t.Cleanup(func() { nfrules.Remove(cfg) })
			port := uint16(41000)
			for _, untracked := range []bool{false, true, false} {
				cfg.Untracked = nil
				if untracked {
					cfg.Untracked = []netip.Prefix{netip.MustParsePrefix("10.77.1.0/24"), netip.MustParsePrefix("fd77:1::/64")}
				}
				if _, err := nfrules.Apply(cfg); err != nil {
					t.Fatal(err)
				}
				if err := nfrules.Verify(cfg, b); err != nil {
					t.Fatal(err)
				}
				listed := tableOf(t, topo.Router, "carbd-raw-"+cfg.SandboxID)
				if untracked {
					p, _ := nfrules.Build(cfg, b)
					if got, want := normNFT(listed), normNFT(p.Untrack.NFTScript()); got != want {
						t.Errorf("kernel lists:\n%s\nplan says:\n%s", got, want)
					}
				} else if listed != "" {
					t.Errorf("tracked, but the raw table is there:\n%s", listed)
				}

				port++
				tcpFlow := tcx.FlowKey{Src: topo.Guest4, Dst: topo.World4, SrcPort: port, DstPort: 8095, Proto: tcx.ProtoTCP}
				udpFlow := tcx.FlowKey{Src: topo.Guest6, Dst: topo.World6, SrcPort: port, DstPort: 8096, Proto: tcx.ProtoUDP}
				for _, k := range []tcx.FlowKey{tcpFlow, udpFlow} {
					if err := d.ReleaseFlow(k); err != nil {
						t.Fatal(err)
					}
				}
				c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(topo.World4, 8095), netip.AddrPortFrom(topo.Guest4, port), 5*time.Second)
				if err != nil {
					t.Fatalf("released connection (untracked %v): %v", untracked, err)
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				msg := strings.Repeat("released bytes ", 20000)
				go io.WriteString(c, msg)
				got, err := io.ReadAll(io.LimitReader(c, int64(len(msg))))
				c.Close()
				if err != nil || len(got) != len(msg) {
					t.Fatalf("echo over the released connection: %d of %d bytes, %v", len(got), len(msg), err)
				}
				u, err := tcxtest.Dial(topo.Guest, "udp", netip.AddrPortFrom(topo.World6, 8096), netip.AddrPortFrom(topo.Guest6, port), time.Second)
				if err != nil {
					t.Fatal(err)
				}
				before := udp.Packets.Load()
				u.Write([]byte("released datagram"))
				u.Close()
				if !tcxtest.Eventually(5*time.Second, func() bool { return udp.Packets.Load() > before }) {
					t.Fatal("released datagram did not arrive")
				}

				ct := testutil.Run(t, "ip", "netns", "exec", topo.Router, "cat", "/proc/net/nf_conntrack")
				for _, k := range []tcx.FlowKey{tcpFlow, udpFlow} {
					in := strings.Contains(ct, fmt.Sprintf("sport=%d dport=%d", k.SrcPort, k.DstPort))
					back := strings.Contains(ct, fmt.Sprintf("sport=%d dport=%d", k.DstPort, k.SrcPort))
					switch {
					case untracked && (in || back):
						t.Errorf("untracked, but conntrack has flow %v (guest's direction %v, reply %v):\n%s", k, in, back, ct)
					case !untracked && !in:
						t.Errorf("tracked, but conntrack lacks flow %v:\n%s", k, ct)
					}
				}

				// Undecided traffic still goes to the queue: no listener, no
				// connection.
				if c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(topo.World4, 8095), netip.AddrPort{}, time.Second); err == nil {
					c.Close()
					t.Errorf("untracked %v: an undecided connection got through", untracked)
				}
			}
			if err := nfrules.Remove(cfg); err != nil {
				t.Fatal(err)
			}
			cfg.Untracked = []netip.Prefix{netip.MustParsePrefix("10.77.1.0/24")}
			if _, err := nfrules.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			if err := nfrules.Remove(cfg); err != nil {
				t.Fatal(err)
			}
			if out := testutil.Run(t, "ip", "netns", "exec", topo.Router, "nft", "list", "ruleset"); strings.Contains(out, "carbd") {
				t.Errorf("after remove:\n%s", out)
			}
		})
	}
}

// tableOf lists table inet name in ns, "" when it is not there.
func tableOf(t *testing.T, ns, name string) string {
	t.Helper()
	out := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "tables")
	if !strings.Contains(out, "table inet "+name+"\n") {
		return ""
	}
	return testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "table", "inet", name)
}

func normNFT(s string) string {
	s = regexp.MustCompile(`(?m)^\s+`).ReplaceAllString(s, "")
	return strings.TrimSpace(s)
}
