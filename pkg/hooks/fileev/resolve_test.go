package fileev

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeProc answers what /proc would, from maps.
type fakeProc struct {
	fds    map[[2]int]string
	cwds   map[int]string
	nspids map[int][]int
	// roots: device and inode of a process's root directory; a process
	// not listed has M as its root.
	roots map[int][2]uint64
	asked []string
}

func (f *fakeProc) FDPath(pid, fd int) (string, error) {
	f.asked = append(f.asked, fmt.Sprintf("fd %d/%d", pid, fd))
	if p, ok := f.fds[[2]int{pid, fd}]; ok {
		return p, nil
	}
	return "", errors.New("no such file or directory")
}

func (f *fakeProc) Cwd(pid int) (string, error) {
	f.asked = append(f.asked, fmt.Sprintf("cwd %d", pid))
	if p, ok := f.cwds[pid]; ok {
		return p, nil
	}
	return "", errors.New("no such file or directory")
}

func (f *fakeProc) NSPids(pid int) ([]int, error) { return f.nspids[pid], nil }

func (f *fakeProc) Root(pid int) (uint64, uint64, error) {
	f.asked = append(f.asked, fmt.Sprintf("root %d", pid))
	r, ok := f.roots[pid]
	if !ok {
		return kdev(tDev), tRootIno, nil
	}
	if r == [2]uint64{} {
		return 0, 0, errors.New("no such process")
	}
	return r[0], r[1], nil
}

const (
	tRoot    = "/m"
	tDev     = 1<<20 | 7
	tRootIno = 2
)

func newTestResolver(p *fakeProc, views map[uint32]string) *resolver {
	return newResolver(tRoot, tDev, tRootIno, p, func(id uint32) (string, bool) {
		v, ok := views[id]
		return v, ok
	}, func(ts uint64) time.Time { return time.Unix(0, int64(ts)) })
}

func reg(fd int32, ino uint64, pos int64) fdInfo {
	return fdInfo{FD: fd, Ino: ino, Pos: pos, Dev: tDev, Mode: sIFREG | 0o644, Valid: true}
}

func sc(nr uint32, op Op, ret int64, args ...uint64) rawEvent {
	e := rawEvent{Kind: kSyscall, Tgid: 100, Tid: 100, Target: 1, Nr: nr, Op: op, Ret: ret,
		FI: [2]fdInfo{{FD: -1}, {FD: -1}}}
	copy(e.Args[:], args)
	return e
}

func withPath(e rawEvent, paths ...string) rawEvent {
	e.Flags |= fPaths
	for i, p := range paths {
		e.Path[i], e.HasP[i] = p, true
	}
	return e
}

func withFI(e rawEvent, fis ...fdInfo) rawEvent {
	copy(e.FI[:], fis)
	return e
}

var cwdArg = uint64(0xffffffffffffff9c) // AT_FDCWD in a register

func TestResolveSequence(t *testing.T) {
	p := &fakeProc{
		fds:    map[[2]int]string{{100, 9}: "/elsewhere/x", {100, 4}: "/m/d", {100, 3}: "/m/replaced.txt"},
		cwds:   map[int]string{100: "/m"},
		nspids: map[int][]int{100: {100, 1}},
	}
	r := newTestResolver(p, nil)
	steps := []rawEvent{
		// open relative to the cwd: /proc is asked for the cwd once
		withFI(withPath(sc(257, OpOpen, 3, cwdArg, 0, 0o1101, 0o644), "a.txt"), reg(3, 50, 0)),
		withFI(sc(1, OpWrite, 4, 3, 0, 4), reg(3, 50, 4)),
		withFI(sc(1, OpWrite, 4, 3, 0, 4), reg(3, 50, 8)),
		// pwrite: the offset is the argument
		withFI(sc(18, OpWrite, 2, 3, 0, 2, 100), reg(3, 50, 8)),
		// preadv2 with offset -1 uses the file position
		withFI(sc(327, OpRead, 5, 3, 0, 1, ^uint64(0), 0, 0), reg(3, 50, 13)),
		withFI(sc(3, OpClose, 0, 3), reg(3, 50, 13)),
		// fd 3 reused by a file opened where the tracer did not see it,
		// for another inode: the stale entry is not trusted
		withFI(sc(0, OpRead, 1, 3, 0, 1), reg(3, 77, 1)),
		// a descriptor on another filesystem is outside
		withFI(sc(0, OpRead, 1, 9, 0, 1), fdInfo{FD: 9, Ino: 1, Pos: 1, Dev: 1<<20 | 99, Mode: sIFREG, Valid: true}),
		// dirfd from /proc (opened before tracing), mkdirat below it
		withFI(withPath(sc(258, OpMkdir, 0, 4, 0, 0o755), "e"), fdInfo{FD: 4, Ino: 60, Dev: tDev, Mode: sIFDIR, Valid: true}),
		// virtiofsd's reopen through /proc/self/fd and through its ns pid
		withFI(withPath(sc(257, OpOpen, 5, cwdArg, 0, 0, 0), "/proc/self/fd/4"), fdInfo{FD: 5, Ino: 60, Dev: tDev, Mode: sIFDIR, Valid: true}),
		withFI(withPath(sc(257, OpOpen, 6, cwdArg, 0, 2, 0), "/proc/1/fd/4"), fdInfo{FD: 6, Ino: 60, Dev: tDev, Mode: sIFDIR, Valid: true}),
		// dup copies the path, chdir moves the cwd
		withFI(sc(32, OpDup, 7, 5), fdInfo{FD: 7, Ino: 60, Dev: tDev, Mode: sIFDIR, Valid: true}),
		withFI(sc(81, OpChdir, 0, 7), fdInfo{FD: 7, Ino: 60, Dev: tDev, Mode: sIFDIR, Valid: true}),
		withPath(sc(87, OpUnlink, 0, 0), "f"),
		withPath(sc(263, OpUnlink, 0, cwdArg, 0, atRemoveDir), "../g"),
		withPath(sc(87, OpUnlink, 0, 0), "../../escape"),
		// a path the kernel cut: malformed, unless the call failed
		func() rawEvent { e := withPath(sc(83, OpMkdir, 0, 0, 0o755), "long"); e.Flags |= fP0Trunc; return e }(),
		func() rawEvent { e := withPath(sc(83, OpMkdir, -17, 0, 0o755), "long"); e.Flags |= fP0Trunc; return e }(),
		// renameat2 between two dirfds
		withPath(sc(316, OpRename, 0, 4, 0, 7, 0, 1), "x", "y"),
		// symlink: the first string is the link's content
		withPath(sc(266, OpSymlink, 0, 0, 7), "/etc/passwd", "lnk"),
		// M's root opened through another path is "."
		withFI(withPath(sc(257, OpOpen, 8, cwdArg, 0, 0, 0), "/host/view/of/m"), fdInfo{FD: 8, Ino: tRootIno, Dev: tDev, Mode: sIFDIR, Valid: true}),
		withPath(sc(258, OpMkdir, 0, 8, 0, 0o700), "n"),
		// unknown descriptor
		sc(77, OpTruncate, 0, 42, 0),
	}
	var got []string
	for i := range steps {
		rec := r.resolve(&steps[i])
		got = append(got, recLine(&rec))
	}
	want := []string{
		"open openat ret=fd a.txt flags=01101 mode=0644",
		"write write ret=4 a.txt off=0 len=4",
		"write write ret=4 a.txt off=4 len=4",
		"write pwrite64 ret=2 a.txt off=100 len=2",
		"read preadv2 ret=5 a.txt off=8 len=5",
		"close close ret=0 a.txt",
		"read read ret=1 replaced.txt off=0 len=1",
		"read read ret=1 !/elsewhere/x off=0 len=1",
		"mkdir mkdirat ret=0 d/e mode=0755",
		"open openat ret=fd d flags=0 mode=0",
		"open openat ret=fd d flags=02 mode=0",
		"dup dup ret=fd d",
		"chdir fchdir ret=0 d",
		"unlink unlink ret=0 d/f",
		"rmdir unlinkat ret=0 g flags=0x200",
		"unlink unlink ret=0 !/escape",
		"mkdir mkdir ret=0 d/long mode=0755 MALFORMED: path argument 0: longer than 511 bytes",
		"mkdir mkdir ret=-17 d/long mode=0755",
		"rename renameat2 ret=0 d/x -> d/y flags=0x1",
		"symlink symlinkat ret=0 d/lnk linkto=/etc/passwd",
		"open openat ret=fd . flags=0 mode=0",
		"mkdir mkdirat ret=0 n mode=0700",
		"truncate ftruncate ret=0 len=0 MALFORMED: ftruncate: descriptor 42 unknown: no such file or directory",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("records (-want +got):\n%s", d)
	}
	wantAsked := []string{"cwd 100", "fd 100/3", "fd 100/9", "fd 100/4", "fd 100/42"}
	if d := cmp.Diff(wantAsked, p.asked); d != "" {
		t.Errorf("/proc lookups (-want +got):\n%s", d)
	}
}

func TestResolveForkExitAndViews(t *testing.T) {
	p := &fakeProc{cwds: map[int]string{100: "/"}}
	// Target 2 sees M at "/" (virtiofsd after pivot_root).
	r := newTestResolver(p, map[uint32]string{2: "/"})
	open := withFI(withPath(sc(257, OpOpen, 3, cwdArg, 0, 0, 0), "dir/f"), reg(3, 50, 0))
	open.Target = 2
	rec := r.resolve(&open)
	if got := recLine(&rec); got != "open openat ret=fd dir/f flags=0 mode=0" {
		t.Errorf("view /: %s", got)
	}
	fork := rawEvent{Kind: kFork, Tgid: 100, Target: 2, Args: [6]uint64{200}}
	if rec := r.resolve(&fork); rec.Kind != KindFork || rec.Child != 200 {
		t.Errorf("fork record %+v", rec)
	}
	// The child inherits descriptors, cwd and its root being M: no /proc
	// lookup.
	rd := withFI(sc(0, OpRead, 1, 3), reg(3, 50, 1))
	rd.Tgid, rd.Target = 200, 2
	rec = r.resolve(&rd)
	if rec.Path != "dir/f" || !rec.InRoot || rec.Malformed != "" {
		t.Errorf("child read: %v", &rec)
	}
	exit := rawEvent{Kind: kExit, Tgid: 200}
	r.resolve(&exit)
	if _, ok := r.procs[200]; ok {
		t.Errorf("state of pid 200 kept after its exit")
	}
	if d := cmp.Diff([]string{"cwd 100", "root 100"}, p.asked); d != "" {
		t.Errorf("/proc lookups (-want +got):\n%s", d)
	}
	// Target 3 has M bind-mounted at /work.
	r = newTestResolver(&fakeProc{cwds: map[int]string{100: "/work/sub"}}, map[uint32]string{3: "/work"})
	mk := withPath(sc(83, OpMkdir, 0, 0, 0o755), "x")
	mk.Target = 3
	if rec := r.resolve(&mk); recLine(&rec) != "mkdir mkdir ret=0 sub/x mode=0755" {
		t.Errorf("view /work: %s", recLine(&rec))
	}
	mk.Path[0] = "/m/x" // M's host path is not M in this view
	if rec := r.resolve(&mk); rec.InRoot {
		t.Errorf("host path inside a /work view: %v", &rec)
	}
}

func TestProcAlias(t *testing.T) {
	r := newTestResolver(&fakeProc{nspids: map[int][]int{100: {100, 7}}}, nil)
	for _, tc := range []struct {
		p  string
		fd int
		ok bool
	}{
		{"/proc/self/fd/3", 3, true},
		{"/proc/thread-self/fd/4", 4, true},
		{"/proc/100/fd/5", 5, true},
		{"/proc/7/fd/6", 6, true},
		{"/proc/self/task/101/fd/8", 8, true},
		{"/proc/8/fd/6", 0, false},
		{"/proc/self/fd", 0, false},
		{"/proc/self/fd/x", 0, false},
		{"/proc/self/fd/-1", 0, false},
		{"/proc/self/fdinfo/3", 0, false},
		{"/m/proc/self/fd/3", 0, false},
	} {
		fd, ok := r.procAlias(100, tc.p)
		if fd != tc.fd || ok != tc.ok {
			t.Errorf("procAlias(%q) = %d %v, want %d %v", tc.p, fd, ok, tc.fd, tc.ok)
		}
	}
}

func TestKdev(t *testing.T) {
	// 8:1 (sda1), 259:65537 (a large minor), 0:46 (an anonymous device)
	for _, tc := range []struct {
		major, minor uint32
		want         uint64
	}{{8, 1, 0x801}, {0, 46, 46}, {259, 65537, 0x10010301}} {
		if got := kdev(tc.major<<20 | tc.minor); got != tc.want {
			t.Errorf("kdev(%d:%d) = %#x, want %#x", tc.major, tc.minor, got, tc.want)
		}
	}
}
