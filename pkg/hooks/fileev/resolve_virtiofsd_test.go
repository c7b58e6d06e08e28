package fileev

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestResolveVirtiofsdProcBind: QEMU's virtiofsd (sandbox=namespace)
// bind-mounts /proc/self/fd on /proc, opens "/proc" as its
// proc_self_fd, and reopens the O_PATH descriptor N of an inode with
// openat(proc_self_fd, "N") before reading it (lo_inode_open). The
// reopened descriptor is the inode's path, so the read of a sensitive
// file is seen as such; a real procfs root (inode 1) is not taken for a
// descriptor table.
func TestResolveVirtiofsdProcBind(t *testing.T) {
	const procDev = 1<<20 | 43
	dir := func(fd int32, ino uint64, dev uint32) fdInfo {
		return fdInfo{FD: fd, Ino: ino, Dev: dev, Mode: sIFDIR | 0o555, Valid: true}
	}
	for _, tc := range []struct {
		name     string
		procIno  uint64
		reopened fdInfo // what openat(proc_self_fd, "19") opened
		want     []string
	}{
		{"bind of /proc/self/fd", 454301, reg(20, 50, 0),
			[]string{"/proc/self/fd", "certs/service.pem", "certs/service.pem", "certs/service.pem"}},
		// On a real /proc, "19" is process 19's directory.
		{"procfs root", procRootIno, dir(20, 9999, procDev),
			[]string{"/proc", "certs/service.pem", "/proc/19"}},
	} {
		p := &fakeProc{cwds: map[int]string{100: "/"}, nspids: map[int][]int{100: {100, 1}}}
		r := newTestResolver(p, map[uint32]string{1: "/"})
		steps := []rawEvent{
			withFI(withPath(sc(257, OpOpen, 6, cwdArg, 0, 0o10000000, 0), "/proc"), dir(6, tc.procIno, procDev)),
			// lookup: O_PATH descriptor 19 for certs/service.pem
			withFI(withPath(sc(257, OpOpen, 19, cwdArg, 0, 0o10000000|0o400000, 0), "/certs/service.pem"), reg(19, 50, 0)),
			// lo_inode_open: openat(proc_self_fd, "19", O_RDONLY)
			withFI(withPath(sc(257, OpOpen, 20, 6, 0, 0, 0), "19"), dir(6, tc.procIno, procDev), tc.reopened),
			// the read into guest memory
			withFI(sc(295, OpRead, 15, 20, 0, 1, 0), reg(20, 50, 0)),
		}
		steps = steps[:len(tc.want)]
		var got []string
		for i := range steps {
			rec := r.resolve(&steps[i])
			if rec.Malformed != "" {
				t.Errorf("%s: step %d malformed: %s", tc.name, i, rec.Malformed)
			}
			got = append(got, rec.Path)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: paths (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestResolveHostPathNeverInView: a target whose view is "/" (virtiofsd
// with sandbox=namespace) also runs processes that have not pivoted into
// M: virtiofsd's parent creates /var/run/virtiofsd for its pid file on
// the host. That is a host path, not var/run/virtiofsd in the working
// directory. Only a process whose root directory is M sees M at "/"; it
// is asked of /proc once and remembered, and its children inherit it. A
// process that has exited keeps the answer last seen; one never seen is
// not guessed (a malformed record: a re-scan).
func TestResolveHostPathNeverInView(t *testing.T) {
	hostRoot := [2]uint64{8<<8 | 1, 2} // the host's / on another device
	p := &fakeProc{
		cwds:  map[int]string{100: "/", 101: "/", 200: "/"},
		roots: map[int][2]uint64{100: hostRoot, 200: {}}, // 101: M; 200: gone
	}
	r := newTestResolver(p, map[uint32]string{1: "/"})
	mkdir := func(pid uint32, path string) rawEvent {
		e := withPath(sc(83, OpMkdir, 0, 0, 0o755), path)
		e.Tgid, e.Tid = pid, pid
		return e
	}
	type res struct {
		Path      string
		InRoot    bool
		Malformed bool
		Events    int
	}
	var got []res
	step := func(e rawEvent) {
		rec := r.resolve(&e)
		if rec.Kind == KindSyscall {
			got = append(got, res{rec.Path, rec.InRoot, rec.Malformed != "", len(Events(&rec))})
		}
	}
	step(mkdir(100, "/var/run/virtiofsd"))  // the parent, on the host
	step(mkdir(100, tRoot+"/made-by-host")) // the parent, in M by its host path
	step(rawEvent{Kind: kFork, Tgid: 100, Tid: 100, Target: 1, Args: [6]uint64{101}})
	step(mkdir(101, "/var/run/virtiofsd")) // the sandbox child, after its pivot_root into M
	step(mkdir(101, "/var/run/virtiofsd"))
	step(mkdir(200, "/x"))     // root unknown: never guessed
	p.roots[100] = [2]uint64{} // the parent has exited: as last seen
	step(mkdir(100, "/var/run/virtiofsd"))
	want := []res{
		{"/var/run/virtiofsd", false, false, 0},
		{"made-by-host", true, false, 1},
		{"var/run/virtiofsd", true, false, 1},
		{"var/run/virtiofsd", true, false, 1},
		{"", false, true, 0},
		{"/var/run/virtiofsd", false, false, 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	// The child's root was asked once, then remembered.
	if diff := cmp.Diff([]string{"root 100", "root 100", "root 101", "root 200", "root 100"}, p.asked); diff != "" {
		t.Errorf("asked /proc (-want +got):\n%s", diff)
	}
}
