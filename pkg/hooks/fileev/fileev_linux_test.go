//go:build linux && amd64

package fileev

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// collector keeps what Run hands to the handler.
type collector struct {
	mu   sync.Mutex
	recs []Record
	evs  [][]decide.Event
}

func (c *collector) handle(r *Record, evs []decide.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, *r)
	c.evs = append(c.evs, slices.Clone(evs)) // Run reuses evs
}

// of returns the records (and their events) of pid.
func (c *collector) of(pid int) ([]Record, [][]decide.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rs []Record
	var es [][]decide.Event
	for i, r := range c.recs {
		if r.PID == pid {
			rs = append(rs, r)
			es = append(es, c.evs[i])
		}
	}
	return rs, es
}

func (c *collector) all() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.recs...)
}

// newTracer starts a tracer and its Run loop, stopped when the test ends.
func newTracer(t testing.TB, cfg Config) (*Tracer, *collector) {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, c.handle) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		tr.Close()
	})
	return tr, c
}

func syncTracer(t testing.TB, tr *Tracer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tr.Sync(ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// helper is a running helper process (see helper_linux_test.go).
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	pid   int
}

// startHelper starts the helper running script in dir and waits until
// it is ready.
func startHelper(t testing.TB, script, dir string, attr *syscall.SysProcAttr) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+script, "GODEBUG=updatemaxprocs=0,containermaxprocs=0")
	cmd.Dir = dir
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	h := &helper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), pid: cmd.Process.Pid}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	if line, err := h.out.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("helper not ready: %q %v", line, err)
	}
	return h
}

// run lets the helper go and waits for it to finish its script.
func (h *helper) run(t testing.TB) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.stdin.Close()
	out, _ := io.ReadAll(h.out)
	if err := h.cmd.Wait(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("helper: %v: %s", err, out)
	}
}

// send asks a looping helper (bench, readloop) for n more iterations and
// waits for them.
func (h *helper) send(t testing.TB, n int) {
	if _, err := fmt.Fprintf(h.stdin, "%d\n", n); err != nil {
		t.Fatal(err)
	}
	if line, err := h.out.ReadString('\n'); err != nil || line != "done\n" {
		t.Fatalf("helper: %q %v", line, err)
	}
}

// mountOverlay mounts an overlay (lower, upper, work) on merged and
// returns merged: the shape of M.
func mountOverlay(t testing.TB) string {
	t.Helper()
	base := t.TempDir()
	dirs := map[string]string{}
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		dirs[d] = filepath.Join(base, d)
		if err := os.Mkdir(dirs[d], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", dirs["lower"], dirs["upper"], dirs["work"])
	if err := unix.Mount("overlay", dirs["merged"], "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dirs["merged"], unix.MNT_DETACH); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	return dirs["merged"]
}

const (
	oRO  = unix.O_RDONLY
	oCE  = unix.O_CLOEXEC
	oDir = unix.O_DIRECTORY
)

func openLine(sc, path string, flags, mode int) string {
	return fmt.Sprintf("open %s ret=fd %s flags=%#o mode=%#o", sc, path, flags, mode)
}

// opsRecords is what helperOps produces, relative to M.
var opsRecords = []string{
	openLine("openat", "a.txt", unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|oCE, 0o644),
	"write write ret=12 a.txt off=0 len=12",
	"write pwrite64 ret=5 a.txt off=0 len=5",
	"write writev ret=4 a.txt off=12 len=4",
	"truncate ftruncate ret=0 a.txt len=10",
	"fallocate fallocate ret=0 a.txt mode=0 off=0 len=100",
	"chmod fchmod ret=0 a.txt mode=0600",
	"setxattr fsetxattr ret=0 a.txt name=user.k",
	"close close ret=0 a.txt",
	openLine("open", "a.txt", oRO|oCE, 0),
	"read read ret=4 a.txt off=0 len=4",
	"read pread64 ret=3 a.txt off=5 len=3",
	"read readv ret=4 a.txt off=4 len=4",
	"dup dup ret=fd a.txt",
	"read read ret=2 a.txt off=8 len=2",
	"mmap mmap ret=addr a.txt off=0 len=4096 prot=1 flags=0x2",
	"close close ret=0 a.txt",
	"close close ret=0 a.txt",
	"mkdir mkdir ret=0 sub mode=0755",
	openLine("openat", "sub", oRO|oDir|oCE, 0),
	"mkdir mkdirat ret=0 sub/inner mode=0700",
	openLine("openat", "sub/b.txt", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|oCE, 0o640),
	"write write ret=3 sub/b.txt off=0 len=3",
	"close close ret=0 sub/b.txt",
	"rename renameat2 ret=0 sub/b.txt -> c.txt",
	"rename rename ret=0 c.txt -> d.txt",
	"rename renameat ret=0 sub/inner -> sub/inner2",
	"link link ret=0 d.txt -> e.txt",
	"link linkat ret=0 d.txt -> sub/f.txt",
	"symlink symlink ret=0 s.lnk linkto=d.txt",
	"symlink symlinkat ret=0 sub/t.lnk linkto=../d.txt",
	"chmod chmod ret=0 d.txt mode=0640",
	"chmod fchmodat ret=0 sub/f.txt mode=0600",
	"chown chown ret=0 d.txt uid=0 gid=0",
	"chown lchown ret=0 s.lnk uid=-1 gid=0",
	"chown fchownat ret=0 sub/f.txt uid=0 gid=-1",
	"truncate truncate ret=0 d.txt len=2",
	"setxattr setxattr ret=0 d.txt name=user.x",
	"removexattr removexattr ret=0 d.txt name=user.x",
	openLine("creat", "g.txt", unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC, 0o600),
	openLine("openat", "d.txt", oRO|oCE, 0),
	"copy copy_file_range ret=2 d.txt -> g.txt off=0 off2=0 len=2",
	"copy sendfile ret=2 d.txt -> g.txt off=0 off2=2 len=2",
	"close close ret=0 d.txt",
	"close close ret=0 g.txt",
	"unlink unlink ret=0 e.txt",
	"unlink unlinkat ret=0 s.lnk",
	"unlink unlinkat ret=0 sub/t.lnk",
	"rmdir unlinkat ret=0 sub/inner2 flags=0x200",
	"mknod mknodat ret=0 fifo mode=010600",
	"unlink unlink ret=-2 nonexistent",
	openLine("openat", ".", oRO|oDir|oCE, 0),
	"chdir chdir ret=0 sub",
	openLine("openat", "sub/h.txt", unix.O_WRONLY|unix.O_CREAT|oCE, 0o600),
	"close close ret=0 sub/h.txt",
	"chdir fchdir ret=0 .",
	openLine("openat2", "d.txt", oRO|oCE, 0),
	"close close ret=0 d.txt",
	openLine("open", "!/etc/passwd", oRO|oCE, 0),
	"read read ret=5 !/etc/passwd off=0 len=5",
	"close close ret=0 !/etc/passwd",
	"unlink unlinkat ret=0 sub/f.txt",
	"unlink unlinkat ret=0 sub/h.txt",
	"rmdir rmdir ret=0 sub",
	"close close ret=0 sub",
	"close close ret=0 .",
}

// opsEvents are the decide.Events of opsRecords (content aside).
var opsEvents = []string{
	"out file:create a.txt stageable path(target)=a.txt mode(control)=0644 truncate(control)=true",
	"out file:write a.txt stageable path(target)=a.txt offset(control)=0 data(content)",
	"out file:write a.txt stageable path(target)=a.txt offset(control)=0 data(content)",
	"out file:write a.txt stageable path(target)=a.txt offset(control)=12 data(content)",
	"out file:truncate a.txt stageable path(target)=a.txt length(control)=10",
	"out file:write a.txt stageable path(target)=a.txt offset(control)=0 length(control)=100 fallocate(control)=0x0",
	"out file:chmod a.txt stageable path(target)=a.txt mode(control)=0600",
	"out file:setxattr a.txt stageable path(target)=a.txt name(control)=user.k",
	"in file:read a.txt unset source=file:a.txt",
	"in file:read a.txt unset source=file:a.txt",
	"in file:read a.txt unset source=file:a.txt",
	"in file:read a.txt unset source=file:a.txt",
	"in file:read a.txt unset source=file:a.txt",
	"out file:mkdir sub stageable path(target)=sub mode(control)=0755",
	"out file:mkdir sub/inner stageable path(target)=sub/inner mode(control)=0700",
	"out file:create sub/b.txt stageable path(target)=sub/b.txt mode(control)=0640",
	"out file:write sub/b.txt stageable path(target)=sub/b.txt offset(control)=0 data(content)",
	"out file:rename sub/b.txt stageable path(target)=sub/b.txt newpath(target)=c.txt",
	"out file:rename c.txt stageable path(target)=c.txt newpath(target)=d.txt",
	"out file:rename sub/inner stageable path(target)=sub/inner newpath(target)=sub/inner2",
	"out file:link d.txt stageable path(target)=d.txt newpath(target)=e.txt",
	"out file:link d.txt stageable path(target)=d.txt newpath(target)=sub/f.txt",
	"out file:symlink s.lnk stageable path(target)=s.lnk linkto(target)=d.txt",
	"out file:symlink sub/t.lnk stageable path(target)=sub/t.lnk linkto(target)=../d.txt",
	"out file:chmod d.txt stageable path(target)=d.txt mode(control)=0640",
	"out file:chmod sub/f.txt stageable path(target)=sub/f.txt mode(control)=0600",
	"out file:chown d.txt stageable path(target)=d.txt uid(control)=0 gid(control)=0",
	"out file:chown s.lnk stageable path(target)=s.lnk uid(control)=-1 gid(control)=0",
	"out file:chown sub/f.txt stageable path(target)=sub/f.txt uid(control)=0 gid(control)=-1",
	"out file:truncate d.txt stageable path(target)=d.txt length(control)=2",
	"out file:setxattr d.txt stageable path(target)=d.txt name(control)=user.x",
	"out file:removexattr d.txt stageable path(target)=d.txt name(control)=user.x",
	"out file:create g.txt stageable path(target)=g.txt mode(control)=0600 truncate(control)=true",
	"in file:read d.txt unset source=file:d.txt",
	"out file:write g.txt stageable path(target)=g.txt offset(control)=0 data(content)",
	"in file:read d.txt unset source=file:d.txt",
	"out file:write g.txt stageable path(target)=g.txt offset(control)=2 data(content)",
	"out file:unlink e.txt stageable path(target)=e.txt",
	"out file:unlink s.lnk stageable path(target)=s.lnk",
	"out file:unlink sub/t.lnk stageable path(target)=sub/t.lnk",
	"out file:rmdir sub/inner2 stageable path(target)=sub/inner2",
	"out file:create fifo stageable path(target)=fifo mode(control)=010600",
	"out file:create sub/h.txt stageable path(target)=sub/h.txt mode(control)=0600",
	"out file:unlink sub/f.txt stageable path(target)=sub/f.txt",
	"out file:unlink sub/h.txt stageable path(target)=sub/h.txt",
	"out file:rmdir sub stageable path(target)=sub",
}

// opsContent is the content of the read events whose bytes no later
// operation changes (a.txt is "HELLO worl" and 90 NULs from the
// fallocate on; d.txt is "be" from the truncate on).
var opsContent = []string{"HELL", " wo", "O wo", "rl", "HELLO worl" + strings.Repeat("\x00", 90), "be", "be"}

func TestTraceOps(t *testing.T) {
	testutil.RequireRoot(t)
	for _, mech := range []string{MechTPBTF, MechRawTP} {
		for _, fs := range []string{"dir", "overlay"} {
			t.Run(mech+"/"+fs, func(t *testing.T) {
				root := t.TempDir()
				if fs == "overlay" {
					root = mountOverlay(t)
				}
				tr, col := newTracer(t, Config{Root: root, Attach: mech})
				if got, _ := tr.Mechanism(); got != mech {
					t.Fatalf("mechanism %s, want %s", got, mech)
				}
				traced := startHelper(t, "ops", root, nil)
				other := startHelper(t, "ops", t.TempDir(), nil)
				if _, err := tr.Trace(Target{PID: traced.pid}); err != nil {
					t.Fatal(err)
				}
				traced.run(t)
				other.run(t)
				syncTracer(t, tr)

				recs, evs := col.of(traced.pid)
				var got []string
				var gotEv []string
				var reads []string
				for i := range recs {
					if recs[i].Kind != KindSyscall {
						continue
					}
					got = append(got, recLine(&recs[i]))
					for j := range evs[i] {
						gotEv = append(gotEv, evLine(&evs[i][j]))
						if evs[i][j].Op == OpNameRead {
							reads = append(reads, evs[i][j].Content)
						}
					}
				}
				if d := cmp.Diff(opsRecords, got); d != "" {
					t.Errorf("records (-want +got):\n%s", d)
				}
				if d := cmp.Diff(opsEvents, gotEv); d != "" {
					t.Errorf("events (-want +got):\n%s", d)
				}
				if d := cmp.Diff(opsContent, reads); d != "" {
					t.Errorf("read contents (-want +got):\n%s", d)
				}
				if last := recs[len(recs)-1]; last.Kind != KindExit {
					t.Errorf("last record %v, want the exit", &last)
				}
				if rs, _ := col.of(other.pid); len(rs) != 0 {
					t.Errorf("untraced process produced %d records, first %v", len(rs), &rs[0])
				}
				if tr.Lost() != 0 || tr.TakeRescan() {
					t.Errorf("lost %d, stats %+v", tr.Lost(), tr.Stats())
				}
			})
		}
	}
}

// forkRecords returns the records of processes other than the helper,
// and the children the helper forked.
func forkRecords(col *collector, helperPID int) (others []Record, children []int) {
	for _, r := range col.all() {
		switch {
		case r.Kind == KindFork && r.PID == helperPID:
			children = append(children, r.Child)
		case r.PID != helperPID && r.Kind == KindSyscall:
			others = append(others, r)
		}
	}
	return others, children
}

// wroteForked reports whether a record shows the shell writing "hi\n" to
// forked.txt in M, and the shell's pid.
func wroteForked(recs []Record) (int, bool) {
	for _, r := range recs {
		if r.Op == OpWrite && r.Path == "forked.txt" && r.InRoot && r.Ret == 3 {
			evs := Events(&r)
			if len(evs) == 1 && evs[0].Content == "hi\n" && evs[0].Op == OpNameWrite {
				return r.PID, true
			}
		}
	}
	return 0, false
}

func TestFollowChildren(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("pid", func(t *testing.T) {
		root := t.TempDir()
		tr, col := newTracer(t, Config{Root: root})
		h := startHelper(t, "fork", root, nil)
		if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
			t.Fatal(err)
		}
		h.run(t)
		syncTracer(t, tr)
		others, children := forkRecords(col, h.pid)
		pid, ok := wroteForked(others)
		if !ok {
			t.Fatalf("no write of forked.txt by a child; children %v, records:\n%v", children, others)
		}
		if !slicesContains(children, pid) {
			t.Errorf("writer %d is not among the forked children %v", pid, children)
		}
	})
	t.Run("nofollow", func(t *testing.T) {
		root := t.TempDir()
		tr, col := newTracer(t, Config{Root: root})
		h := startHelper(t, "fork", root, nil)
		if _, err := tr.Trace(Target{PID: h.pid, NoFollow: true}); err != nil {
			t.Fatal(err)
		}
		h.run(t)
		syncTracer(t, tr)
		others, children := forkRecords(col, h.pid)
		if len(children) == 0 {
			t.Errorf("no fork record for the helper's child")
		}
		if len(others) != 0 {
			t.Errorf("an untraced child produced %d records, first %v", len(others), &others[0])
		}
		if _, err := os.Stat(filepath.Join(root, "forked.txt")); err != nil {
			t.Errorf("the child did not run: %v", err)
		}
	})
	t.Run("cgroup", func(t *testing.T) {
		root := t.TempDir()
		cg, err := NewCgroup(testutil.UniqueName("fev"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cg.Kill()
			// The kernel empties the cgroup asynchronously after the kill.
			for range 100 {
				if cg.Remove() == nil {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Errorf("cgroup %s not removed", cg.Path)
		})
		tr, col := newTracer(t, Config{Root: root})
		id, err := tr.Trace(Target{Cgroup: cg.Path})
		if err != nil {
			t.Fatal(err)
		}
		f, err := cg.Open()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		h := startHelper(t, "fork", root, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())})
		// An untraced process in another directory meanwhile.
		other := startHelper(t, "fork", t.TempDir(), nil)
		h.run(t)
		other.run(t)
		syncTracer(t, tr)
		own, _ := col.of(h.pid)
		if len(own) == 0 {
			t.Fatalf("no records of the helper in the cgroup")
		}
		for _, r := range own {
			if r.Target != id {
				t.Errorf("record %v has target %d, want %d", &r, r.Target, id)
			}
		}
		others, _ := forkRecords(col, h.pid)
		if _, ok := wroteForked(others); !ok {
			t.Errorf("no write of forked.txt by the shell in the cgroup")
		}
		if rs, _ := col.of(other.pid); len(rs) != 0 {
			t.Errorf("a process outside the cgroup produced records: %v", &rs[0])
		}
		// After Untrace nothing more is recorded.
		if err := tr.Untrace(id); err != nil {
			t.Fatal(err)
		}
		n := len(col.all())
		again := startHelper(t, "fork", root, &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())})
		again.run(t)
		syncTracer(t, tr)
		if rs := col.all()[n:]; len(rs) != 0 {
			t.Errorf("%d records after Untrace, first %v", len(rs), &rs[0])
		}
	})
}

func slicesContains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestRingOverflowCountsLoss(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	tr, err := New(Config{Root: root, RingBytes: os.Getpagesize()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := startHelper(t, "burst", root, nil)
	if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	// Nobody reads while the helper changes a file's mode 2,000 times:
	// a one-page ring holds about 20 records.
	h.run(t)
	lost := tr.Lost()
	if lost == 0 {
		t.Fatalf("no loss counted; stats %+v", tr.Stats())
	}
	if st := tr.Stats(); st.RingFull != lost {
		t.Errorf("stats %+v, lost %d", st, lost)
	}

	col := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, col.handle) }()
	syncTracer(t, tr)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var reported uint64
	var kept int
	for _, r := range col.all() {
		switch {
		case r.Kind == KindLoss:
			reported = r.Lost
		case r.Kind == KindSyscall && r.Op == OpChmod:
			kept++
		}
	}
	if reported != lost {
		t.Errorf("reader reported loss %d, counter %d", reported, lost)
	}
	if kept == 0 || uint64(kept)+lost < 2000 {
		t.Errorf("%d chmod records kept and %d lost, want at least 2000 together", kept, lost)
	}
	if !tr.TakeRescan() {
		t.Errorf("TakeRescan false after a loss")
	}
	if tr.TakeRescan() {
		t.Errorf("TakeRescan true twice for one loss")
	}
}

func TestLongPathIsMalformed(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	tr, col := newTracer(t, Config{Root: root})
	h := startHelper(t, "long", root, nil)
	if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	h.run(t)
	syncTracer(t, tr)
	recs, evs := col.of(h.pid)
	var mk []string
	for i, r := range recs {
		if r.Op != OpMkdir {
			continue
		}
		if r.Malformed != "" {
			mk = append(mk, "malformed")
			if len(evs[i]) != 0 {
				t.Errorf("malformed record mapped to events %v", evs[i])
			}
		} else {
			mk = append(mk, fmt.Sprintf("ok %d", len(r.Path)))
		}
	}
	// 200, 401 and 602-byte paths, then 803: the last two do not fit in 511.
	want := []string{"ok 200", "ok 401", "malformed", "malformed"}
	if d := cmp.Diff(want, mk); d != "" {
		t.Errorf("mkdir records (-want +got):\n%s", d)
	}
	if st := tr.Stats(); st.Malformed != 2 {
		t.Errorf("stats %+v, want 2 malformed", st)
	}
	if !tr.TakeRescan() {
		t.Errorf("TakeRescan false after malformed records")
	}
}

func TestTraceRejects(t *testing.T) {
	testutil.RequireRoot(t)
	tr, err := New(Config{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, tc := range []struct {
		tg   Target
		want string
	}{
		{Target{}, "exactly one"},
		{Target{PID: 1, Cgroup: "/sys/fs/cgroup"}, "exactly one"},
		{Target{PID: os.Getpid()}, "carbd itself"},
		{Target{PID: 1, View: "rel"}, "not an absolute path"},
		{Target{PID: 1 << 30}, "no such file"},
		{Target{Cgroup: "/tmp"}, "not below the cgroup2 mount"},
	} {
		if _, err := tr.Trace(tc.tg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Trace(%+v) = %v, want an error with %q", tc.tg, err, tc.want)
		}
	}
	if mnt, err := Cgroup2Mount(); err == nil {
		if _, err := tr.Trace(Target{Cgroup: mnt}); err == nil || !strings.Contains(err.Error(), "level 0") {
			t.Errorf("Trace(root cgroup) = %v, want a level error", err)
		}
	}
	if err := tr.Untrace(42); !errors.Is(err, ErrNotFound) {
		t.Errorf("Untrace(42) = %v, want ErrNotFound", err)
	}
	for _, cfg := range []Config{{Root: "rel"}, {Root: "/", RingBytes: 5000}, {Root: "/", Attach: "kprobe"}, {Root: "/nonexistent-fileev"}} {
		if tr, err := New(cfg); err == nil {
			tr.Close()
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

// TestVirtiofsdTraced starts virtiofsd inside a traced cgroup, connects
// to its socket as a VMM would (without speaking vhost-user) and
// disconnects: virtiofsd forks its sandbox child on the connection,
// pivots into M, and exits when the peer goes away. The tracer follows
// both processes and resolves the child's paths through View "/".
//
// "fresh run dir" is a new machine's first virtiofsd: /run/virtiofsd does
// not exist yet (here: a private tmpfs on /run, so the host's is left
// alone), and virtiofsd's parent, which never pivots, creates it for its
// pid file. That mkdir names the host's /var/run, never var/run/virtiofsd
// in M.
func TestVirtiofsdTraced(t *testing.T) {
	requireVirtiofsd(t)
	t.Run("existing run dir", func(t *testing.T) { traceVirtiofsd(t, "") })
	t.Run("fresh run dir", func(t *testing.T) {
		testutil.RequireTool(t, "unshare")
		wrapper := filepath.Join(t.TempDir(), "virtiofsd-fresh-run")
		script := "#!/bin/sh\nexec unshare -m --propagation private sh -c " +
			"'mount -t tmpfs carbd-fresh-run /run && exec \"$0\" \"$@\"' " + DefaultVirtiofsd + ` "$@"` + "\n"
		if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		parent, recs := traceVirtiofsd(t, wrapper)
		var made bool
		for _, r := range recs {
			if r.Kind != KindSyscall || r.Ret < 0 {
				continue
			}
			if r.PID == parent && r.Op == OpMkdir && r.Path == "/var/run/virtiofsd" && !r.InRoot {
				made = true
			}
			for _, p := range []struct {
				path string
				in   bool
			}{{r.Path, r.InRoot}, {r.Path2, r.InRoot2}} {
				if p.in && (strings.HasPrefix(p.path, "var/") || strings.HasPrefix(p.path, "run/")) {
					t.Errorf("a host path became a path in M: %v", &r)
				}
			}
			if r.PID == parent && (r.InRoot && r.Path != "." || r.InRoot2) {
				t.Errorf("virtiofsd's parent never pivots, yet %v is in M", &r)
			}
		}
		if !made {
			t.Errorf("no mkdir of the host's /var/run/virtiofsd by virtiofsd %d", parent)
		}
	})
}

// traceVirtiofsd runs one virtiofsd (binary: "" for the default) in a
// traced cgroup through one VMM connection and returns its pid and every
// record.
func traceVirtiofsd(t *testing.T, binary string) (int, []Record) {
	root := mountOverlay(t)
	cg, err := NewCgroup(testutil.UniqueName("fev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cg.Kill()
		for range 100 {
			if cg.Remove() == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("cgroup %s not removed", cg.Path)
	})
	tr, col := newTracer(t, Config{Root: root})
	if _, err := tr.Trace(Target{Cgroup: cg.Path, View: "/"}); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "vfs.sock")
	v, err := StartVirtiofsd(context.Background(), VirtiofsdConfig{Binary: binary, SocketPath: sock, Source: root, Cgroup: cg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Stop() })
	// Children forked before the connection (a wrapper's) are not the
	// sandbox child.
	syncTracer(t, tr)
	before := map[int]bool{}
	for _, r := range col.all() {
		if r.Kind == KindFork && r.PID == v.PID() {
			before[r.Child] = true
		}
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the sandbox child: its fork is recorded.
	var child int
	for child == 0 {
		syncTracer(t, tr)
		for _, r := range col.all() {
			if r.Kind == KindFork && r.PID == v.PID() && !before[r.Child] {
				child = r.Child
			}
		}
		select {
		case <-v.Done():
			t.Fatalf("virtiofsd exited before forking: %v", v.Wait())
		default:
		}
	}
	conn.Close()
	<-v.Done()
	if err := v.Wait(); err != nil {
		t.Errorf("virtiofsd after the peer left: %v", err)
	}
	syncTracer(t, tr)
	recs, _ := col.of(child)
	var sawRoot bool
	for _, r := range recs {
		t.Logf("%v", &r)
		if r.Kind == KindSyscall && r.Op == OpOpen && r.Ret >= 0 && r.InRoot && r.Path == "." {
			sawRoot = true
		}
	}
	if !sawRoot {
		t.Errorf("no open of M's root by the sandbox child %d", child)
	}
	if last := recs[len(recs)-1]; last.Kind != KindExit {
		t.Errorf("last record of the child %v, want its exit", &last)
	}
	return v.PID(), col.all()
}

// compatELF is a static x86-64 executable of 136 bytes that makes one
// ia32 syscall (int $0x80, getpid) and exits with the 64-bit exit:
//
//	mov $20, %eax; int $0x80; mov $60, %eax; xor %edi, %edi; syscall
func compatELF() []byte {
	code := []byte{0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05}
	const base, hdr = 0x400000, 64 + 56
	b := make([]byte, hdr+len(code))
	le := binary.LittleEndian
	copy(b, "\x7fELF\x02\x01\x01") // 64-bit, little-endian, version 1
	le.PutUint16(b[16:], 2)        // ET_EXEC
	le.PutUint16(b[18:], 62)       // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base+hdr) // entry
	le.PutUint64(b[32:], 64)       // program headers
	le.PutUint16(b[52:], 64)       // header size
	le.PutUint16(b[54:], 56)       // program header size
	le.PutUint16(b[56:], 1)        // one
	ph := b[64:]
	le.PutUint32(ph[0:], 1)     // PT_LOAD
	le.PutUint32(ph[4:], 5)     // R+X
	le.PutUint64(ph[16:], base) // vaddr
	le.PutUint64(ph[24:], base) // paddr
	le.PutUint64(ph[32:], uint64(len(b)))
	le.PutUint64(ph[40:], uint64(len(b)))
	le.PutUint64(ph[48:], 0x1000)
	copy(b[hdr:], code)
	return b
}

// TestCompatSyscallCountsLoss: a traced process that makes an ia32
// syscall (whose numbers the tracer does not decode) counts as a loss.
func TestCompatSyscallCountsLoss(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "compat")
	if err := os.WriteFile(bin, compatELF(), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, mech := range []string{MechTPBTF, MechRawTP} {
		t.Run(mech, func(t *testing.T) {
			cg, err := NewCgroup(testutil.UniqueName("fev"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cg.Remove() })
			tr, _ := newTracer(t, Config{Root: dir, Attach: mech})
			if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
				t.Fatal(err)
			}
			f, err := cg.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// Untraced first: nothing counted.
			if out, err := exec.Command(bin).CombinedOutput(); err != nil {
				t.Fatalf("compat binary: %v %s", err, out)
			}
			if n := tr.Stats().Compat; n != 0 {
				t.Fatalf("untraced ia32 syscall counted: %d", n)
			}
			cmd := exec.Command(bin)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("compat binary: %v %s", err, out)
			}
			if st := tr.Stats(); st.Compat != 1 || tr.Lost() != 1 {
				t.Errorf("stats %+v lost %d, want one compat syscall", st, tr.Lost())
			}
			if !tr.TakeRescan() {
				t.Errorf("TakeRescan false after an ia32 syscall")
			}
		})
	}
}

// TestPipeWiringNotMalformed runs a shell in a traced cgroup whose
// children wire pipes onto their stdio (dup2 of a pipe, as every
// subprocess call does) and exit at once: no record is malformed (which
// would make the daemon decide every staged change again), and the
// pipeline's write into the directory is seen with its content.
func TestPipeWiringNotMalformed(t *testing.T) {
	testutil.RequireRoot(t)
	root := mountOverlay(t)
	cg, err := NewCgroup(testutil.UniqueName("fev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Remove() })
	tr, col := newTracer(t, Config{Root: root})
	if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
		t.Fatal(err)
	}
	f, err := cg.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("/bin/sh", "-c", `for i in 1 2 3 4 5; do echo "line $i" | cat | cat > out.txt; x=$(echo sub); done`)
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh: %v %s", err, out)
	}
	syncTracer(t, tr)
	dups, wrote := 0, false
	for _, r := range col.all() {
		if r.Malformed != "" {
			t.Errorf("malformed: %s", &r)
		}
		if r.Op == OpDup && r.Ret >= 0 {
			dups++
		}
		if r.Op == OpWrite && r.Path == "out.txt" && r.Content == "line 5\n" {
			wrote = true
		}
	}
	if dups == 0 {
		t.Errorf("no dup traced: the shell wired no pipe?")
	}
	if !wrote {
		t.Errorf("the write of out.txt was not seen with its content")
	}
	if st := tr.Stats(); st.Malformed != 0 || tr.TakeRescan() {
		t.Errorf("stats %+v: a re-scan asked for", st)
	}
}

// TestOwnedString: content read back becomes a string without a copy,
// unless most of its buffer went unused.
func TestOwnedString(t *testing.T) {
	buf := []byte("0123456789")
	if s := ownedString(buf, 8); s != "01234567" || unsafe.StringData(s) != &buf[0] {
		t.Errorf("8 of 10 bytes: %q, shared %v; want the buffer itself", s, unsafe.StringData(s) == &buf[0])
	}
	if s := ownedString(buf, 4); s != "0123" || unsafe.StringData(s) == &buf[0] {
		t.Errorf("4 of 10 bytes: %q, want a copy", s)
	}
	if s := ownedString(buf, 0); s != "" {
		t.Errorf("0 bytes: %q", s)
	}
}

// TestHandleAllocs bounds what the reader allocates for the benchmark's
// cycle (openat O_CREAT, write, pread64, close, unlink: 5 records, 4
// decide.Events), content read-back off: the Events' own strings and
// Fields, nothing per record besides. It guards the reuse of the raw
// event, the Record and the events slice.
func TestHandleAllocs(t *testing.T) {
	cycle := [][]byte{
		encodeEvent(ptr(withFI(withPath(sc(257, OpOpen, 3, cwdArg, 0, 0o1102, 0o644), "cycle.bin"), reg(3, 50, 0)))),
		encodeEvent(ptr(withFI(sc(1, OpWrite, 4096, 3, 0, 4096), reg(3, 50, 4096)))),
		encodeEvent(ptr(withFI(sc(17, OpRead, 4096, 3, 0, 4096, 0), reg(3, 50, 4096)))),
		encodeEvent(ptr(withFI(sc(3, OpClose, 0, 3), reg(3, 50, 4096)))),
		encodeEvent(ptr(withPath(sc(87, OpUnlink, 0, 0), "cycle.bin"))),
	}
	tr := &Tracer{cfg: Config{MaxContent: -1}}
	res := newTestResolver(&fakeProc{cwds: map[int]string{100: tRoot}}, nil)
	events := 0
	h := func(r *Record, evs []decide.Event) {
		if r.Malformed != "" {
			t.Fatalf("malformed: %s", r)
		}
		events += len(evs)
	}
	run := func() {
		for _, b := range cycle {
			tr.handle(res, b, h, func() {})
		}
	}
	run()
	if events != 4 {
		t.Fatalf("%d events for one cycle, want 4", events)
	}
	// The events' own (the create's Fields and mode, 2 strings; the
	// write's Fields; the read's Source; the unlink's Fields) and the
	// two relative paths joined to the cwd.
	const most = 8
	if n := testing.AllocsPerRun(100, run); n > most {
		t.Errorf("%.1f allocations per cycle, want at most %d", n, most)
	}
}

func ptr(e rawEvent) *rawEvent { return &e }
