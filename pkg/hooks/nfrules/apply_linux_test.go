package nfrules_test

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// nftQueueWorks asks the nft tool, in a throwaway namespace, whether the
// kernel has the nftables queue statement.
func nftQueueWorks(t *testing.T) bool {
	t.Helper()
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetNS(t)
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("table inet probe {\n\tchain c {\n\t\tqueue num 3\n\t}\n}\n")
	out, err := cmd.CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file or directory") {
		t.Fatalf("nft probe: %v\n%s", err, out)
	}
	return err == nil
}

func TestDetectAgreesWithNft(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	b, err := nfrules.DetectIn(tcxtest.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	want := nfrules.BackendXtables
	if nftQueueWorks(t) {
		want = nfrules.BackendNFT
	}
	if b != want {
		t.Errorf("Detect: %s, the nft tool says %s", b, want)
	}
	t.Logf("backend here: %s", b)
	if out := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("the probe left rules behind:\n%s", out)
	}
}

// TestNFTScriptIsValid checks the nft rendering of the plan with the nft
// tool (nft -c: parse and check against the kernel, apply nothing).
func TestNFTScriptIsValid(t *testing.T) {
	testutil.RequireRoot(t)
	queue := nftQueueWorks(t)
	ns := testutil.NewNetNS(t)
	p, err := nfrules.Build(nfrules.Config{SandboxID: "sb1", Iface: "tap0", QueueNum: 5}, nfrules.BackendNFT)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(p.NFTScript())
	out, err := cmd.CombinedOutput()
	if queue {
		if err != nil {
			t.Fatalf("nft -c: %v\n%s", err, out)
		}
		return
	}
	// Without nft_queue only the queue statements may be refused.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "Error:") && !strings.Contains(line, "No such file or directory") {
			t.Errorf("nft -c: %s", line)
		}
	}
	if n := strings.Count(string(out), "queue num 5"); n != 2 {
		t.Errorf("nft refused %d queue rules, want the 2 there are:\n%s", n, out)
	}
}

// TestNFTApplyIsAtomic: on a kernel without nft_queue the native backend
// fails as a whole and leaves nothing; with it, it installs.
func TestNFTApplyIsAtomic(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	cfg := nfrules.Config{SandboxID: "sb1", Iface: "tap0", QueueNum: 5, NetNS: tcxtest.Path(ns), Backend: nfrules.BackendNFT}
	_, err := nfrules.Apply(cfg)
	if nftQueueWorks(t) {
		if err != nil {
			t.Fatal(err)
		}
		if err := nfrules.Verify(cfg, nfrules.BackendNFT); err != nil {
			t.Fatal(err)
		}
	} else {
		if !errors.Is(err, unix.ENOENT) {
			t.Fatalf("apply without nft_queue: %v, want ENOENT", err)
		}
		if out := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset"); strings.Contains(out, "carbd") {
			t.Fatalf("a failed apply left:\n%s", out)
		}
	}
	if err := nfrules.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if out := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset"); strings.Contains(out, "carbd") {
		t.Fatalf("after remove:\n%s", out)
	}
}

// backends lists the backends this kernel can run.
func backends(t *testing.T) []nfrules.Backend {
	bs := []nfrules.Backend{nfrules.BackendXtables}
	if nftQueueWorks(t) {
		bs = append(bs, nfrules.BackendNFT)
	}
	return bs
}

func ruleset(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range [][]string{{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"nft", "list", "ruleset"}} {
		b.WriteString(testutil.Run(t, "ip", append([]string{"netns", "exec", ns}, cmd...)...))
	}
	return b.String()
}

// TestRulesFailClosed runs real traffic through the rules in a router
// namespace with no queue listener.
func TestRulesFailClosed(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables-nft")
	for _, b := range backends(t) {
		t.Run(b.String(), func(t *testing.T) {
			topo := tcxtest.New(t)
			rns := tcxtest.Path(topo.Router)
			cfg := nfrules.Config{SandboxID: testutil.UniqueName("sb"), Iface: topo.RouterIf, QueueNum: tcxtest.QueueNum(), NetNS: rns, Backend: b}

			// Without carbd the guest reaches the world and the router.
			if !tcxtest.Ping(topo.Guest, topo.World4, 1, 2) || !tcxtest.Ping(topo.Guest, topo.World6, 1, 2) {
				t.Fatal("no connectivity before the rules")
			}

			got, err := nfrules.Apply(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { nfrules.Remove(cfg) })
			if got != b {
				t.Fatalf("applied %s, want %s", got, b)
			}
			if err := nfrules.Verify(cfg, b); err != nil {
				t.Fatal(err)
			}

			// No TC program: nothing from the interface is marked, so
			// nothing passes, forwarded or to the router itself.
			for _, dst := range []netip.Addr{topo.World4, topo.World6, topo.Router4, topo.Router6} {
				if tcxtest.Ping(topo.Guest, dst, 1, 1) {
					t.Errorf("unmarked ping to %s passed", dst)
				}
			}
			routerSink := tcxtest.UDPSink(t, topo.Router, netip.AddrPortFrom(topo.Router4, 9100))
			worldSink := tcxtest.UDPSink(t, topo.World, netip.AddrPortFrom(topo.World4, 9100))
			for _, dst := range []netip.Addr{topo.Router4, topo.World4} {
				c, err := tcxtest.Dial(topo.Guest, "udp", netip.AddrPortFrom(dst, 9100), netip.AddrPort{}, time.Second)
				if err != nil {
					t.Fatal(err)
				}
				c.Write([]byte("unmarked"))
				c.Close()
			}

			// With the program and a lease: undecided traffic is queued and,
			// with no listener, dropped; a connect times out.
			d, err := tcx.Attach(tcx.Config{SandboxID: cfg.SandboxID, Ifname: topo.RouterIf, NetNS: rns, PinDir: "/sys/fs/bpf/carbd-test"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Close() })
			if err := d.RenewLease(time.Hour); err != nil {
				t.Fatal(err)
			}
			l := tcxtest.Listen(t, topo.World, netip.AddrPortFrom(topo.World4, 8090))
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Write([]byte("hello"))
					c.Close()
				}
			}()
			start := time.Now()
			if c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(topo.World4, 8090), netip.AddrPort{}, time.Second); err == nil {
				c.Close()
				t.Fatal("undecided connect succeeded with no queue listener")
			}
			t.Logf("undecided connect gave up after %v", time.Since(start).Round(time.Millisecond))
			base, _ := d.Counters()
			if base[tcx.QueueUndecided].Packets == 0 {
				t.Errorf("the SYN was not marked for the queue: %+v", base)
			}

			// A released flow passes (pass mark -> the host's rules, which
			// accept here).
			k := tcx.FlowKey{Src: topo.Guest4, Dst: topo.World4, SrcPort: 45000, DstPort: 8090, Proto: tcx.ProtoTCP}
			if err := d.ReleaseFlow(k); err != nil {
				t.Fatal(err)
			}
			c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(topo.World4, 8090), netip.AddrPortFrom(topo.Guest4, 45000), 3*time.Second)
			if err != nil {
				t.Fatalf("released flow: %v", err)
			}
			buf := make([]byte, 5)
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Read(buf); err != nil || string(buf) != "hello" {
				t.Errorf("released flow read %q, %v", buf, err)
			}
			c.Close()

			// carbd never widens the host's firewall: a host rule dropping
			// the flow, placed after carbd's jump, still drops it.
			k2 := k
			k2.SrcPort = 45001
			if err := d.ReleaseFlow(k2); err != nil {
				t.Fatal(err)
			}
			testutil.Run(t, "ip", "netns", "exec", topo.Router, "iptables-nft", "-w", "-A", "FORWARD", "-p", "tcp", "--sport", "45001", "-j", "DROP")
			if c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(topo.World4, 8090), netip.AddrPortFrom(topo.Guest4, 45001), time.Second); err == nil {
				c.Close()
				t.Error("the host's DROP rule was bypassed for a released flow")
			}

			// The link-local mark is for the host only: an ND-typed packet
			// with hop limit 255 addressed to the world is not forwarded.
			nsSink := tcxtest.RawSinkFunc(t, topo.World, 6, 58, func(b []byte) bool {
				return len(b) >= 8 && b[0] == 135 && string(b[len(b)-6:]) == "carbd!"
			})
			sendND(t, topo.Guest, topo.World6)
			sendND(t, topo.Guest, topo.World6)
			tcxtest.Eventually(3*time.Second, func() bool {
				c, _ := d.Counters()
				return c[tcx.PassLinkLocal].Packets-base[tcx.PassLinkLocal].Packets >= 2
			})
			time.Sleep(200 * time.Millisecond)
			if n := nsSink.Packets.Load(); n != 0 {
				t.Errorf("world received %d ND-typed packets", n)
			}
			if n := routerSink.Packets.Load() + worldSink.Packets.Load(); n != 0 {
				t.Errorf("%d unmarked datagrams got through", n)
			}

			// Apply again: idempotent, and it repairs a jump the host pushed
			// down.
			testutil.Run(t, "ip", "netns", "exec", topo.Router, "iptables-nft", "-w", "-I", "FORWARD", "1", "-i", topo.RouterIf, "-j", "ACCEPT")
			if b == nfrules.BackendXtables {
				if err := nfrules.Verify(cfg, b); err == nil {
					t.Error("Verify did not notice a rule before carbd's jump")
				}
			}
			if _, err := nfrules.Apply(cfg); err != nil {
				t.Fatal(err)
			}
			if err := nfrules.Verify(cfg, b); err != nil {
				t.Error(err)
			}
			rs := ruleset(t, topo.Router)
			if b == nfrules.BackendXtables {
				for _, chain := range []string{"CARBD-" + cfg.SandboxID + "-F", "CARBD-" + cfg.SandboxID + "-I"} {
					if n := strings.Count(rs, "-j "+chain+"\n"); n != 2 { // IPv4 and IPv6
						t.Errorf("%d jumps to %s after re-apply, want 2:\n%s", n, chain, rs)
					}
				}
			}

			// Remove leaves nothing of carbd's, and the traffic flows again
			// (the program is detached first: marks are harmless without rules).
			d.Close()
			if err := nfrules.Remove(cfg); err != nil {
				t.Fatal(err)
			}
			testutil.Run(t, "ip", "netns", "exec", topo.Router, "iptables-nft", "-w", "-D", "FORWARD", "-i", topo.RouterIf, "-j", "ACCEPT")
			rs = ruleset(t, topo.Router)
			if strings.Contains(strings.ToLower(rs), "carbd") {
				t.Errorf("carbd rules left after Remove:\n%s", rs)
			}
			if !strings.Contains(rs, "--sport 45001 -j DROP") {
				t.Errorf("Remove took the host's own rule:\n%s", rs)
			}
			if !tcxtest.Ping(topo.Guest, topo.World4, 1, 2) {
				t.Error("no connectivity after Remove")
			}
			if err := nfrules.Remove(cfg); err != nil {
				t.Errorf("second Remove: %v", err)
			}
		})
	}
}

// sendND sends an ICMPv6 neighbour solicitation with hop limit 255 from
// ns to dst, ending with a marker.
func sendND(t *testing.T, ns string, dst netip.Addr) {
	t.Helper()
	err := tcxtest.Do(ns, func() error {
		c, err := net.Dial("ip6:ipv6-icmp", dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		rc, err := c.(*net.IPConn).SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 255)
		}); err != nil {
			return err
		}
		if serr != nil {
			return serr
		}
		msg := make([]byte, 24, 30)
		msg[0] = 135
		a := dst.As16()
		copy(msg[8:], a[:])
		binary.BigEndian.PutUint32(msg[4:], 0)
		_, err = c.Write(append(msg, "carbd!"...))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
