package fileev

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestResolveOps resolves one record of every traced syscall (the table
// must name each of syscallNames) in a process whose cwd is M and whose
// descriptor 3 is the file f and 4 the directory d in M.
func TestResolveOps(t *testing.T) {
	f3 := reg(3, 50, 10)
	d4 := fdInfo{FD: 4, Ino: 60, Dev: tDev, Mode: sIFDIR | 0o755, Valid: true}
	at4 := uint64(4)
	for _, tc := range []struct {
		e    rawEvent
		want string
	}{
		// open
		{withFI(withPath(sc(2, OpOpen, 5, 0, 0o1101, 0o600), "a"), reg(5, 51, 0)), "open open ret=fd a flags=01101 mode=0600"},
		{withFI(withPath(sc(85, OpOpen, 5, 0, 0o640), "a"), reg(5, 51, 0)), "open creat ret=fd a flags=01101 mode=0640"},
		{withFI(withPath(sc(257, OpOpen, 5, at4, 0, 0o100, 0o644), "a"), reg(5, 51, 0), d4), "open openat ret=fd d/a flags=0100 mode=0644"},
		{func() rawEvent {
			e := withFI(withPath(sc(437, OpOpen, 5, cwdArg, 0, 0, 24), "/m/b"), reg(5, 52, 0))
			e.Flags |= fAux0 | fAux1
			e.Aux = [2]uint64{0o1, 0o600}
			return e
		}(), "open openat2 ret=fd b flags=01 mode=0600"},
		{withPath(sc(437, OpOpen, 5, cwdArg, 0, 0, 24), "b"), "open openat2 ret=fd b flags=0 mode=0 MALFORMED: openat2: open_how unreadable"},
		{withFI(sc(304, OpOpen, 3, 4, 0, 0), f3, d4), "open open_by_handle_at ret=fd f flags=0 mode=0"},
		{withPath(sc(257, OpOpen, -2, cwdArg, 0, 0, 0), "gone"), "open openat ret=-2 gone flags=0 mode=0"},
		// data
		{withFI(sc(0, OpRead, 4, 3, 0, 4), f3), "read read ret=4 f off=6 len=4"},
		{withFI(sc(17, OpRead, 4, 3, 0, 4, 100), f3), "read pread64 ret=4 f off=100 len=4"},
		{withFI(sc(19, OpRead, 4, 3, 0, 2), f3), "read readv ret=4 f off=6 len=4"},
		{withFI(sc(295, OpRead, 4, 3, 0, 2, 7), f3), "read preadv ret=4 f off=7 len=4"},
		{withFI(sc(327, OpRead, 4, 3, 0, 2, 7), f3), "read preadv2 ret=4 f off=7 len=4"},
		{withFI(sc(1, OpWrite, 2, 3, 0, 2), f3), "write write ret=2 f off=8 len=2"},
		{withFI(sc(18, OpWrite, 2, 3, 0, 2, 5), f3), "write pwrite64 ret=2 f off=5 len=2"},
		{withFI(sc(20, OpWrite, 2, 3, 0, 1), f3), "write writev ret=2 f off=8 len=2"},
		{withFI(sc(296, OpWrite, 2, 3, 0, 1, 9), f3), "write pwritev ret=2 f off=9 len=2"},
		{withFI(sc(328, OpWrite, 2, 3, 0, 1, ^uint64(0)), f3), "write pwritev2 ret=2 f off=8 len=2"},
		{withFI(sc(9, OpMmap, 0x7000, 0, 4096, 1, 2, 3, 0), f3), "mmap mmap ret=addr f off=0 len=4096 prot=1 flags=0x2"},
		// copies: the updated loff_t is in aux
		{func() rawEvent {
			e := withFI(sc(326, OpCopy, 3, 3, 1, 5, 1, 3, 0), f3, reg(5, 51, 0))
			e.Flags |= fAux0 | fAux1
			e.Aux = [2]uint64{13, 3}
			return e
		}(), "copy copy_file_range ret=3 f -> a off=10 off2=0 len=3"},
		{withFI(sc(40, OpCopy, 3, 5, 3, 0, 3), f3, reg(5, 51, 3)), "copy sendfile ret=3 f -> a off=7 off2=0 len=3"},
		{withFI(sc(275, OpCopy, 3, 3, 0, 9, 0, 3, 0), f3), "copy splice ret=3 f off=7 off2=0 len=3"},
		// paths
		{withPath(sc(76, OpTruncate, 0, 0, 7), "a"), "truncate truncate ret=0 a len=7"},
		{withFI(sc(77, OpTruncate, 0, 3, 7), f3), "truncate ftruncate ret=0 f len=7"},
		{withFI(sc(285, OpFallocate, 0, 3, 1, 8, 16), f3), "fallocate fallocate ret=0 f mode=1 off=8 len=16"},
		{withPath(sc(87, OpUnlink, 0, 0), "a"), "unlink unlink ret=0 a"},
		{withFI(withPath(sc(263, OpUnlink, 0, at4, 0, 0), "a"), d4), "unlink unlinkat ret=0 d/a"},
		{withFI(withPath(sc(263, OpUnlink, 0, at4, 0, atRemoveDir), "e"), d4), "rmdir unlinkat ret=0 d/e flags=0x200"},
		{withPath(sc(84, OpRmdir, 0, 0), "e"), "rmdir rmdir ret=0 e"},
		{withPath(sc(82, OpRename, 0, 0, 0), "a", "/tmp/b"), "rename rename ret=0 a -> !/tmp/b"},
		{withFI(withPath(sc(264, OpRename, 0, at4, 0, cwdArg, 0), "a", "b"), d4), "rename renameat ret=0 d/a -> b"},
		{withFI(withPath(sc(316, OpRename, 0, cwdArg, 0, at4, 0, 2), "a", "b"), d4), "rename renameat2 ret=0 a -> d/b flags=0x2"},
		{withPath(sc(86, OpLink, 0, 0, 0), "a", "b"), "link link ret=0 a -> b"},
		{withFI(sc(265, OpLink, 0, 3, 0, at4, 0, atEmptyPath), f3, d4), "link linkat ret=0 f -> d flags=0x1000"},
		{withPath(sc(88, OpSymlink, 0, 0, 0), "/etc/passwd", "l"), "symlink symlink ret=0 l linkto=/etc/passwd"},
		{withFI(withPath(sc(266, OpSymlink, 0, 0, at4, 0), "x", "l"), d4), "symlink symlinkat ret=0 d/l linkto=x"},
		{withPath(sc(83, OpMkdir, 0, 0, 0o700), "e"), "mkdir mkdir ret=0 e mode=0700"},
		{withFI(withPath(sc(258, OpMkdir, 0, at4, 0, 0o755), "e"), d4), "mkdir mkdirat ret=0 d/e mode=0755"},
		{withPath(sc(133, OpMknod, 0, 0, 0o10600, 0), "p"), "mknod mknod ret=0 p mode=010600"},
		{withFI(withPath(sc(259, OpMknod, 0, at4, 0, 0o10600, 0), "p"), d4), "mknod mknodat ret=0 d/p mode=010600"},
		{withPath(sc(90, OpChmod, 0, 0, 0o600), "a"), "chmod chmod ret=0 a mode=0600"},
		{withFI(sc(91, OpChmod, 0, 3, 0o640), f3), "chmod fchmod ret=0 f mode=0640"},
		{withFI(withPath(sc(268, OpChmod, 0, at4, 0, 0o644), "a"), d4), "chmod fchmodat ret=0 d/a mode=0644"},
		{withFI(withPath(sc(452, OpChmod, 0, at4, 0, 0o644, 0x100), "a"), d4), "chmod fchmodat2 ret=0 d/a mode=0644"},
		{withPath(sc(92, OpChown, 0, 0, 1000, ^uint64(0)), "a"), "chown chown ret=0 a uid=1000 gid=-1"},
		{withPath(sc(94, OpChown, 0, 0, 1, 2), "a"), "chown lchown ret=0 a uid=1 gid=2"},
		{withFI(sc(93, OpChown, 0, 3, 1, 2), f3), "chown fchown ret=0 f uid=1 gid=2"},
		{withFI(withPath(sc(260, OpChown, 0, at4, 0, 1, 2, 0x100), "a"), d4), "chown fchownat ret=0 d/a uid=1 gid=2"},
		{withPath(sc(188, OpSetxattr, 0, 0, 0, 0, 1, 1), "a", "user.k"), "setxattr setxattr ret=0 a name=user.k"},
		{withPath(sc(189, OpSetxattr, 0, 0, 0, 0, 1, 2), "a", "user.k"), "setxattr lsetxattr ret=0 a name=user.k"},
		{withFI(withPath(sc(190, OpSetxattr, 0, 3, 0, 0, 1, 0), "", "user.k"), f3), "setxattr fsetxattr ret=0 f name=user.k"},
		{withFI(withPath(sc(463, OpSetxattr, 0, at4, 0, 0, 0, 0, 0), "a", "user.k"), d4), "setxattr setxattrat ret=0 d/a name=user.k"},
		{withPath(sc(197, OpRemovexattr, 0, 0, 0), "a", "user.k"), "removexattr removexattr ret=0 a name=user.k"},
		{withPath(sc(198, OpRemovexattr, 0, 0, 0), "a", "user.k"), "removexattr lremovexattr ret=0 a name=user.k"},
		{withFI(withPath(sc(199, OpRemovexattr, 0, 3, 0), "", "user.k"), f3), "removexattr fremovexattr ret=0 f name=user.k"},
		{withFI(withPath(sc(466, OpRemovexattr, 0, at4, 0, 0, 0), "a", "user.k"), d4), "removexattr removexattrat ret=0 d/a name=user.k"},
		// bookkeeping
		{withFI(sc(3, OpClose, 0, 3), f3), "close close ret=0 f"},
		{withFI(sc(32, OpDup, 7, 3), reg(7, 50, 10)), "dup dup ret=fd f"},
		{withFI(sc(33, OpDup, 7, 3, 7), reg(7, 50, 10)), "dup dup2 ret=fd f"},
		{withFI(sc(292, OpDup, 7, 3, 7, 0), reg(7, 50, 10)), "dup dup3 ret=fd f"},
		{withFI(sc(72, OpDup, 7, 3, 0, 5), reg(7, 50, 10)), "dup fcntl ret=fd f"},
		// a pipe or socket onto stdio (a subprocess's child, gone by the
		// time /proc would be asked): no path, not malformed
		{withFI(sc(33, OpDup, 1, 8, 1), fdInfo{FD: 1, Ino: 70, Dev: 13, Mode: 0o010600, Valid: true}), "dup dup2 ret=fd"},
		{withFI(sc(72, OpDup, 10, 9, 0, 10), fdInfo{FD: 10, Ino: 71, Dev: 8, Mode: 0o140777, Valid: true}), "dup fcntl ret=fd"},
		{withFI(sc(292, OpDup, 7, 9, 7, 0), fdInfo{FD: 7, Ino: 72, Dev: 14, Mode: 0o600, Valid: true}), "dup dup3 ret=fd"},
		// unknown to /proc (gone), but the kernel says it is on another
		// filesystem (/dev/null inherited from an untraced parent): no
		// path, not malformed; on M's filesystem it stays malformed
		{withFI(sc(33, OpDup, 0, 35, 0), fdInfo{FD: 0, Ino: 4, Dev: 5, Mode: 0o020666, Valid: true}), "dup dup2 ret=fd"},
		{withFI(sc(33, OpDup, 0, 35, 0), reg(0, 80, 0)), "dup dup2 ret=fd MALFORMED: dup2: descriptor 35 unknown: no such file or directory"},
		{withFI(sc(91, OpChmod, 0, 35, 0o600), fdInfo{FD: 35, Ino: 4, Dev: 5, Mode: 0o020666, Valid: true}), "chmod fchmod ret=0 mode=0600"},
		{withFI(sc(91, OpChmod, 0, 35, 0o600), reg(35, 80, 0)), "chmod fchmod ret=0 mode=0600 MALFORMED: fchmod: descriptor 35 unknown: no such file or directory"},
		// not described by the kernel and unknown to /proc: malformed
		{sc(33, OpDup, 1, 8, 1), "dup dup2 ret=fd MALFORMED: dup2: descriptor 8 unknown: no such file or directory"},
		{withPath(sc(80, OpChdir, 0, 0), "d"), "chdir chdir ret=0 d"},
		{withFI(sc(81, OpChdir, 0, 4), d4), "chdir fchdir ret=0 d"},
	} {
		p := &fakeProc{fds: map[[2]int]string{{100, 3}: "/m/f", {100, 4}: "/m/d", {100, 5}: "/m/a"}, cwds: map[int]string{100: "/m"}}
		r := newTestResolver(p, nil)
		rec := r.resolve(&tc.e)
		if got := recLine(&rec); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", syscallNames[tc.e.Nr], got, tc.want)
		}
		delete(covered, syscallNames[tc.e.Nr])
	}
	if len(covered) > 0 {
		t.Errorf("syscalls without a case: %v", covered)
	}
}

var covered = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range syscallNames {
		m[n] = true
	}
	return m
}()

// TestResolveOpsState checks what the bookkeeping operations leave in the
// process's state: descriptors opened, duplicated and closed, the cwd
// moved.
func TestResolveOpsState(t *testing.T) {
	p := &fakeProc{cwds: map[int]string{100: "/m"}}
	r := newTestResolver(p, nil)
	steps := []rawEvent{
		withFI(withPath(sc(257, OpOpen, 3, cwdArg, 0, 0, 0), "d/f"), reg(3, 50, 0)),
		withFI(sc(292, OpDup, 9, 3, 9, 0), reg(9, 50, 0)),
		withFI(sc(3, OpClose, 0, 3), reg(3, 50, 0)),
		withPath(sc(80, OpChdir, 0, 0), "d"),
		withPath(sc(80, OpChdir, -2, 0), "nowhere"),
	}
	for i := range steps {
		r.resolve(&steps[i])
	}
	st := r.procs[100]
	want := map[int]fdEntry{9: {path: "/m/d/f", dev: tDev, ino: 50, known: true}}
	if d := cmp.Diff(want, st.fds, cmp.AllowUnexported(fdEntry{})); d != "" {
		t.Errorf("descriptors (-want +got):\n%s", d)
	}
	if st.cwd != "/m/d" {
		t.Errorf("cwd %q, want /m/d (a failed chdir moves nothing)", st.cwd)
	}
}
