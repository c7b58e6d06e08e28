package daemon

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
)

// An id whose lock is held is live, whoever scans; a removal of an id a
// run took since the scan leaves everything in place; once the lock is
// free the same removal removes the cgroup and the lock file, and a run
// can take the id again.
func TestCleanupRespectsTheIDLock(t *testing.T) {
	testutil.RequireRoot(t)
	id := testutil.UniqueName("k")
	cg, err := fileev.NewCgroup("carbd-" + id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Remove() })
	// A VM backend's tap outlives its carbd: a link named for the id.
	testutil.Run(t, "ip", "link", "add", "cbh-"+id, "type", "veth", "peer", "name", "cbp-"+id)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "cbh-"+id).Run() })
	if err := os.MkdirAll(IndexDir, 0o700); err != nil {
		t.Fatal(err)
	}
	unlock, err := claimID(IndexDir, id)
	if err != nil {
		t.Fatal(err)
	}
	lockFile := filepath.Join(IndexDir, "id-"+id+".lock")
	t.Cleanup(func() { _ = os.Remove(lockFile) })

	h, err := ScanHost(CleanupOptions{IDs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Sandboxes) != 1 || h.Sandboxes[0].State != "live" || h.Sandboxes[0].Pid != os.Getpid() {
		t.Fatalf("scan with the id's lock held: %+v; want it live, pid %d", h.Sandboxes, os.Getpid())
	}
	// As if scanned stale before the run took the id.
	s := *h.Sandboxes[0]
	s.State = "stale"
	if fails := RemoveLeftovers(&s); len(fails) != 0 {
		t.Errorf("removal of an id taken since the scan: %+v; want it left alone", fails)
	}
	if _, err := os.Stat(cg.Path); err != nil {
		t.Fatalf("the live id's cgroup: %v", err)
	}
	if _, err := netlink.LinkByName("cbh-" + id); err != nil {
		t.Fatalf("the live id's link: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}

	h, err = ScanHost(CleanupOptions{IDs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Sandboxes) != 1 || h.Sandboxes[0].State != "stale" || !slices.ContainsFunc(h.Sandboxes[0].Resources, func(r HostResource) bool { return r.Kind == ResLink }) {
		t.Fatalf("scan with the lock free: %+v; want it stale", h.Sandboxes)
	}
	if fails := RemoveLeftovers(h.Sandboxes[0]); len(fails) != 0 {
		t.Fatalf("removal: %+v", fails)
	}
	if _, err := os.Stat(cg.Path); !os.IsNotExist(err) {
		t.Errorf("the stale id's cgroup after removal: %v", err)
	}
	if _, err := netlink.LinkByName("cbh-" + id); err == nil {
		t.Errorf("the stale id's link is still there")
	}
	if _, err := os.Stat(lockFile); !os.IsNotExist(err) {
		t.Errorf("the stale id's lock file after removal: %v", err)
	}
	// The id is free for a run, whose lock is the file at the path.
	again, err := claimID(IndexDir, id)
	if err != nil {
		t.Fatal(err)
	}
	defer again()
	locks, err := heldFlocks()
	if err != nil {
		t.Fatal(err)
	}
	if pid, ok := locks[lockKey(lockFile)]; !ok || pid != os.Getpid() {
		t.Errorf("the new run's lock: held %v by %d", ok, pid)
	}
	if _, err := claimID(IndexDir, id); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a second claim while the new run holds the id: %v", err)
	}
}

// Rules and NAT tables named for an id no run could have (longer than a
// run's, as tests make them) are found and removed by their names.
func TestCleanupRulesOfALongID(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "iptables-nft-save")
	id := "LongTestID-" + testutil.UniqueName("r") // longer than 11 characters
	if len(id) > 20 {
		id = id[len(id)-20:]
	}
	iface := testutil.UniqueName("cbr")
	rules := nfrules.Config{SandboxID: id, Iface: iface, QueueNum: 1, Backend: nfrules.BackendXtables}
	if _, err := nfrules.Apply(rules); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nfrules.Remove(rules) })
	nat := nfrules.NATConfig{SandboxID: id, Iface: iface, Subnets: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/30")}}
	undo, err := nfrules.ApplyNAT(nat)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = undo() })

	h, err := ScanHost(CleanupOptions{IDs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Sandboxes) != 1 || h.Sandboxes[0].State != "stale" {
		t.Fatalf("scan: %+v; want %s stale", h.Sandboxes, id)
	}
	got := map[string]int{}
	for _, r := range h.Sandboxes[0].Resources {
		got[r.Kind]++
	}
	if got[ResChain] != 4 || got[ResJump] != 4 || got[ResTable] != 1 {
		t.Errorf("found %v; want 4 chains, 4 jumps and the nat table", got)
	}
	if fails := RemoveLeftovers(h.Sandboxes[0]); len(fails) != 0 {
		t.Fatalf("removal: %+v", fails)
	}
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		if out := testutil.Run(t, tool); strings.Contains(out, "CARBD-"+id+"-") {
			t.Errorf("%s after removal:\n%s", tool, out)
		}
	}
	if out := testutil.Run(t, "nft", "list", "tables"); strings.Contains(out, "carbd-nat-"+id) {
		t.Errorf("nft tables after removal:\n%s", out)
	}
	if h, err = ScanHost(CleanupOptions{IDs: []string{id}}); err != nil || len(h.Sandboxes) != 0 {
		t.Errorf("scan after removal: %+v, %v; want nothing", h.Sandboxes, err)
	}
}

// A dead run's reference on the forwarding sysctls is given back as its
// end would have: the last holder out puts back what the first found.
// (In a namespace of its own: the host's forwarding is other runs'.)
func TestCleanupReleasesSysctls(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNetNS(t)
	id := testutil.UniqueName("s")
	state := t.TempDir()
	err := netnsx.DoNamed(ns, func() error {
		const fwd = "/proc/sys/net/ipv4/ip_forward"
		if err := os.WriteFile(fwd, []byte("0"), 0o644); err != nil {
			return err
		}
		if _, err := nfrules.ApplyNAT(nfrules.NATConfig{SandboxID: id, Iface: "cbh-" + id,
			Subnets: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/30")}, Forwarding: true, StateDir: state}); err != nil {
			return err
		}
		if b, _ := os.ReadFile(fwd); strings.TrimSpace(string(b)) != "1" {
			t.Errorf("ip_forward while held: %q", b)
		}
		holders, _ := filepath.Glob(filepath.Join(state, "*", "*", "holders", id))
		if len(holders) != 1 {
			t.Errorf("holders: %v", holders)
		}
		// The run dies without its undo; cleanup gives its reference back.
		if err := nfrules.ReleaseSysctls(state, id); err != nil {
			return err
		}
		if b, _ := os.ReadFile(fwd); strings.TrimSpace(string(b)) != "0" {
			t.Errorf("ip_forward after the release: %q; want 0, as found", b)
		}
		if holders, _ := filepath.Glob(filepath.Join(state, "*", "*", "holders", id)); len(holders) != 0 {
			t.Errorf("holders after the release: %v", holders)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
