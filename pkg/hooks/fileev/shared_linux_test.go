//go:build linux && amd64

package fileev

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/carbd/carbd/internal/bpffs"
	"github.com/carbd/carbd/internal/testutil"
)

// testPinDir is a pin directory of the test's own, removed at its end: the
// shared tracer in it is this test's alone (the default one is shared
// with every carbd and test on the host).
func testPinDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join("/sys/fs/bpf/carbd-fileev-test", testutil.UniqueName("ft"))
	t.Cleanup(func() {
		if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 {
			t.Errorf("pin dir %s left with %d entries", d, len(ents))
		}
		os.RemoveAll(d)
	})
	return d
}

// testCgroup makes a cgroup, killed and removed at the test's end.
func testCgroup(t *testing.T) (*Cgroup, *os.File) {
	t.Helper()
	cg, err := NewCgroup(testutil.UniqueName("fsh"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := cg.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		cg.Kill()
		for range 100 {
			if cg.Remove() == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("cgroup %s not removed", cg.Path)
	})
	return cg, f
}

// openRun starts a tracer and its Run loop; stop closes it (once) and
// checks that Run ended without error.
func openRun(t *testing.T, cfg Config) (*Tracer, *collector, func()) {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, c.handle) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Run: %v", err)
		}
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	t.Cleanup(stop)
	return tr, c, stop
}

func slotsIn(t *testing.T, dir string) []uint32 {
	t.Helper()
	ns, err := slotDirs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestSharedTracer: two sandboxes (two Tracers, each with its cgroup and
// its M) share one tracer: the second loads nothing; each sees only its
// own processes' records; the first to leave gives its slot back and the
// other keeps working; the last one out unpins the tracer and the kernel
// detaches it.
func TestSharedTracer(t *testing.T) {
	testutil.RequireRoot(t)
	pins := testPinDir(t)
	rootA, rootB := t.TempDir(), t.TempDir()
	cgA, fA := testCgroup(t)
	cgB, fB := testCgroup(t)
	trA, colA, stopA := openRun(t, Config{Root: rootA, PinDir: pins})
	trB, colB, stopB := openRun(t, Config{Root: rootB, PinDir: pins})
	if trA.host.coll == nil || trB.host.coll != nil {
		t.Fatalf("first tracer loaded: %v, second loaded: %v; want true, false", trA.host.coll != nil, trB.host.coll != nil)
	}
	if trA.sl.n == trB.sl.n {
		t.Fatalf("both tracers have slot %d", trA.sl.n)
	}
	dir := trA.shared.dir
	if got := slotsIn(t, dir); !slices.Equal(got, []uint32{trA.sl.n, trB.sl.n}) {
		t.Errorf("slots %v, want %v", got, []uint32{trA.sl.n, trB.sl.n})
	}
	var linkIDs []link.ID
	for _, l := range trA.host.links {
		info, err := l.Info()
		if err != nil {
			t.Fatal(err)
		}
		linkIDs = append(linkIDs, info.ID)
	}
	idA, err := trA.Trace(Target{Cgroup: cgA.Path})
	if err != nil {
		t.Fatal(err)
	}
	idB, err := trB.Trace(Target{Cgroup: cgB.Path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := trB.Trace(Target{Cgroup: cgA.Path}); err == nil {
		t.Errorf("a second sandbox traced the first one's cgroup")
	}

	hA := startHelper(t, "fork", rootA, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fA.Fd())})
	hB := startHelper(t, "fork", rootB, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fB.Fd())})
	hA.run(t)
	hB.run(t)
	syncTracer(t, trA)
	syncTracer(t, trB)
	check := func(name string, col *collector, own, other *helper, id int) {
		t.Helper()
		if rs, _ := col.of(own.pid); len(rs) == 0 {
			t.Errorf("%s: no records of its own helper", name)
		}
		if rs, _ := col.of(other.pid); len(rs) != 0 {
			t.Errorf("%s: %d records of the other sandbox's helper, first %v", name, len(rs), &rs[0])
		}
		for _, r := range col.all() {
			if r.Target != id {
				t.Errorf("%s: record of target %d, want %d: %v", name, r.Target, id, &r)
				break
			}
		}
		others, _ := forkRecords(col, own.pid)
		if _, ok := wroteForked(others); !ok {
			t.Errorf("%s: no write of forked.txt by the child in its cgroup", name)
		}
	}
	check("A", colA, hA, hB, idA)
	check("B", colB, hB, hA, idB)
	if lost := trA.Lost() + trB.Lost(); lost != 0 {
		t.Errorf("%d records lost", lost)
	}

	// A leaves: its slot goes, B keeps tracing.
	stopA()
	if got := slotsIn(t, dir); !slices.Equal(got, []uint32{trB.sl.n}) {
		t.Errorf("after the first left: slots %v, want %v", got, []uint32{trB.sl.n})
	}
	n := len(colB.all())
	again := startHelper(t, "fork", rootB, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(fB.Fd())})
	again.run(t)
	syncTracer(t, trB)
	if rs, _ := colB.of(again.pid); len(rs) == 0 {
		t.Errorf("B: no records after A left (%d before)", n)
	}
	// The last one out: unpinned and detached.
	stopB()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory %s still there after the last tracer closed: %v", dir, err)
	}
	for _, id := range linkIDs {
		if l, err := link.NewFromID(id); err == nil {
			l.Close()
			t.Errorf("link %d still attached after the last tracer closed", id)
		}
	}
}

// TestSharedSlotReclaim: a carbd that dies without giving its slot back
// (SIGKILL) leaves it to the next one that takes a slot: its targets
// leave the tracer's maps and its slot number is reused; a slot given back
// is reused too; the tracer loaded by the dead process stays attached for
// the living.
func TestSharedSlotReclaim(t *testing.T) {
	testutil.RequireRoot(t)
	pins := testPinDir(t)
	cgDead, _ := testCgroup(t)

	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), slotHolderEnv+"="+pins, slotHolderCgroupEnv+"="+cgDead.Path)
	holder.Stderr = os.Stderr
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if holder.ProcessState == nil {
			holder.Process.Kill()
			holder.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "slot 0\n" {
		t.Fatalf("holder: %q %v", line, err)
	}

	root := t.TempDir()
	tr1, _, stop1 := openRun(t, Config{Root: root, PinDir: pins})
	if tr1.host.coll != nil {
		t.Errorf("the tracer was loaded again while the holder's was pinned")
	}
	if tr1.sl.n != 1 {
		t.Errorf("slot %d beside a live holder of slot 0, want 1", tr1.sl.n)
	}
	if !cgroupTraced(t, tr1.host, cgDead.ID) {
		t.Fatalf("the holder's cgroup is not in the tracer's map")
	}

	// The holder crashes.
	holder.Process.Signal(syscall.SIGKILL)
	holder.Wait()
	if !cgroupTraced(t, tr1.host, cgDead.ID) {
		t.Fatalf("the holder's cgroup left the map before any reclaim")
	}
	tr2, _, stop2 := openRun(t, Config{Root: root, PinDir: pins})
	if tr2.sl.n != 0 {
		t.Errorf("slot %d after the holder of slot 0 died, want 0 (reclaimed)", tr2.sl.n)
	}
	if cgroupTraced(t, tr2.host, cgDead.ID) {
		t.Errorf("the dead holder's cgroup is still traced after its slot was reclaimed")
	}
	if got := slotsIn(t, tr2.shared.dir); !slices.Equal(got, []uint32{0, 1}) {
		t.Errorf("slots %v, want [0 1]", got)
	}
	var ring *ebpf.Map
	if err := tr2.host.rings.Lookup(uint32(0), &ring); err != nil {
		t.Errorf("slot 0 has no ring after it was taken again: %v", err)
	}

	// A slot given back is taken again; the tracer works for the living.
	stop1()
	tr3, col3, _ := openRun(t, Config{Root: root, PinDir: pins})
	if tr3.sl.n != 1 {
		t.Errorf("slot %d after slot 1 was given back, want 1", tr3.sl.n)
	}
	h := startHelper(t, "ops", root, nil)
	if _, err := tr3.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	h.run(t)
	syncTracer(t, tr3)
	if rs, _ := col3.of(h.pid); len(rs) == 0 {
		t.Errorf("no records in a reused slot")
	}
	stop2()
}

func cgroupTraced(t *testing.T, h *host, id uint64) bool {
	t.Helper()
	var v ftTarget
	err := h.cgroups.Lookup(id, &v)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// TestSharedOtherBuild: a tracer pinned by another build (another digest)
// is never adopted; while a live carbd uses it, it is left alone; once
// none does, the next start removes it.
func TestSharedOtherBuild(t *testing.T) {
	testutil.RequireRoot(t)
	pins := testPinDir(t)
	if err := bpffs.Ensure(pins); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(pins, "tp_btf-0123456789abcdef")
	if err := os.MkdirAll(filepath.Join(other, "slot-0"), 0o700); err != nil {
		t.Fatal(err)
	}
	lock, ok, err := lockDir(filepath.Join(other, "slot-0"), true)
	if err != nil || !ok {
		t.Fatalf("lock: %v %v", ok, err)
	}
	tr, _, stop := openRun(t, Config{Root: t.TempDir(), PinDir: pins})
	if tr.shared.dir == other || tr.host.coll == nil {
		t.Fatalf("adopted the other build's directory %s", other)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the other build's live tracer was removed: %v", err)
	}
	stop()
	lock.Close() // its carbd is gone
	_, _, stop = openRun(t, Config{Root: t.TempDir(), PinDir: pins})
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the other build's unused tracer is still there: %v", err)
	}
	stop()
	if ents, _ := os.ReadDir(pins); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left in the pin dir: %s", strings.Join(names, " "))
	}
}

// TestSharedStaleEpoch: an entry made for a slot's earlier owner (an
// older epoch: a target left behind, a syscall in flight when the slot
// changed hands) traces nothing into the new owner's ring.
func TestSharedStaleEpoch(t *testing.T) {
	testutil.RequireRoot(t)
	pins := testPinDir(t)
	root := t.TempDir()
	tr, col, _ := openRun(t, Config{Root: root, PinDir: pins})
	if tr.sl.epoch == 0 {
		t.Fatalf("slot %d has epoch 0", tr.sl.n)
	}
	stale := startHelper(t, "ops", t.TempDir(), nil)
	fresh := startHelper(t, "ops", t.TempDir(), nil)
	for _, e := range []struct {
		pid   int
		epoch uint32
	}{{stale.pid, tr.sl.epoch - 1}, {fresh.pid, tr.sl.epoch}} {
		v := ftTarget{ID: 7, Slot: tr.sl.n, Epoch: e.epoch}
		if err := tr.host.pids.Update(uint32(e.pid), v, ebpf.UpdateNoExist); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.host.pids.Delete(uint32(e.pid)) })
	}
	stale.run(t)
	fresh.run(t)
	syncTracer(t, tr)
	if rs, _ := col.of(stale.pid); len(rs) != 0 {
		t.Errorf("%d records of a target of the slot's earlier epoch, first %v", len(rs), &rs[0])
	}
	if rs, _ := col.of(fresh.pid); len(rs) == 0 {
		t.Errorf("no records of a target of the slot's epoch")
	}
}
