package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// kernelView is what the kernel and the file systems show of one sandbox
// id's host-wide resources, read without carbd's own scanner.
type kernelView struct {
	link, pins, cgroup, mount, holder bool
	chains, tables                    []string // iptables-nft chains and jumps; nft tables
}

func (v kernelView) empty() bool {
	return !v.link && !v.pins && !v.cgroup && !v.mount && !v.holder && len(v.chains) == 0 && len(v.tables) == 0
}

func viewOf(t *testing.T, id, stateDir string) kernelView {
	t.Helper()
	var v kernelView
	_, err := netlink.LinkByName("cbh-" + id)
	v.link = err == nil
	_, err = os.Stat(filepath.Join(tcx.DefaultPinDir, id))
	v.pins = err == nil
	if mnt, err := fileev.Cgroup2Mount(); err == nil {
		_, err = os.Stat(filepath.Join(mnt, "carbd-"+id))
		v.cgroup = err == nil
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	v.mount = strings.Contains(string(mi), " "+filepath.Join(stateDir, "sandboxes", id, "merged")+" ")
	holders, _ := filepath.Glob(filepath.Join(nfrules.DefaultSysctlDir, "*", "*", "holders", id))
	v.holder = len(holders) > 0
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := exec.Command(tool).Output()
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "CARBD-"+id+"-") {
				v.chains = append(v.chains, tool+": "+l)
			}
		}
	}
	out, err := exec.Command("nft", "list", "tables").Output()
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && (f[2] == "carbd-"+id || f[2] == "carbd-nat-"+id || f[2] == "carbd-raw-"+id) {
			v.tables = append(v.tables, l)
		}
	}
	return v
}

func (r *carbdRun) cleanup(t *testing.T, others []*carbdRun, args ...string) (int, cleanupReport, string) {
	t.Helper()
	full := []string{"cleanup", "--json"}
	for _, x := range append([]*carbdRun{r}, others...) {
		full = append(full, "--id", x.id, "--state-dir", x.state)
	}
	cmd := exec.Command(r.bin, append(full, args...)...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	var rep cleanupReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("carbd %v: %v\nstdout %s\nstderr %s", full, err, out, errb.String())
	}
	return cmd.ProcessState.ExitCode(), rep, errb.String()
}

func sandboxIn(rep cleanupReport, id string) *daemon.SandboxLeftovers {
	for _, s := range rep.Sandboxes {
		if s.ID == id {
			return s
		}
	}
	return nil
}

func kinds(s *daemon.SandboxLeftovers) map[string]bool {
	k := map[string]bool{}
	if s != nil {
		for _, r := range s.Resources {
			k[r.Kind] = true
		}
	}
	return k
}

// A carbd killed with SIGKILL leaves its sandbox's host-wide state; carbd
// cleanup reports it stale beside a live run, and --remove removes all
// of it (as the kernel shows) while the live run keeps its own and its
// agent still reaches the world. The crashed run's working-directory
// state is kept and named for recovery.
func TestCleanupCrashedRun(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "nft")
	testutil.RequireTool(t, "iptables-nft-save")
	w := newWorld(t, 187)

	workA := cliWorkdir(t)
	a := startRun(t, bin, w, workA, `
echo staged > staged.txt
touch /run/carbd/a-ready
while :; do sleep 1; done
`)
	t.Cleanup(func() { removeLeftovers(a.id, a.state) }) // if the test fails before cleanup does
	waitFor(t, 30*time.Second, "the first agent to write", a.out, func() bool {
		_, err := os.Stat(filepath.Join(a.state, "sandboxes", a.id, "agent", "a-ready"))
		return err == nil
	})
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	a.waitExit(t)
	before := viewOf(t, a.id, a.state)
	// (Its veth went with the sandbox's namespace, which died with it; a
	// VM backend's tap stays. Its forwarding-sysctl holder is pruned by
	// whichever run next takes or gives back the sysctl: not required.)
	if !before.pins || !before.cgroup || !before.mount || len(before.chains) == 0 || len(before.tables) == 0 {
		t.Fatalf("the killed run left less than expected (the test proves nothing): %+v", before)
	}

	workB := cliWorkdir(t)
	b := startRun(t, bin, w, workB, `
wait_for go
curl -sS -m 10 http://api.example.com/status > /run/carbd/fetched; echo "get=$?"
`)
	liveB := viewOf(t, b.id, b.state)
	if !liveB.link || !liveB.pins || !liveB.mount || len(liveB.chains) == 0 || len(liveB.tables) == 0 {
		t.Fatalf("the live run shows less than expected: %+v", liveB)
	}

	// The report: the killed run stale, the other live.
	code, rep, errs := a.cleanup(t, []*carbdRun{b})
	sa, sb := sandboxIn(rep, a.id), sandboxIn(rep, b.id)
	if code != 1 || sa == nil || sa.State != "stale" || sb == nil || sb.State != "live" || sb.Pid != b.cmd.Process.Pid {
		t.Fatalf("cleanup: exit %d, stderr %q, report %+v %+v; want 1, %s stale, %s live (pid %d)", code, errs, sa, sb, a.id, b.id, b.cmd.Process.Pid)
	}
	for _, k := range []string{daemon.ResTCPins, daemon.ResChain, daemon.ResJump, daemon.ResTable, daemon.ResCgroup, daemon.ResMount, daemon.ResIDLock} {
		if !kinds(sa)[k] {
			t.Errorf("the stale sandbox's report lacks a %s: %+v", k, sa.Resources)
		}
	}
	if len(sa.Recovery) != 1 || sa.Recovery[0].Workdir != workA || !strings.Contains(sa.Recovery[0].Command, "--workdir "+workA) {
		t.Errorf("the killed run's working directory is not named for recovery: %+v", sa.Recovery)
	}
	// The plain text says the same.
	cmd := exec.Command(bin, "cleanup", "--id", a.id, "--id", b.id, "--state-dir", a.state, "--state-dir", b.state)
	text, _ := cmd.Output()
	t.Logf("carbd cleanup:\n%s", text)
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(text), "sandbox "+a.id+": stale") || !strings.Contains(string(text), "sandbox "+b.id+": live") ||
		!strings.Contains(string(text), "needs recovery: run carbd in "+workA+" again") {
		t.Errorf("cleanup (text): exit %d\n%s", cmd.ProcessState.ExitCode(), text)
	}

	// --remove: every resource of the stale run goes, the live run's stay.
	code, rep, errs = a.cleanup(t, []*carbdRun{b}, "--remove")
	if code != 0 || len(rep.Failures) > 0 || rep.Stale != 0 || len(rep.Removed) != 1 || rep.Removed[0] != a.id {
		t.Fatalf("cleanup --remove: exit %d, stderr %q, report %+v", code, errs, rep)
	}
	if after := viewOf(t, a.id, a.state); !after.empty() {
		t.Errorf("after cleanup --remove the kernel still shows the stale run's %+v", after)
	}
	if _, err := os.Stat(filepath.Join(daemon.IndexDir, "id-"+a.id+".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale id's lock file: %v; want it removed", err)
	}
	if got := viewOf(t, b.id, b.state); !got.link || !got.pins || !got.mount || !got.holder || strings.Join(got.chains, "\n") != strings.Join(liveB.chains, "\n") || strings.Join(got.tables, "\n") != strings.Join(liveB.tables, "\n") {
		t.Errorf("the live run's resources changed: before %+v, after %+v", liveB, got)
	}
	// Never removed: the crashed run's working-directory state and its
	// staging layers, still named for recovery.
	if id, err := daemon.WorkStateID(workA); err != nil {
		t.Fatal(err)
	} else if _, err := os.Stat(filepath.Join(daemon.DefaultWorkStateRoot, id)); err != nil {
		t.Errorf("the crashed run's working-directory state: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(workA), ".carbd", a.id, "upper")); err != nil {
		t.Errorf("the crashed run's staging layers: %v", err)
	}
	if sa := sandboxIn(rep, a.id); sa == nil || len(sa.Recovery) != 1 || sa.State == "stale" {
		t.Errorf("after --remove the crashed run is %+v; want it not stale and still named for recovery", sa)
	}

	// The live run's agent still reaches the world through its hooks.
	b.tell(t, "go")
	if c := b.waitExit(t); c != 0 {
		t.Fatalf("the live run exited %d:\n%s", c, b.out.String())
	}
	if !strings.Contains(b.out.String(), "get=0") {
		t.Fatalf("the live run's agent did not reach the world:\n%s", b.out.String())
	}
	if got, err := os.ReadFile(filepath.Join(b.state, "sandboxes", b.id, "agent", "fetched")); err != nil || !strings.Contains(string(got), "hello from api.example.com") {
		t.Errorf("the live run's agent fetched %q (%v)", got, err)
	}

	// A second --remove finds nothing stale.
	code, rep, errs = a.cleanup(t, []*carbdRun{b}, "--remove")
	if code != 0 || rep.Stale != 0 || len(rep.Removed) != 0 || len(rep.Failures) != 0 {
		t.Errorf("a second cleanup --remove: exit %d, stderr %q, report %+v", code, errs, rep)
	}
	for _, s := range rep.Sandboxes {
		if s.Removable() {
			t.Errorf("a second cleanup --remove still lists %s with %+v", s.ID, s.Resources)
		}
	}
}
