package nfrules

import (
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// present asks xtChainsPresent in the namespace at path, per family.
func present(t *testing.T, path string, p *Plan) [2]bool {
	t.Helper()
	var got [2]bool
	for i, fam := range xtNFTFamilies {
		if err := inNetNS(path, func() (err error) {
			got[i], err = xtChainsPresent(fam, p.ChainNames())
			return err
		}); err != nil {
			t.Fatalf("family %d: %v", fam, err)
		}
	}
	return got
}

// TestXtChainsPresent checks the by-name chain query against what
// iptables-nft installs and removes: no table at all, another sandbox's
// chains only, ours in one family, ours in both, removed.
func TestXtChainsPresent(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables-nft")
	ns := testutil.NewNetNS(t)
	path := tcxtest.Path(ns)
	cfg := Config{SandboxID: testutil.UniqueName("sb"), Iface: "cbq0", QueueNum: 7, NetNS: path, Backend: BackendXtables}
	other := cfg
	other.SandboxID, other.Iface = testutil.UniqueName("sb"), "cbq1"
	p, err := Build(cfg, BackendXtables)
	if err != nil {
		t.Fatal(err)
	}
	if got := present(t, path, p); got != [2]bool{} {
		t.Fatalf("no filter table yet: present %v", got)
	}
	if _, err := Apply(other); err != nil {
		t.Fatal(err)
	}
	if got := present(t, path, p); got != [2]bool{} {
		t.Fatalf("only another sandbox's chains: present %v", got)
	}
	// Ours in IPv6 only, by hand.
	cmd := exec.Command("ip", "netns", "exec", ns, "ip6tables-nft-restore", "--noflush")
	cmd.Stdin = strings.NewReader("*filter\n:" + p.Chains[1].Name + " - [0:0]\nCOMMIT\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ip6tables-nft-restore: %v\n%s", err, out)
	}
	if got := present(t, path, p); got != [2]bool{false, true} {
		t.Fatalf("one chain in IPv6: present %v, want [false true]", got)
	}
	// Apply over it: the IPv6 half takes the repair path and the result
	// is the same as a fresh install.
	if _, err := Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if got := present(t, path, p); got != [2]bool{true, true} {
		t.Fatalf("after Apply: present %v", got)
	}
	if err := Verify(cfg, BackendXtables); err != nil {
		t.Fatal(err)
	}
	// The table differs from the plan (a second jump in IPv4, a goto
	// from a chain of the host's in IPv6): the planned removal fails as
	// a whole and Remove falls back to reading the table.
	for _, c := range [][]string{
		{"iptables-nft", "-A", "FORWARD", "-i", cfg.Iface, "-j", p.Chains[0].Name},
		{"ip6tables-nft", "-N", "HOST-X"},
		{"ip6tables-nft", "-A", "HOST-X", "-g", p.Chains[1].Name},
	} {
		testutil.Run(t, "ip", append([]string{"netns", "exec", ns}, c...)...)
	}
	if err := Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if got := present(t, path, p); got != [2]bool{} {
		t.Fatalf("after Remove: present %v", got)
	}
	if out := testutil.Run(t, "ip", "netns", "exec", ns, "ip6tables-nft-save", "-t", "filter"); !strings.Contains(out, ":HOST-X") {
		t.Errorf("Remove took the host's chain too:\n%s", out)
	}
	// A fresh Apply and Remove: the planned removal alone.
	if _, err := Apply(cfg); err != nil {
		t.Fatal(err)
	}
	if err := Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if got := present(t, path, p); got != [2]bool{} {
		t.Fatalf("after the second Remove: present %v", got)
	}
	if err := Verify(other, BackendXtables); err != nil {
		t.Fatalf("removing ours touched the other sandbox's rules: %v", err)
	}
	if err := Remove(other); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out := testutil.Run(t, "ip", "netns", "exec", ns, tool, "-t", "filter")
		if strings.Contains(out, "CARBD-") {
			t.Errorf("%s after Remove:\n%s", tool, out)
		}
	}
}

// TestGetChainMsg pins the request's wire form: header, nfgenmsg and two
// NUL-terminated, padded string attributes.
func TestGetChainMsg(t *testing.T) {
	m := getChainMsg(unix.NFPROTO_IPV6, 5, "filter", "CARBD-x-F")
	// 16 header + 4 nfgenmsg + (4+7 -> 12) + (4+10 -> 16)
	if len(m) != 48 {
		t.Fatalf("length %d, want 48: % x", len(m), m)
	}
	if m[16] != unix.NFPROTO_IPV6 || m[17] != unix.NFNETLINK_V0 {
		t.Errorf("nfgenmsg % x", m[16:20])
	}
	if string(m[24:30]) != "filter" || m[30] != 0 || string(m[36:45]) != "CARBD-x-F" || m[45] != 0 {
		t.Errorf("attributes % x", m[20:])
	}
}
