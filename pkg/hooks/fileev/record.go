package fileev

import (
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// RecordKind says what a Record reports.
type RecordKind uint8

const (
	KindSyscall RecordKind = iota + 1 // a traced syscall returned
	KindFork                          // a traced process forked (Child)
	KindExit                          // the last thread of a traced process exited
	KindLoss                          // records were lost: Lost is the new total; re-scan
)

func (k RecordKind) String() string {
	switch k {
	case KindSyscall:
		return "syscall"
	case KindFork:
		return "fork"
	case KindExit:
		return "exit"
	case KindLoss:
		return "loss"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one traced operation, resolved: paths are relative to the
// merged view M when InRoot is set, and absolute paths in the traced
// process's view otherwise. Which fields are meaningful depends on Op;
// docs/file-events.md has the table.
type Record struct {
	Kind    RecordKind
	Time    time.Time
	PID     int    // thread group id (host pid namespace)
	TID     int    // thread id
	Target  int    // id of the Target that matched (Tracer.Trace's result)
	Op      Op     // operation class
	Syscall string // the syscall, e.g. "openat2"
	Ret     int64  // return value; negative: -errno, the operation had no effect

	FD      int    // the descriptor operated on; open and dup: the new descriptor
	Flags   uint64 // open flags, at-flags, rename/link flags, mmap flags, fallocate mode, xattr flags
	Mode    uint32 // mode argument (open, creat, mkdir, mknod, chmod); mmap: prot
	Offset  int64  // read/write/mmap/copy source: first byte; fallocate: offset
	Length  int64  // read/write/copy: bytes moved; truncate: new size; fallocate, mmap: length
	Offset2 int64  // copy: first byte written in the destination
	UID     int64  // chown (-1: unchanged)
	GID     int64  // chown (-1: unchanged)
	Name    string // xattr name; symlink: the link's contents (where it points)

	Path    string // the object: rename/link/copy source, symlink's new link
	InRoot  bool   // Path is inside M
	Path2   string // rename/link/copy destination
	InRoot2 bool   // Path2 is inside M
	Dev     uint64 // device (userspace dev_t) and inode of the file operated on, when the kernel said
	Ino     uint64

	// Content is what a read (or mmap, or copy) returned or a write
	// stored, read back from M, at most Config.MaxContent bytes.
	Content          string
	ContentTruncated bool   // the operation moved more than MaxContent bytes
	ContentErr       string // why Content could not be read (file gone, replaced)

	// Malformed says why a successful operation could not be resolved
	// (a path cut at 512 bytes, an unknown descriptor, an unreadable
	// argument). Such a record yields no decide.Event and asks for a
	// re-scan.
	Malformed string

	Child int    // KindFork: the child's pid
	Lost  uint64 // KindLoss: total records lost so far
}

func (r *Record) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s pid=%d", r.Kind, r.PID)
	switch r.Kind {
	case KindFork:
		fmt.Fprintf(&b, " child=%d", r.Child)
		return b.String()
	case KindLoss:
		fmt.Fprintf(&b, " lost=%d", r.Lost)
		return b.String()
	case KindExit:
		return b.String()
	}
	fmt.Fprintf(&b, " %s/%s ret=%d", r.Op, r.Syscall, r.Ret)
	if r.Path != "" {
		fmt.Fprintf(&b, " path=%q", r.Path)
		if !r.InRoot {
			b.WriteString("(outside)")
		}
	}
	if r.Path2 != "" {
		fmt.Fprintf(&b, " path2=%q", r.Path2)
		if !r.InRoot2 {
			b.WriteString("(outside)")
		}
	}
	if r.Malformed != "" {
		fmt.Fprintf(&b, " malformed=%q", r.Malformed)
	}
	return b.String()
}

// procFS is what the resolver asks /proc when its own state does not
// know a descriptor or a working directory.
type procFS interface {
	FDPath(pid, fd int) (string, error)
	Cwd(pid int) (string, error)
	NSPids(pid int) ([]int, error)
	// Root is the device (userspace encoding) and inode of pid's root
	// directory (/proc/PID/root).
	Root(pid int) (dev, ino uint64, err error)
}

type fdEntry struct {
	path  string
	dev   uint32 // kernel encoding
	ino   uint64
	known bool // dev and ino are set
}

type procState struct {
	fds    map[int]fdEntry
	cwd    string
	nspids []int
	// rootIsM: the process's root directory is M (it pivoted or
	// chrooted into it). Only ever set: a process cannot leave such a
	// root, and its children inherit it.
	rootIsM bool
	// rootSeen: /proc answered for the process's root at least once
	// (used when it has exited since: its root was not M when last seen).
	rootSeen bool
}

// resolver turns raw records into Records: it keeps, per traced process,
// the path of every descriptor it saw opened and the working directory,
// and falls back to /proc for what it did not see.
type resolver struct {
	root    string // M on the host
	rootDev uint32 // M's device, kernel encoding; 0: no device check
	rootIno uint64 // M's inode: a descriptor for it is ".", whatever its path says
	// view says where M appears in the view of target id's processes
	// ("" or false: at M itself).
	view  func(id uint32) (string, bool)
	procs map[int]*procState
	proc  procFS
	boot  func(ts uint64) time.Time

	cur uint32 // target of the record being resolved
}

func newResolver(root string, rootDev uint32, rootIno uint64, proc procFS, view func(uint32) (string, bool),
	boot func(uint64) time.Time) *resolver {
	return &resolver{root: root, rootDev: rootDev, rootIno: rootIno, view: view,
		procs: map[int]*procState{}, proc: proc, boot: boot}
}

// devCheck corrects where a descriptor the kernel described lies: on
// another filesystem than M it is outside whatever its path says (a
// symlink or a mount crossed, memfd, procfs); M's own root directory is
// "." (a process that opened M before pivoting into it).
func (r *resolver) devCheck(fi fdInfo, p string, rel *string, in *bool) {
	if r.rootDev == 0 {
		return
	}
	switch {
	case fi.Dev != r.rootDev:
		*rel, *in = p, false
	case fi.Ino == r.rootIno:
		*rel, *in = ".", true
	}
}

func (r *resolver) state(pid int) *procState {
	st := r.procs[pid]
	if st == nil {
		st = &procState{fds: map[int]fdEntry{}}
		r.procs[pid] = st
	}
	return st
}

// viewRoot is where M appears in the view of target id.
func (r *resolver) viewRoot(target uint32) string {
	view, ok := r.view(target)
	if !ok || view == "" {
		return r.root
	}
	return view
}

// isRoot reports whether the kernel described M's root directory.
func (r *resolver) isRoot(fi fdInfo) bool {
	return r.rootDev != 0 && fi.Dev == r.rootDev && fi.Ino == r.rootIno
}

// viewOf is where M appears to process pid of target id. A target whose
// view is "/" runs with M as its root directory (virtiofsd's sandbox
// child pivots into it), but not all of its processes do, nor from their
// first syscall: virtiofsd's parent never pivots, and its own
// mkdir("/var/run/virtiofsd") names the host's /var/run, not M's. So for
// such a target the process's root directory is checked (device and
// inode of /proc/PID/root against M's): a process whose root is not M
// sees the host's tree, where M is at its host path. A host path outside
// M never becomes a path in M.
func (r *resolver) viewOf(target uint32, pid int) (string, error) {
	view := r.viewRoot(target)
	if view != "/" || r.rootDev == 0 || view == r.root {
		return view, nil
	}
	st := r.state(pid)
	if st.rootIsM {
		return view, nil
	}
	dev, ino, err := r.proc.Root(pid)
	if err != nil {
		if st.rootSeen {
			return r.root, nil // it has exited; its root was not M when last seen
		}
		return "", fmt.Errorf("root directory of process %d unknown: %w", pid, err)
	}
	st.rootSeen = true
	if dev == kdev(r.rootDev) && ino == r.rootIno {
		st.rootIsM = true
		return view, nil
	}
	return r.root, nil
}

// inside maps a path in process pid's view (see viewOf) to a path
// relative to M.
func (r *resolver) inside(target uint32, pid int, p string) (string, bool, error) {
	view, err := r.viewOf(target, pid)
	if err != nil {
		return p, false, err
	}
	rel, in := underView(view, p)
	return rel, in, nil
}

// underView maps path p to a path relative to view when it is under it.
func underView(view, p string) (string, bool) {
	if p == view {
		return ".", true
	}
	if view == "/" {
		if strings.HasPrefix(p, "/") {
			return p[1:], true
		}
		return p, false
	}
	if strings.HasPrefix(p, view+"/") {
		return p[len(view)+1:], true
	}
	return p, false
}

func (r *resolver) cwd(pid int) (string, error) {
	st := r.state(pid)
	if st.cwd != "" {
		return st.cwd, nil
	}
	c, err := r.proc.Cwd(pid)
	if err != nil {
		return "", fmt.Errorf("working directory unknown: %w", err)
	}
	st.cwd = c
	return c, nil
}

// fdPath is the path of descriptor fd of pid. fi, when valid, is what the
// kernel said about that descriptor in this very syscall: a cached entry
// for another inode is stale and replaced from /proc.
func (r *resolver) fdPath(pid, fd int, fi fdInfo, haveFI bool) (string, error) {
	st := r.state(pid)
	if ent, ok := st.fds[fd]; ok {
		if !haveFI || !ent.known || (ent.ino == fi.Ino && ent.dev == fi.Dev) {
			return ent.path, nil
		}
	}
	p, err := r.proc.FDPath(pid, fd)
	if err != nil {
		return "", fmt.Errorf("descriptor %d unknown: %w", fd, err)
	}
	p = strings.TrimSuffix(p, " (deleted)")
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("descriptor %d is not a path (%s)", fd, p)
	}
	ent := fdEntry{path: p}
	if haveFI {
		ent.dev, ent.ino, ent.known = fi.Dev, fi.Ino, true
		if r.isRoot(fi) {
			ent.path = r.viewRoot(r.cur)
		}
	}
	st.fds[fd] = ent
	return ent.path, nil
}

// procRootIno is the inode number of procfs's root directory
// (PROC_ROOT_INO).
const procRootIno = 1

// procAlias recognises /proc/<self|thread-self|pid>/[task/<tid>/]fd/<n>,
// the way virtiofsd reopens its O_PATH descriptors, and returns n when it
// names one of pid's own descriptors.
func (r *resolver) procAlias(pid int, p string) (int, bool) {
	rest, ok := strings.CutPrefix(p, "/proc/")
	if !ok {
		return 0, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) == 5 && parts[1] == "task" {
		parts = []string{parts[0], parts[3], parts[4]}
	}
	if len(parts) != 3 || parts[1] != "fd" {
		return 0, false
	}
	fd, err := strconv.Atoi(parts[2])
	if err != nil || fd < 0 {
		return 0, false
	}
	switch parts[0] {
	case "self", "thread-self":
		return fd, true
	}
	who, err := strconv.Atoi(parts[0])
	if err != nil {
		return 0, false
	}
	if who == pid {
		return fd, true
	}
	st := r.state(pid)
	if st.nspids == nil {
		st.nspids, _ = r.proc.NSPids(pid)
		if st.nspids == nil {
			st.nspids = []int{}
		}
	}
	for _, n := range st.nspids {
		if n == who {
			return fd, true
		}
	}
	return 0, false
}

// pathAt resolves the path argument p (present: the pointer was not
// NULL) relative to dirfd, as the *at syscalls do.
func (r *resolver) pathAt(e *rawEvent, dirfd int64, p string, present bool, flags uint64) (string, error) {
	pid := int(e.Tgid)
	var base string
	var err error
	if !present || p == "" {
		if present && flags&atEmptyPath == 0 {
			return "", fmt.Errorf("empty path")
		}
		if dirfd == atFDCWD {
			return r.cwd(pid)
		}
		fi, ok := e.fi(dirfd)
		return r.fdPath(pid, int(dirfd), fi, ok)
	}
	if strings.HasPrefix(p, "/") {
		base = "/"
	} else if dirfd == atFDCWD {
		if base, err = r.cwd(pid); err != nil {
			return "", err
		}
	} else {
		fi, ok := e.fi(dirfd)
		if base, err = r.fdPath(pid, int(dirfd), fi, ok); err != nil {
			return "", err
		}
	}
	full := path.Join(base, p)
	if fd, ok := r.procAlias(pid, full); ok {
		fi, haveFI := e.fi(int64(fd))
		return r.fdPath(pid, fd, fi, haveFI)
	}
	return full, nil
}

// kdev converts a kernel dev_t (major<<20 | minor) to the userspace
// encoding stat uses.
func kdev(d uint32) uint64 {
	major, minor := uint64(d>>20), uint64(d&0xfffff)
	return (minor & 0xff) | (major&0xfff)<<8 | (minor&^0xff)<<12 | (major&^0xfff)<<32
}

// resolve turns a raw syscall, fork or exit record into a Record and
// updates the per-process state.
func (r *resolver) resolve(e *rawEvent) Record {
	rec := Record{Time: r.boot(e.TS), PID: int(e.Tgid), TID: int(e.Tid), Target: int(e.Target),
		FD: -1, UID: -1, GID: -1}
	r.cur = e.Target
	switch e.Kind {
	case kFork:
		rec.Kind = KindFork
		rec.Child = int(e.Args[0])
		parent := r.state(rec.PID)
		child := &procState{fds: make(map[int]fdEntry, len(parent.fds)), cwd: parent.cwd, rootIsM: parent.rootIsM}
		for k, v := range parent.fds {
			child.fds[k] = v
		}
		r.procs[rec.Child] = child
		return rec
	case kExit:
		rec.Kind = KindExit
		delete(r.procs, rec.PID)
		return rec
	}
	rec.Kind = KindSyscall
	rec.Op = e.Op
	rec.Syscall = syscallNames[e.Nr]
	rec.Ret = e.Ret
	var err error
	fail := func(what string, e2 error) {
		if err == nil && e2 != nil {
			err = fmt.Errorf("%s: %w", what, e2)
		}
	}
	// checkPaths flags arguments the kernel could not give us whole.
	for i := range 2 {
		switch {
		case e.Flags&(fP0Fault<<i) != 0:
			fail(fmt.Sprintf("path argument %d", i), fmt.Errorf("unreadable"))
		case e.Flags&(fP0Trunc<<i) != 0:
			fail(fmt.Sprintf("path argument %d", i), fmt.Errorf("longer than %d bytes", pathMax-1))
		}
	}
	a := e.Args
	pid := rec.PID
	setPath := func(slot int, p string, e2 error) {
		if e2 != nil {
			fail(rec.Syscall, e2)
			return
		}
		rel, in, e3 := r.inside(e.Target, pid, p)
		if e3 != nil {
			fail(rec.Syscall, e3)
			return
		}
		if slot == 0 {
			rec.Path, rec.InRoot = rel, in
		} else {
			rec.Path2, rec.InRoot2 = rel, in
		}
	}
	// fdObj resolves descriptor fd as the object of the operation and
	// applies the device check: a file on another filesystem than M is
	// outside, whatever its path says.
	fdObj := func(slot int, fd int64) {
		fi, ok := e.fi(fd)
		p, e2 := r.fdPath(pid, int(fd), fi, ok)
		setPath(slot, p, e2)
		if e2 == nil && ok {
			if slot == 0 {
				r.devCheck(fi, p, &rec.Path, &rec.InRoot)
			} else {
				r.devCheck(fi, p, &rec.Path2, &rec.InRoot2)
			}
		}
		if ok && slot == 0 {
			rec.Dev, rec.Ino = kdev(fi.Dev), fi.Ino
		}
	}
	at := func(slot int, dirfd int64, pi int, flags uint64) {
		if pi >= 0 {
			p, e2 := r.pathAt(e, dirfd, e.Path[pi], e.HasP[pi], flags)
			setPath(slot, p, e2)
		} else {
			p, e2 := r.pathAt(e, dirfd, "", false, flags)
			setPath(slot, p, e2)
		}
	}
	dataOffset := func(fd int64, explicit int64, hasExplicit bool) int64 {
		if hasExplicit {
			return explicit
		}
		if fi, ok := e.fi(fd); ok && e.Ret > 0 {
			return fi.Pos - e.Ret
		}
		return -1
	}
	sfd := func(v uint64) int64 { return int64(int32(uint32(v))) }

	switch e.Op {
	case OpOpen:
		var dirfd int64 = atFDCWD
		pi := 0
		switch rec.Syscall {
		case "open":
			rec.Flags, rec.Mode = a[1], uint32(a[2])
		case "creat":
			rec.Flags, rec.Mode = oCreat|oWronly|oTrunc, uint32(a[1])
		case "openat":
			dirfd, rec.Flags, rec.Mode = sfd(a[0]), a[2], uint32(a[3])
		case "openat2":
			dirfd = sfd(a[0])
			if e.Flags&fAux0 != 0 {
				rec.Flags, rec.Mode = e.Aux[0], uint32(e.Aux[1])
			} else if e.Ret >= 0 {
				fail("openat2", fmt.Errorf("open_how unreadable"))
			}
		case "open_by_handle_at":
			dirfd, rec.Flags, pi = sfd(a[0]), a[2], -1
		}
		if e.Ret >= 0 {
			rec.FD = int(e.Ret)
			fi, haveFI := e.fi(e.Ret)
			var p string
			var e2 error
			if pi >= 0 {
				p, e2 = r.pathAt(e, dirfd, e.Path[0], e.HasP[0], 0)
			}
			if pi < 0 || e2 != nil {
				// The process's own view of the new descriptor.
				delete(r.state(pid).fds, rec.FD)
				p, e2 = r.fdPath(pid, rec.FD, fi, haveFI)
			} else {
				if p == "/proc" && haveFI && fi.Ino != procRootIno && fi.Mode&sIFMT == sIFDIR {
					// Not procfs's root: virtiofsd's namespace sandbox
					// bind-mounts /proc/self/fd on /proc, then reopens
					// its O_PATH descriptor N as openat(that, "N").
					p = "/proc/self/fd"
				}
				ent := fdEntry{path: p}
				if haveFI {
					ent.dev, ent.ino, ent.known = fi.Dev, fi.Ino, true
					if r.isRoot(fi) {
						// M opened through another view of it (before
						// a pivot into it): remember it as M.
						p = r.viewRoot(e.Target)
						ent.path = p
					}
				}
				r.state(pid).fds[rec.FD] = ent
			}
			setPath(0, p, e2)
			if haveFI {
				rec.Dev, rec.Ino = kdev(fi.Dev), fi.Ino
				if e2 == nil {
					r.devCheck(fi, p, &rec.Path, &rec.InRoot)
				}
			}
		} else if pi >= 0 {
			p, e2 := r.pathAt(e, dirfd, e.Path[0], e.HasP[0], 0)
			setPath(0, p, e2)
		}
	case OpRead, OpWrite:
		fd := sfd(a[0])
		rec.FD = int(fd)
		fdObj(0, fd)
		rec.Length = max(e.Ret, 0)
		switch rec.Syscall {
		case "pread64", "pwrite64", "preadv", "pwritev":
			rec.Offset = int64(a[3])
		case "preadv2", "pwritev2":
			if a[3] == rwfOffsetNone {
				rec.Offset = dataOffset(fd, 0, false)
			} else {
				rec.Offset = int64(a[3])
			}
		default:
			rec.Offset = dataOffset(fd, 0, false)
		}
	case OpMmap:
		fd := sfd(a[4])
		rec.FD = int(fd)
		fdObj(0, fd)
		rec.Length, rec.Offset = int64(a[1]), int64(a[5])
		rec.Mode, rec.Flags = uint32(a[2]), a[3]
	case OpCopy:
		var in, out int64
		var inOff, outOff uint64
		var hasIn, hasOut bool
		switch rec.Syscall {
		case "sendfile":
			out, in = sfd(a[0]), sfd(a[1])
			inOff, hasIn = e.Aux[0], e.Flags&fAux0 != 0
		default: // splice, copy_file_range
			in, out = sfd(a[0]), sfd(a[2])
			inOff, hasIn = e.Aux[0], e.Flags&fAux0 != 0
			outOff, hasOut = e.Aux[1], e.Flags&fAux1 != 0
			rec.Flags = a[5]
		}
		rec.FD = int(in)
		rec.Length = max(e.Ret, 0)
		// The kernel advanced the offsets by what it moved.
		if fi, ok := e.fi(in); ok && fi.Mode&sIFMT == sIFREG {
			fdObj(0, in)
			rec.Offset = dataOffset(in, int64(inOff)-rec.Length, hasIn)
		}
		if fi, ok := e.fi(out); ok && fi.Mode&sIFMT == sIFREG {
			fdObj(1, out)
			rec.Offset2 = dataOffset(out, int64(outOff)-rec.Length, hasOut)
		}
	case OpTruncate:
		if rec.Syscall == "ftruncate" {
			rec.FD = int(sfd(a[0]))
			fdObj(0, sfd(a[0]))
		} else {
			at(0, atFDCWD, 0, 0)
		}
		rec.Length = int64(a[1])
	case OpFallocate:
		rec.FD = int(sfd(a[0]))
		fdObj(0, sfd(a[0]))
		rec.Flags, rec.Offset, rec.Length = a[1], int64(a[2]), int64(a[3])
	case OpUnlink:
		if rec.Syscall == "unlinkat" {
			rec.Flags = a[2]
			if rec.Flags&atRemoveDir != 0 {
				rec.Op = OpRmdir
			}
			at(0, sfd(a[0]), 0, 0)
		} else {
			at(0, atFDCWD, 0, 0)
		}
	case OpRmdir:
		at(0, atFDCWD, 0, 0)
	case OpRename:
		if rec.Syscall == "rename" {
			at(0, atFDCWD, 0, 0)
			at(1, atFDCWD, 1, 0)
		} else {
			at(0, sfd(a[0]), 0, 0)
			at(1, sfd(a[2]), 1, 0)
			if rec.Syscall == "renameat2" {
				rec.Flags = a[4]
			}
		}
	case OpLink:
		if rec.Syscall == "link" {
			at(0, atFDCWD, 0, 0)
			at(1, atFDCWD, 1, 0)
		} else {
			rec.Flags = a[4]
			at(0, sfd(a[0]), 0, rec.Flags)
			at(1, sfd(a[2]), 1, 0)
		}
	case OpSymlink:
		rec.Name = e.Path[0]
		if rec.Syscall == "symlink" {
			at(0, atFDCWD, 1, 0)
		} else {
			at(0, sfd(a[1]), 1, 0)
		}
	case OpMkdir, OpMknod:
		if rec.Syscall == "mkdir" || rec.Syscall == "mknod" {
			rec.Mode = uint32(a[1])
			at(0, atFDCWD, 0, 0)
		} else {
			rec.Mode = uint32(a[2])
			at(0, sfd(a[0]), 0, 0)
		}
	case OpChmod:
		switch rec.Syscall {
		case "chmod":
			rec.Mode = uint32(a[1])
			at(0, atFDCWD, 0, 0)
		case "fchmod":
			rec.Mode = uint32(a[1])
			rec.FD = int(sfd(a[0]))
			fdObj(0, sfd(a[0]))
		default: // fchmodat, fchmodat2
			rec.Mode = uint32(a[2])
			if rec.Syscall == "fchmodat2" {
				rec.Flags = a[3]
			}
			at(0, sfd(a[0]), 0, rec.Flags)
		}
	case OpChown:
		switch rec.Syscall {
		case "fchown":
			rec.FD = int(sfd(a[0]))
			fdObj(0, sfd(a[0]))
			rec.UID, rec.GID = int64(int32(a[1])), int64(int32(a[2]))
		case "fchownat":
			rec.Flags = a[4]
			rec.UID, rec.GID = int64(int32(a[2])), int64(int32(a[3]))
			at(0, sfd(a[0]), 0, rec.Flags)
		default: // chown, lchown
			rec.UID, rec.GID = int64(int32(a[1])), int64(int32(a[2]))
			at(0, atFDCWD, 0, 0)
		}
	case OpSetxattr, OpRemovexattr:
		rec.Name = e.Path[1]
		switch rec.Syscall {
		case "fsetxattr", "fremovexattr":
			rec.FD = int(sfd(a[0]))
			fdObj(0, sfd(a[0]))
		case "setxattrat", "removexattrat":
			rec.Flags = a[2]
			at(0, sfd(a[0]), 0, rec.Flags)
		default:
			at(0, atFDCWD, 0, 0)
		}
		if rec.Syscall == "setxattr" || rec.Syscall == "lsetxattr" || rec.Syscall == "fsetxattr" {
			rec.Flags = a[4]
		}
	case OpClose:
		fd := sfd(a[0])
		rec.FD = int(fd)
		fdObj(0, fd)
		delete(r.state(pid).fds, int(fd))
	case OpDup:
		old := sfd(a[0])
		if e.Ret >= 0 {
			rec.FD = int(e.Ret)
			// The new descriptor is the same open file as the old one.
			fi, ok := e.fi(e.Ret)
			p, e2 := r.fdPath(pid, int(old), fi, ok)
			if e2 == nil {
				ent := fdEntry{path: p}
				if ok {
					ent.dev, ent.ino, ent.known = fi.Dev, fi.Ino, true
				}
				r.state(pid).fds[rec.FD] = ent
			} else {
				delete(r.state(pid).fds, rec.FD)
			}
			setPath(0, p, e2)
		}
	case OpChdir:
		var p string
		var e2 error
		if rec.Syscall == "fchdir" {
			rec.FD = int(sfd(a[0]))
			fi, ok := e.fi(sfd(a[0]))
			p, e2 = r.fdPath(pid, rec.FD, fi, ok)
		} else {
			p, e2 = r.pathAt(e, atFDCWD, e.Path[0], e.HasP[0], 0)
		}
		setPath(0, p, e2)
		if fi, ok := e.fi(int64(rec.FD)); ok && rec.Syscall == "fchdir" && e2 == nil {
			r.devCheck(fi, p, &rec.Path, &rec.InRoot)
		}
		if e.Ret == 0 {
			if e2 == nil {
				r.state(pid).cwd = p
			} else {
				r.state(pid).cwd = "" // ask /proc next time
			}
		}
	}
	if err != nil && e.Ret >= 0 {
		rec.Malformed = err.Error()
	}
	return rec
}
