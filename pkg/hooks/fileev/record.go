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
	// stored, at most Config.MaxContent bytes: copied from the call's
	// buffer by the kernel at the syscall (ContentCaptured), or read
	// back from M afterwards.
	Content          string
	ContentTruncated bool   // the operation moved more than MaxContent bytes
	ContentErr       string // why Content could not be read back (file gone, replaced)
	ContentCaptured  bool   // Content was copied at the syscall: the real bytes, not a read-back

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

	// c is the record being resolved: kept here, not on the stack, so
	// that the handlers' table (an indirect call) does not make each
	// record's state escape to the heap.
	c resolving
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

// elsewhere reports whether the kernel described a file on another
// filesystem than M: outside M, whatever its path (see devCheck).
func (r *resolver) elsewhere(fi fdInfo) bool {
	return r.rootDev != 0 && fi.Dev != r.rootDev
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
	if len(p) > len(view) && p[len(view)] == '/' && strings.HasPrefix(p, view) {
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
	var full string
	switch {
	case strings.HasPrefix(p, "/"):
		full = path.Clean(p) // p itself when it is clean: no copy
	case dirfd == atFDCWD:
		if base, err = r.cwd(pid); err != nil {
			return "", err
		}
		full = path.Join(base, p)
	default:
		fi, ok := e.fi(dirfd)
		if base, err = r.fdPath(pid, int(dirfd), fi, ok); err != nil {
			return "", err
		}
		full = path.Join(base, p)
	}
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
// updates the per-process state (see resolveInto).
func (r *resolver) resolve(e *rawEvent) Record {
	var rec Record
	r.resolveInto(&rec, e)
	return rec
}

// resolveInto is resolve into *out, which it overwrites: Run reuses one
// Record for every record. Each operation class has its handler in
// opHandlers; what they share (the record's header, the path checks, the
// malformed verdict) is here.
func (r *resolver) resolveInto(out *Record, e *rawEvent) {
	*out = Record{Time: r.boot(e.TS), PID: int(e.Tgid), TID: int(e.Tid), Target: int(e.Target),
		FD: -1, UID: -1, GID: -1}
	rec := out
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
		return
	case kExit:
		rec.Kind = KindExit
		delete(r.procs, rec.PID)
		return
	}
	rec.Kind = KindSyscall
	rec.Op = e.Op
	rec.Syscall = syscallNames[e.Nr]
	rec.Ret = e.Ret
	r.c = resolving{r: r, e: e, rec: rec, pid: rec.PID}
	c := &r.c
	// Flag the path arguments the kernel could not give whole.
	for i := range 2 {
		switch {
		case e.Flags&(fP0Fault<<i) != 0:
			c.fail(fmt.Sprintf("path argument %d", i), fmt.Errorf("unreadable"))
		case e.Flags&(fP0Trunc<<i) != 0:
			c.fail(fmt.Sprintf("path argument %d", i), fmt.Errorf("longer than %d bytes", pathMax-1))
		}
	}
	if int(e.Op) < len(opHandlers) && opHandlers[e.Op] != nil {
		opHandlers[e.Op](c)
	}
	if c.err != nil && e.Ret >= 0 {
		rec.Malformed = c.err.Error()
	}
	r.c = resolving{} // hold no record or event between calls
}

// opHandlers resolve each operation class: they read the syscall's
// arguments into the Record, resolve its paths and update the process's
// descriptors and working directory.
var opHandlers = [opMax]func(c *resolving){
	OpOpen:        resolveOpen,
	OpRead:        resolveData,
	OpWrite:       resolveData,
	OpMmap:        resolveMmap,
	OpCopy:        resolveCopy,
	OpTruncate:    resolveTruncate,
	OpFallocate:   resolveFallocate,
	OpUnlink:      resolveUnlink,
	OpRmdir:       resolveRmdir,
	OpRename:      resolveRenameLink,
	OpLink:        resolveRenameLink,
	OpSymlink:     resolveSymlink,
	OpMkdir:       resolveMkdirMknod,
	OpMknod:       resolveMkdirMknod,
	OpChmod:       resolveChmod,
	OpChown:       resolveChown,
	OpSetxattr:    resolveXattr,
	OpRemovexattr: resolveXattr,
	OpClose:       resolveClose,
	OpDup:         resolveDup,
	OpChdir:       resolveChdir,
}

// resolving is one syscall record being resolved.
type resolving struct {
	r   *resolver
	e   *rawEvent
	rec *Record
	pid int
	err error // the first reason the record is malformed
}

// sfd is a descriptor argument (an int in a 64-bit register).
func sfd(v uint64) int64 { return int64(int32(uint32(v))) }

func (c *resolving) fail(what string, err error) {
	if c.err == nil && err != nil {
		c.err = fmt.Errorf("%s: %w", what, err)
	}
}

// setPath maps p (or its error) into path slot 0 (Path) or 1 (Path2).
func (c *resolving) setPath(slot int, p string, err error) {
	if err != nil {
		c.fail(c.rec.Syscall, err)
		return
	}
	rel, in, err := c.r.inside(c.e.Target, c.pid, p)
	if err != nil {
		c.fail(c.rec.Syscall, err)
		return
	}
	if slot == 0 {
		c.rec.Path, c.rec.InRoot = rel, in
	} else {
		c.rec.Path2, c.rec.InRoot2 = rel, in
	}
}

// fdObj resolves descriptor fd as the object of the operation and
// applies the device check: a file on another filesystem than M is
// outside, whatever its path says.
func (c *resolving) fdObj(slot int, fd int64) {
	fi, ok := c.e.fi(fd)
	p, err := c.r.fdPath(c.pid, int(fd), fi, ok)
	if err != nil && ok && c.r.elsewhere(fi) {
		// Never seen opened and gone from /proc, but the kernel said
		// it is on another filesystem: outside M, path unknown.
		p, err = "", nil
	}
	c.setPath(slot, p, err)
	if err == nil && ok {
		if slot == 0 {
			c.r.devCheck(fi, p, &c.rec.Path, &c.rec.InRoot)
		} else {
			c.r.devCheck(fi, p, &c.rec.Path2, &c.rec.InRoot2)
		}
	}
	if ok && slot == 0 {
		c.rec.Dev, c.rec.Ino = kdev(fi.Dev), fi.Ino
	}
}

// fdArg is fdObj for the descriptor in argument i, which is also the
// record's FD.
func (c *resolving) fdArg(i int) {
	fd := sfd(c.e.Args[i])
	c.rec.FD = int(fd)
	c.fdObj(0, fd)
}

// at resolves path argument pi (-1: none) relative to dirfd into slot.
func (c *resolving) at(slot int, dirfd int64, pi int, flags uint64) {
	var p string
	var err error
	if pi >= 0 {
		p, err = c.r.pathAtArg(c.e, dirfd, pi, flags)
	} else {
		p, err = c.r.pathAt(c.e, dirfd, "", false, flags)
	}
	c.setPath(slot, p, err)
}

// pathAtArg is pathAt for path argument pi.
func (r *resolver) pathAtArg(e *rawEvent, dirfd int64, pi int, flags uint64) (string, error) {
	return r.pathAt(e, dirfd, e.Path[pi], e.HasP[pi], flags)
}

// filePos is where a data operation on fd without an explicit offset
// started: the file position after it, less what it moved.
func (c *resolving) filePos(fd int64) int64 {
	if fi, ok := c.e.fi(fd); ok && c.e.Ret > 0 {
		return fi.Pos - c.e.Ret
	}
	return -1
}

// atArgs says where a syscall whose object is path argument 0 keeps its
// directory descriptor (an argument index; -1: AT_FDCWD) and, for the *at
// variants that take them, its at-flags (-1: none).
type atArgs struct{ dirfd, flags int }

// dirfdOf is the directory descriptor of a, AT_FDCWD when it has none.
func (c *resolving) dirfdOf(a atArgs) int64 {
	if a.dirfd < 0 {
		return atFDCWD
	}
	return sfd(c.e.Args[a.dirfd])
}

// atPath resolves path argument 0 relative to the directory a names
// into slot 0; its at-flags are also the record's Flags.
func (c *resolving) atPath(a atArgs) {
	var flags uint64
	if a.flags >= 0 {
		flags = c.e.Args[a.flags]
		c.rec.Flags = flags
	}
	c.at(0, c.dirfdOf(a), 0, flags)
}

// openArgs: where each open syscall keeps its directory descriptor, path,
// flags and mode (-1: absent). creat's flags are implied, openat2's are
// read from its struct open_how.
var openArgs = map[string]struct{ dirfd, path, flags, mode int }{
	"open":              {-1, 0, 1, 2},
	"creat":             {-1, 0, -1, 1},
	"openat":            {0, 1, 2, 3},
	"openat2":           {0, 1, -1, -1},
	"open_by_handle_at": {0, -1, 2, -1},
}

func resolveOpen(c *resolving) {
	e, rec, r := c.e, c.rec, c.r
	a, ok := openArgs[rec.Syscall]
	if !ok {
		return
	}
	dirfd := c.dirfdOf(atArgs{a.dirfd, -1})
	if a.flags >= 0 {
		rec.Flags = e.Args[a.flags]
	}
	if a.mode >= 0 {
		rec.Mode = uint32(e.Args[a.mode])
	}
	switch rec.Syscall {
	case "creat":
		rec.Flags = oCreat | oWronly | oTrunc
	case "openat2":
		if e.Flags&fAux0 != 0 {
			rec.Flags, rec.Mode = e.Aux[0], uint32(e.Aux[1])
		} else if e.Ret >= 0 {
			c.fail("openat2", fmt.Errorf("open_how unreadable"))
		}
	}
	if e.Ret < 0 {
		if a.path >= 0 {
			c.at(0, dirfd, 0, 0)
		}
		return
	}
	rec.FD = int(e.Ret)
	fi, haveFI := e.fi(e.Ret)
	var p string
	var err error
	if a.path >= 0 {
		p, err = r.pathAtArg(e, dirfd, 0, 0)
	}
	if a.path < 0 || err != nil {
		// The process's own view of the new descriptor.
		delete(r.state(c.pid).fds, rec.FD)
		p, err = r.fdPath(c.pid, rec.FD, fi, haveFI)
	} else {
		p = r.remember(c.pid, rec.FD, p, fi, haveFI, e.Target)
	}
	c.setPath(0, p, err)
	if haveFI {
		rec.Dev, rec.Ino = kdev(fi.Dev), fi.Ino
		if err == nil {
			r.devCheck(fi, p, &rec.Path, &rec.InRoot)
		}
	}
}

// remember records descriptor fd of pid, opened at path p, and returns
// the path it is known by.
func (r *resolver) remember(pid, fd int, p string, fi fdInfo, haveFI bool, target uint32) string {
	if p == "/proc" && haveFI && fi.Ino != procRootIno && fi.Mode&sIFMT == sIFDIR {
		// Not procfs's root: virtiofsd's namespace sandbox bind-mounts
		// /proc/self/fd on /proc, then reopens its O_PATH descriptor N
		// as openat(that, "N").
		p = "/proc/self/fd"
	}
	ent := fdEntry{path: p}
	if haveFI {
		ent.dev, ent.ino, ent.known = fi.Dev, fi.Ino, true
		if r.isRoot(fi) {
			// M opened through another view of it (before a pivot
			// into it): remember it as M.
			p = r.viewRoot(target)
			ent.path = p
		}
	}
	r.state(pid).fds[fd] = ent
	return p
}

func resolveData(c *resolving) {
	a := c.e.Args
	c.fdArg(0)
	c.rec.Length = max(c.e.Ret, 0)
	switch c.rec.Syscall {
	case "pread64", "pwrite64", "preadv", "pwritev":
		c.rec.Offset = int64(a[3])
	case "preadv2", "pwritev2":
		if a[3] == rwfOffsetNone {
			c.rec.Offset = c.filePos(sfd(a[0]))
		} else {
			c.rec.Offset = int64(a[3])
		}
	default:
		c.rec.Offset = c.filePos(sfd(a[0]))
	}
}

func resolveMmap(c *resolving) {
	a := c.e.Args
	c.fdArg(4)
	c.rec.Length, c.rec.Offset = int64(a[1]), int64(a[5])
	c.rec.Mode, c.rec.Flags = uint32(a[2]), a[3]
}

func resolveCopy(c *resolving) {
	e, rec, a := c.e, c.rec, c.e.Args
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
	off := func(fd int64, uoff uint64, has bool) int64 {
		if has {
			return int64(uoff) - rec.Length
		}
		return c.filePos(fd)
	}
	if fi, ok := e.fi(in); ok && fi.Mode&sIFMT == sIFREG {
		c.fdObj(0, in)
		rec.Offset = off(in, inOff, hasIn)
	}
	if fi, ok := e.fi(out); ok && fi.Mode&sIFMT == sIFREG {
		c.fdObj(1, out)
		rec.Offset2 = off(out, outOff, hasOut)
	}
}

func resolveTruncate(c *resolving) {
	if c.rec.Syscall == "ftruncate" {
		c.fdArg(0)
	} else {
		c.at(0, atFDCWD, 0, 0)
	}
	c.rec.Length = int64(c.e.Args[1])
}

func resolveFallocate(c *resolving) {
	a := c.e.Args
	c.fdArg(0)
	c.rec.Flags, c.rec.Offset, c.rec.Length = a[1], int64(a[2]), int64(a[3])
}

func resolveUnlink(c *resolving) {
	if c.rec.Syscall != "unlinkat" {
		c.at(0, atFDCWD, 0, 0)
		return
	}
	c.rec.Flags = c.e.Args[2]
	if c.rec.Flags&atRemoveDir != 0 {
		c.rec.Op = OpRmdir
	}
	c.at(0, sfd(c.e.Args[0]), 0, 0)
}

func resolveRmdir(c *resolving) { c.at(0, atFDCWD, 0, 0) }

// twoPathArgs: where rename and link keep their directory descriptors
// (-1: AT_FDCWD) and flags (-1: none); the paths are path arguments 0
// and 1. linkat's flags (AT_EMPTY_PATH) apply to its source.
var twoPathArgs = map[string]struct{ olddir, newdir, flags int }{
	"rename":    {-1, -1, -1},
	"renameat":  {0, 2, -1},
	"renameat2": {0, 2, 4},
	"link":      {-1, -1, -1},
	"linkat":    {0, 2, 4},
}

func resolveRenameLink(c *resolving) {
	a, ok := twoPathArgs[c.rec.Syscall]
	if !ok {
		return
	}
	var srcFlags uint64
	if a.flags >= 0 {
		c.rec.Flags = c.e.Args[a.flags]
		if c.rec.Op == OpLink {
			srcFlags = c.rec.Flags
		}
	}
	c.at(0, c.dirfdOf(atArgs{a.olddir, -1}), 0, srcFlags)
	c.at(1, c.dirfdOf(atArgs{a.newdir, -1}), 1, 0)
}

func resolveSymlink(c *resolving) {
	c.rec.Name = c.e.Path[0]
	if c.rec.Syscall == "symlink" {
		c.at(0, atFDCWD, 1, 0)
	} else {
		c.at(0, sfd(c.e.Args[1]), 1, 0)
	}
}

func resolveMkdirMknod(c *resolving) {
	a := c.e.Args
	if c.rec.Syscall == "mkdir" || c.rec.Syscall == "mknod" {
		c.rec.Mode = uint32(a[1])
		c.at(0, atFDCWD, 0, 0)
	} else {
		c.rec.Mode = uint32(a[2])
		c.at(0, sfd(a[0]), 0, 0)
	}
}

// chmodArgs: where each chmod keeps its descriptor or path (atArgs; fd
// ≥ 0: a descriptor operation) and its mode.
var chmodArgs = map[string]struct {
	fd   int
	at   atArgs
	mode int
}{
	"chmod":     {-1, atArgs{-1, -1}, 1},
	"fchmod":    {0, atArgs{}, 1},
	"fchmodat":  {-1, atArgs{0, -1}, 2},
	"fchmodat2": {-1, atArgs{0, 3}, 2},
}

func resolveChmod(c *resolving) {
	a, ok := chmodArgs[c.rec.Syscall]
	if !ok {
		return
	}
	c.rec.Mode = uint32(c.e.Args[a.mode])
	if a.fd >= 0 {
		c.fdArg(a.fd)
		return
	}
	c.atPath(a.at)
}

// chownArgs: where each chown keeps its descriptor or path and its uid
// (the gid follows it).
var chownArgs = map[string]struct {
	fd  int
	at  atArgs
	uid int
}{
	"chown":    {-1, atArgs{-1, -1}, 1},
	"lchown":   {-1, atArgs{-1, -1}, 1},
	"fchown":   {0, atArgs{}, 1},
	"fchownat": {-1, atArgs{0, 4}, 2},
}

func resolveChown(c *resolving) {
	a, ok := chownArgs[c.rec.Syscall]
	if !ok {
		return
	}
	if a.fd >= 0 {
		c.fdArg(a.fd)
	}
	c.rec.UID, c.rec.GID = int64(int32(c.e.Args[a.uid])), int64(int32(c.e.Args[a.uid+1]))
	if a.fd < 0 {
		c.atPath(a.at)
	}
}

// xattrArgs: where each xattr syscall keeps its descriptor or path, and
// its flags (setxattr's XATTR_CREATE/REPLACE; the *at variants'
// at-flags). The attribute's name is path argument 1.
var xattrArgs = map[string]struct {
	fd    int
	at    atArgs
	flags int
}{
	"setxattr":      {-1, atArgs{-1, -1}, 4},
	"lsetxattr":     {-1, atArgs{-1, -1}, 4},
	"fsetxattr":     {0, atArgs{}, 4},
	"setxattrat":    {-1, atArgs{0, 2}, -1},
	"removexattr":   {-1, atArgs{-1, -1}, -1},
	"lremovexattr":  {-1, atArgs{-1, -1}, -1},
	"fremovexattr":  {0, atArgs{}, -1},
	"removexattrat": {-1, atArgs{0, 2}, -1},
}

func resolveXattr(c *resolving) {
	c.rec.Name = c.e.Path[1]
	a, ok := xattrArgs[c.rec.Syscall]
	if !ok {
		return
	}
	if a.fd >= 0 {
		c.fdArg(a.fd)
	} else {
		c.atPath(a.at)
	}
	if a.flags >= 0 {
		c.rec.Flags = c.e.Args[a.flags]
	}
}

func resolveClose(c *resolving) {
	c.fdArg(0)
	delete(c.r.state(c.pid).fds, c.rec.FD)
}

func resolveDup(c *resolving) {
	e, rec, r := c.e, c.rec, c.r
	if e.Ret < 0 {
		return
	}
	rec.FD = int(e.Ret)
	// The new descriptor is the same open file as the old one.
	fi, ok := e.fi(e.Ret)
	if ok && !pathType(fi.Mode) {
		// A pipe, a socket or an anonymous inode (a shell or
		// subprocess wiring a child's stdio): nothing of M, and no path
		// to know it by. Its close is not traced either.
		delete(r.state(c.pid).fds, rec.FD)
		return
	}
	p, err := r.fdPath(c.pid, int(sfd(e.Args[0])), fi, ok)
	if err != nil && ok && r.elsewhere(fi) {
		// Inherited unseen from an untraced parent (a child wiring
		// /dev/null onto its stdio before exec) and gone from /proc:
		// outside M, path unknown.
		delete(r.state(c.pid).fds, rec.FD)
		return
	}
	if err == nil {
		ent := fdEntry{path: p}
		if ok {
			ent.dev, ent.ino, ent.known = fi.Dev, fi.Ino, true
		}
		r.state(c.pid).fds[rec.FD] = ent
	} else {
		delete(r.state(c.pid).fds, rec.FD)
	}
	c.setPath(0, p, err)
}

// pathType reports whether a descriptor of this mode can name something
// by path: a regular file, a directory, a symlink (O_PATH) or a device
// node. Pipes, sockets and anonymous inodes (type 0) cannot.
func pathType(mode uint32) bool {
	switch mode & sIFMT {
	case sIFREG, sIFDIR, sIFLNK, sIFCHR, sIFBLK:
		return true
	}
	return false
}

func resolveChdir(c *resolving) {
	e, rec, r := c.e, c.rec, c.r
	var p string
	var err error
	if rec.Syscall == "fchdir" {
		rec.FD = int(sfd(e.Args[0]))
		fi, ok := e.fi(sfd(e.Args[0]))
		p, err = r.fdPath(c.pid, rec.FD, fi, ok)
		c.setPath(0, p, err)
		if ok && err == nil {
			r.devCheck(fi, p, &rec.Path, &rec.InRoot)
		}
	} else {
		p, err = r.pathAtArg(e, atFDCWD, 0, 0)
		c.setPath(0, p, err)
	}
	if e.Ret == 0 {
		if err == nil {
			r.state(c.pid).cwd = p
		} else {
			r.state(c.pid).cwd = "" // ask /proc next time
		}
	}
}
