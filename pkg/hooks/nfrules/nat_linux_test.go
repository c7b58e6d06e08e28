package nfrules_test

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

func sysctlIn(t *testing.T, ns, key string) string {
	t.Helper()
	return strings.TrimSpace(testutil.Run(t, "ip", "netns", "exec", ns, "sysctl", "-n", key))
}

func setSysctlIn(t *testing.T, ns, key, v string) {
	t.Helper()
	testutil.Run(t, "ip", "netns", "exec", ns, "sysctl", "-q", "-w", key+"="+v)
}

const (
	fwd4 = "net.ipv4.ip_forward"
	fwd6 = "net.ipv6.conf.all.forwarding"
)

// TestNATScriptIsValidNFT: the script the plan prints is what nft accepts.
func TestNATScriptIsValidNFT(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetNS(t)
	p, err := nfrules.BuildNAT(nfrules.NATConfig{SandboxID: "sb1", Iface: "tap-sb1",
		Subnets: []netip.Prefix{netip.MustParsePrefix("10.200.0.20/30"), netip.MustParsePrefix("fd00:cb:0:5::/64")}})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	cmd.Stdin = strings.NewReader(p.NFTScript())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s\n%s", err, out, p.NFTScript())
	}
}

// TestNATForwardingRestored: forwarding is set while any sandbox of the
// namespace needs it and put back to what it was when the last one ends;
// what was already on stays on; a holder that died is not waited for.
func TestNATForwardingRestored(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetNS(t)
	state := t.TempDir()
	cfg := func(id string) nfrules.NATConfig {
		return nfrules.NATConfig{SandboxID: id, Iface: "tap-" + id, NetNS: tcxtest.Path(ns), Forwarding: true, StateDir: state,
			Subnets: []netip.Prefix{netip.MustParsePrefix("10.201.0.0/30"), netip.MustParsePrefix("fd00:cb:1::/64")}}
	}
	ruleset := func() string { return testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset") }
	want := func(step, v4, v6 string) {
		t.Helper()
		if g4, g6 := sysctlIn(t, ns, fwd4), sysctlIn(t, ns, fwd6); g4 != v4 || g6 != v6 {
			t.Errorf("%s: forwarding %s/%s, want %s/%s", step, g4, g6, v4, v6)
		}
	}

	setSysctlIn(t, ns, fwd4, "0")
	setSysctlIn(t, ns, fwd6, "0")
	undoA, err := nfrules.ApplyNAT(cfg("a"))
	if err != nil {
		t.Fatal(err)
	}
	want("a applied", "1", "1")
	rs := ruleset()
	for _, s := range []string{"table ip carbd-nat-a", "table ip6 carbd-nat-a", "ip saddr 10.201.0.0/30 oifname != \"tap-a\" masquerade",
		"ip6 saddr fd00:cb:1::/64 oifname != \"tap-a\" masquerade"} {
		if !strings.Contains(rs, s) {
			t.Errorf("ruleset lacks %q:\n%s", s, rs)
		}
	}
	// Applying again (a carbd restarted with the same id) replaces, not adds.
	if _, err := nfrules.ApplyNAT(cfg("a")); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(ruleset(), "masquerade"); n != 2 {
		t.Errorf("%d masquerade rules after a re-apply, want 2", n)
	}
	undoB, err := nfrules.ApplyNAT(cfg("b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := undoA(); err != nil {
		t.Fatal(err)
	}
	want("a undone, b holds", "1", "1")
	if rs := ruleset(); strings.Contains(rs, "carbd-nat-a") || !strings.Contains(rs, "carbd-nat-b") {
		t.Errorf("after a's undo:\n%s", rs)
	}
	if err := undoB(); err != nil {
		t.Fatal(err)
	}
	want("all undone", "0", "0")
	if rs := strings.TrimSpace(ruleset()); rs != "" {
		t.Errorf("rules left:\n%s", rs)
	}

	// Already on before carbd: left on.
	setSysctlIn(t, ns, fwd4, "1")
	undo, err := nfrules.ApplyNAT(cfg("c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	want("on before", "1", "0")

	// A holder that died without releasing does not keep forwarding on.
	setSysctlIn(t, ns, fwd4, "0")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	undo, err = nfrules.ApplyNAT(cfg("d"))
	if err != nil {
		t.Fatal(err)
	}
	matches, _ := filepath.Glob(filepath.Join(state, "*", fwd4, "holders"))
	if len(matches) != 1 {
		t.Fatalf("holders directories %v", matches)
	}
	if err := os.WriteFile(filepath.Join(matches[0], "crashed"), []byte(strconv.Itoa(dead.Process.Pid)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	want("dead holder", "0", "0")

	// A carbd that died holding forwarding: the next one restores what
	// the dead one found, not what it left.
	if _, err := nfrules.ApplyNAT(cfg("e")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nfrules.RemoveNAT(cfg("e")) })
	for _, k := range []string{fwd4, fwd6} {
		if err := os.WriteFile(filepath.Join(filepath.Dir(filepath.Dir(matches[0])), k, "holders", "e"),
			[]byte(strconv.Itoa(dead.Process.Pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	want("e died holding", "1", "1")
	undo, err = nfrules.ApplyNAT(cfg("f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	want("after a dead holder", "0", "0")
}

// TestNATMasquerades: with the plan applied in the router namespace, the
// world sees the guest's connection from the router's address.
func TestNATMasquerades(t *testing.T) {
	testutil.RequireRoot(t)
	topo := tcxtest.New(t)
	undo, err := nfrules.ApplyNAT(nfrules.NATConfig{SandboxID: testutil.UniqueName("nat"), Iface: topo.RouterIf,
		NetNS: tcxtest.Path(topo.Router), Forwarding: true, StateDir: t.TempDir(),
		Subnets: []netip.Prefix{netip.PrefixFrom(topo.Guest4, 24), netip.PrefixFrom(topo.Guest6, 64)}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := undo(); err != nil {
			t.Error(err)
		}
	}()
	for _, tc := range []struct {
		world, router netip.Addr
	}{{topo.World4, topo.RouterWorld4}, {topo.World6, topo.RouterWorld6}} {
		l := tcxtest.Listen(t, topo.World, netip.AddrPortFrom(tc.world, 9100))
		got := make(chan netip.Addr, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				got <- netip.Addr{}
				return
			}
			got <- netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
			c.Close()
		}()
		c, err := tcxtest.Dial(topo.Guest, "tcp", netip.AddrPortFrom(tc.world, 9100), netip.AddrPort{}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		if src := <-got; src != tc.router {
			t.Errorf("the world saw %v, want the router's %v (masqueraded)", src, tc.router)
		}
	}
}

// TestNATRedirectApplied: the redirect rules ApplyNAT builds through
// netlink are the ones the plan prints, and the script is valid nft.
func TestNATRedirectApplied(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetNS(t)
	cfg := nfrules.NATConfig{SandboxID: "rd", Iface: "tap-rd", NetNS: tcxtest.Path(ns),
		Subnets:       []netip.Prefix{netip.MustParsePrefix("10.202.0.0/30"), netip.MustParsePrefix("fd00:cb:2::/64")},
		RedirectPorts: []uint16{443, 8443}, RedirectTo: 40123}
	p, err := nfrules.BuildNAT(cfg)
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command("ip", "netns", "exec", ns, "nft", "-c", "-f", "-")
	check.Stdin = strings.NewReader(p.NFTScript())
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("nft -c: %v\n%s", err, out)
	}
	undo, err := nfrules.ApplyNAT(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rs := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset")
	for _, fam := range []string{"ip", "ip6"} {
		for _, port := range []string{"443", "8443"} {
			want := `iifname "tap-rd" tcp dport ` + port + ` redirect to :40123`
			if strings.Count(rs, want) != 2 {
				t.Errorf("%s: want %q in both families, ruleset:\n%s", fam, want, rs)
			}
		}
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if rs := testutil.Run(t, "ip", "netns", "exec", ns, "nft", "list", "ruleset"); strings.Contains(rs, "carbd-nat-rd") {
		t.Errorf("tables left after undo:\n%s", rs)
	}
}
