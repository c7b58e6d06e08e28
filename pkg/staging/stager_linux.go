package staging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/mountinfo"
	"github.com/carbd/carbd/pkg/decide"
)

// Stager is one session's write staging. Its methods are safe for
// concurrent use; they are serialized internally (Labels has its own
// lock, so label lookups never wait for a scan or a commit).
type Stager struct {
	l      *Layout
	labels *Labels
	owner  Owner

	mu       sync.Mutex
	closed   bool             // guarded by mu
	scope    *Scope           // guarded by mu: the open scope, if any
	stamps   map[string]stamp // guarded by mu
	recovery Recovery         // set by Open
	lockFd   int              // the flock'ed lock file
	pendFd   int              // guarded by mu: the pending-label log, opened for appending
	sfd      int              // state directory
	lfd      int              // layer directory
	wfd      int              // W's root
	ufd      int              // U's root
	bfd      int              // B's root

	runID     string                 // set by Open
	fresh     bool                   // set by Open: the base was built by this Open
	seen      map[string]wstamp      // guarded by mu: W's entries as the agent's view has them
	seenFd    int                    // guarded by mu: the seen log, opened for appending
	preserved map[string]keptVersion // guarded by mu: conflicting changes kept this run
}

// stamp remembers the upper and working entries of a path whose staged
// content equals W's, so later scans skip the content comparison. ctime
// cannot be set by the agent, so a stamp match proves nothing changed.
type stamp struct {
	uIno, uCtime, uSize uint64
	wIno, wCtime        uint64
}

// Recovery says what Open found in the journal.
type Recovery struct {
	Found  bool   // a journal was present
	Action string // "", "discarded", "rolled back" or "completed"
	Ops    int    // journaled operations
}

// faultHook, when set (tests only), is called at every journal step;
// the crash tests SIGKILL the process from it.
var faultHook func(point string)

func fault(point string) {
	if faultHook != nil {
		faultHook(point)
	}
}

// Open prepares a session's staging: it plans the layout, creates the
// state directory, takes its lock, recovers an interrupted commit, builds
// the frozen base B (a hard-link farm of W) if it is not there yet, and
// loads the committed labels. It does not mount; see Mount.
func Open(cfg Config) (*Stager, error) {
	l, err := Plan(cfg)
	if err != nil {
		return nil, err
	}
	return OpenLayout(l)
}

// OpenLayout is Open with a layout from Plan.
func OpenLayout(l *Layout) (_ *Stager, err error) {
	s := &Stager{l: l, lockFd: -1, pendFd: -1, sfd: -1, lfd: -1, wfd: -1, ufd: -1, bfd: -1, seenFd: -1,
		stamps: make(map[string]stamp), preserved: make(map[string]keptVersion), runID: newRunID()}
	defer func() {
		if err != nil {
			s.closeFds()
		}
	}()
	if s.wfd, err = openRoot(l.Work); err != nil {
		return nil, fmt.Errorf("staging: work dir: %w", err)
	}
	if err := os.MkdirAll(l.State, 0o700); err != nil {
		return nil, fmt.Errorf("staging: state dir: %w", err)
	}
	// Searchable, not readable: W's owner reaches conflicts/ (its own);
	// the index, the pending labels and the lock are 0600.
	if err := os.Chmod(l.State, 0o711); err != nil {
		return nil, fmt.Errorf("staging: state dir: %w", err)
	}
	if s.sfd, err = openRoot(l.State); err != nil {
		return nil, fmt.Errorf("staging: state dir: %w", err)
	}
	if err := os.MkdirAll(l.Layers, 0o700); err != nil {
		return nil, fmt.Errorf("staging: layer dir: %w", err)
	}
	if s.lfd, err = openRoot(l.Layers); err != nil {
		return nil, fmt.Errorf("staging: layer dir: %w", err)
	}
	if s.lockFd, err = unix.Open(l.Lock, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600); err != nil {
		return nil, fmt.Errorf("staging: lock %s: %w", l.Lock, err)
	}
	if err := unix.Flock(s.lockFd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, l.State)
		}
		return nil, fmt.Errorf("staging: lock %s: %w", l.Lock, err)
	}
	if err := sameMount(s.wfd, s.lfd); err != nil {
		return nil, fmt.Errorf("staging: layer dir %s and work dir %s: %w", l.Layers, l.Work, err)
	}
	var wst unix.Stat_t
	if err := unix.Fstat(s.wfd, &wst); err != nil {
		return nil, fmt.Errorf("staging: work dir: %w", err)
	}
	s.owner = Owner{UID: wst.Uid, GID: wst.Gid}
	if l.Owner != nil {
		s.owner = *l.Owner
	}
	recovered, err := s.recover()
	if err != nil {
		return nil, err
	}
	if err := s.ensureBase(wst.Mode & 0o7777); err != nil {
		return nil, err
	}
	if err := s.loadSeen(); err != nil {
		return nil, err
	}
	if err := s.endRecovery(recovered); err != nil {
		return nil, err
	}
	for _, d := range []string{l.OvlWork, l.Merged} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("staging: %w", err)
		}
	}
	if s.ufd, err = openRoot(l.Upper); err != nil {
		return nil, fmt.Errorf("staging: upper dir: %w", err)
	}
	if s.bfd, err = openRoot(l.Base); err != nil {
		return nil, fmt.Errorf("staging: base dir: %w", err)
	}
	idx, err := s.loadIndex()
	if err != nil {
		return nil, err
	}
	if s.fresh {
		if idx, err = s.resetCreated(idx); err != nil {
			return nil, err
		}
	}
	s.labels = newLabels(idx)
	data, err := os.ReadFile(l.Pending)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("staging: %w", err)
	}
	pend, err := decodePending(data, l.Pending)
	if err != nil {
		return nil, err
	}
	s.labels.pending = pend
	if err := s.compactPending(); err != nil {
		return nil, err
	}
	return s, nil
}

// compactPending rewrites the pending-label log from memory (atomically)
// and reopens it for appending.
func (s *Stager) compactPending() error {
	b := []byte(pendingMagic)
	for p, lb := range s.labels.pendingSnapshot() {
		b = appendPendingRecord(b, p, lb)
	}
	if s.pendFd >= 0 {
		unix.Close(s.pendFd)
		s.pendFd = -1
	}
	name := filepath.Base(s.l.Pending)
	if err := writeFileSync(s.sfd, name, b); err != nil {
		return fmt.Errorf("staging: pending labels: %w", err)
	}
	fd, err := openat2(s.sfd, name, unix.O_WRONLY|unix.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("staging: pending labels: %w", err)
	}
	s.pendFd = fd
	return nil
}

// stage records a pending label in memory and in the log (no fsync: a
// crash keeps it; a power loss may lose the last ones, and a staged path
// without a label must then be treated as unknown by the caller).
func (s *Stager) stage(path string, lb decide.Label) error {
	if err := checkRel(path); err != nil {
		return err
	}
	if _, err := fdWriter(s.pendFd).Write(appendPendingRecord(nil, path, lb)); err != nil {
		return fmt.Errorf("staging: pending labels: %w", err)
	}
	s.labels.stage(path, lb)
	return nil
}

// sameMount checks that two directories are on the same mount: hard
// links and renames between them must work.
func sameMount(a, b int) error {
	var sa, sb unix.Statx_t
	if err := unix.Statx(a, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &sa); err != nil {
		return fmt.Errorf("statx: %w", err)
	}
	if err := unix.Statx(b, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &sb); err != nil {
		return fmt.Errorf("statx: %w", err)
	}
	if sa.Dev_major != sb.Dev_major || sa.Dev_minor != sb.Dev_minor {
		return errors.New("are on different filesystems (the state dir must be on the work dir's filesystem)")
	}
	if sa.Mask&sb.Mask&unix.STATX_MNT_ID != 0 && sa.Mnt_id != sb.Mnt_id {
		return errors.New("are on different mounts of one filesystem (the state dir must be on the work dir's mount)")
	}
	return nil
}

// Layout returns the session's layout.
func (s *Stager) Layout() *Layout { return s.l }

// Labels returns the session's labels.
func (s *Stager) Labels() *Labels { return s.labels }

// Recovery returns what Open did with an interrupted commit.
func (s *Stager) Recovery() Recovery { return s.recovery }

// Close releases the state directory's lock. It neither unmounts M nor
// removes staged state: a later Open resumes the session.
func (s *Stager) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.closeFds()
	return nil
}

func (s *Stager) closeFds() {
	for _, fd := range []*int{&s.wfd, &s.ufd, &s.bfd, &s.sfd, &s.lfd, &s.pendFd, &s.seenFd, &s.lockFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

func (s *Stager) lock() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Scope is the open speculative scope (Kairos §III-B): the staged writes
// and labels that are resolved together. One scope is open at a time.
type Scope struct {
	s    *Stager
	done bool // guarded by s.mu
}

// Begin opens a scope. It fails with ErrScopeOpen while another is open.
func (s *Stager) Begin() (*Scope, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.scope != nil {
		return nil, ErrScopeOpen
	}
	s.scope = &Scope{s: s}
	return s.scope, nil
}

// Stage records the label of a write to path in the scope: the
// combination of everything the agent read before writing it. It becomes
// permanent when the scope commits and is discarded when it aborts.
func (sc *Scope) Stage(path string, lb decide.Label) error {
	if err := sc.check(); err != nil {
		return err
	}
	defer sc.s.mu.Unlock()
	return sc.s.stage(path, lb)
}

func (sc *Scope) check() error {
	if err := sc.s.lock(); err != nil {
		return err
	}
	if sc.done || sc.s.scope != sc {
		sc.s.mu.Unlock()
		return ErrNoScope
	}
	return nil
}

// Changes lists the scope's staged changes.
func (sc *Scope) Changes(ctx context.Context) ([]Change, error) {
	if err := sc.check(); err != nil {
		return nil, err
	}
	defer sc.s.mu.Unlock()
	return sc.s.changes(ctx)
}

// Commit applies every staged change to W with the scope's labels and
// closes the scope. Refused changes stay staged (and are reported);
// on error nothing of the scope is in W and the scope stays open.
func (sc *Scope) Commit(ctx context.Context) (*Result, error) {
	if err := sc.check(); err != nil {
		return nil, err
	}
	defer sc.s.mu.Unlock()
	res, err := sc.s.commit(ctx, nil)
	if err == nil {
		sc.done = true
		sc.s.scope = nil
	}
	return res, err
}

// Abort reverts every staged change through M, discards the scope's
// labels and closes the scope.
func (sc *Scope) Abort(ctx context.Context) (*Result, error) {
	if err := sc.check(); err != nil {
		return nil, err
	}
	defer sc.s.mu.Unlock()
	res, err := sc.s.abort(ctx, nil)
	if err == nil {
		sc.done = true
		sc.s.scope = nil
		if len(res.Refused) == 0 {
			// Everything the scope wrote is gone, so are its labels
			// (also those of writes that turned out to change nothing).
			sc.s.labels.clearPending()
			err = sc.s.compactPending()
		}
	}
	return res, err
}

// Stage records the label of a write released outside a scope; see
// Scope.Stage. It fails with ErrScopeOpen while a scope is open.
func (s *Stager) Stage(path string, lb decide.Label) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.scope != nil {
		return ErrScopeOpen
	}
	return s.stage(path, lb)
}

// Commit applies the given changes (from Scan; nil means every staged
// change) to W, with their pending labels, under the write-ahead
// journal. A change whose staged entry no longer has the scanned digest,
// or that is unsafe, is refused and reported; the others are applied all
// together or, on error, not at all. It fails with ErrScopeOpen while a
// scope is open: a scope commits through Scope.Commit.
func (s *Stager) Commit(ctx context.Context, changes []Change) (*Result, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.scope != nil {
		return nil, ErrScopeOpen
	}
	return s.commit(ctx, changes)
}

// Abort reverts the given changes (nil: all) through the merged view M,
// which must be mounted, and discards their pending labels. It fails
// with ErrScopeOpen while a scope is open.
func (s *Stager) Abort(ctx context.Context, changes []Change) (*Result, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.scope != nil {
		return nil, ErrScopeOpen
	}
	return s.abort(ctx, changes)
}

// Scan walks the upper layer and calls fn for every staged change, in
// walk order (a directory before what is below it). Memory stays bounded
// by the directory depth, whatever the number of staged entries.
func (s *Stager) Scan(ctx context.Context, fn func(Change) error) error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	return s.scan(ctx, fn)
}

// Changes returns every staged change.
func (s *Stager) Changes(ctx context.Context) ([]Change, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.changes(ctx)
}

func (s *Stager) changes(ctx context.Context) ([]Change, error) {
	var out []Change
	err := s.scan(ctx, func(c Change) error {
		out = append(out, c)
		return nil
	})
	return out, err
}

// Mount mounts the merged view M (lower B, upper U) with the layout's
// options. An overlay of this session already mounted at M (carbd
// restarted) is kept.
func (s *Stager) Mount() error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if ok, err := Mounted(s.l); err != nil || ok {
		return err
	}
	return Mount(s.l)
}

// Unmount unmounts M.
func (s *Stager) Unmount() error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	return Unmount(s.l)
}

// Mounted reports whether this layout's overlay is mounted at M: the
// mount table has an overlay at M whose upperdir is the layout's.
func Mounted(l *Layout) (bool, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return false, fmt.Errorf("staging: %w", err)
	}
	for _, m := range ms {
		if m.FSType != "overlay" || m.Point != l.Merged {
			continue
		}
		if up, ok := m.SuperOption("upperdir"); ok && up == l.Upper {
			return true, nil
		}
	}
	return false, nil
}

// ensureBase builds B, a hard-link farm of W as it is now, and the seen
// log of its stamps, unless the layers of a run that did not finish are
// there (base.done without finished): those are resumed, so that their
// staged changes are still decided. A finished run's layers are
// discarded first.
func (s *Stager) ensureBase(rootMode uint32) error {
	l := s.l
	_, finishedErr := os.Lstat(l.Finished)
	if finishedErr == nil {
		if err := s.discardLayers(); err != nil {
			return err
		}
	} else if _, err := os.Lstat(l.BaseDone); err == nil {
		if _, err := os.Lstat(l.Seen); err == nil {
			return nil
		}
		// Layers of a carbd from before the stamps. Nothing staged: a
		// fresh base. Staged changes: resumed, stamped from the base as
		// it is (a write in place into W before this Open is then not
		// told from the base; the docs say so).
		ents, err := os.ReadDir(l.Upper)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("staging: %w", err)
		}
		if len(ents) > 0 {
			return s.stampBase()
		}
		if err := s.discardLayers(); err != nil {
			return err
		}
	}
	s.fresh = true
	// No complete base: nothing can be staged yet, so a non-empty upper
	// layer means the state directory is not one this code made.
	if ents, err := os.ReadDir(l.Upper); err == nil && len(ents) > 0 {
		return fmt.Errorf("%w: %s has staged entries but %s is missing", ErrCorrupt, l.Upper, l.BaseDone)
	}
	if err := os.RemoveAll(l.Base); err != nil {
		return fmt.Errorf("staging: remove partial base: %w", err)
	}
	if err := os.RemoveAll(l.OvlWork); err != nil {
		return fmt.Errorf("staging: remove the overlay work dir: %w", err)
	}
	for _, d := range []string{l.Base, l.Upper} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("staging: %w", err)
		}
		// The overlay's root takes its attributes from the upper root.
		if err := os.Chmod(d, os.FileMode(rootMode&0o777)); err != nil {
			return fmt.Errorf("staging: %w", err)
		}
	}
	bfd, err := openRoot(l.Base)
	if err != nil {
		return fmt.Errorf("staging: base dir: %w", err)
	}
	defer unix.Close(bfd)
	seen := []byte(seenMagic)
	if err := linkFarm(s.wfd, bfd, "", func(rel string, st *unix.Stat_t) {
		seen = appendSeenSet(seen, rel, stampOf(st))
	}); err != nil {
		return fmt.Errorf("staging: build base from %s: %w", l.Work, err)
	}
	if err := writeFileSync(s.lfd, filepath.Base(l.Seen), seen); err != nil {
		return fmt.Errorf("staging: seen log: %w", err)
	}
	if err := unix.Syncfs(bfd); err != nil {
		return fmt.Errorf("staging: sync base: %w", err)
	}
	if err := writeFileSync(s.lfd, filepath.Base(l.BaseDone), []byte("ok\n")); err != nil {
		return fmt.Errorf("staging: %w", err)
	}
	return nil
}

// linkFarm mirrors the directory src into dst: directories recreated
// with their mode, owner and user.* xattrs, regular files hard-linked,
// symlinks copied. Device nodes, FIFOs and sockets are left out, so the
// guest never sees them. seen gets the stat of every mirrored W entry as
// it is once mirrored (a file's after its link, which moves its ctime).
func linkFarm(src, dst int, rel string, seen func(rel string, st *unix.Stat_t)) error {
	return dirNames(src, func(names []string) error {
		for _, name := range names {
			st, ok, err := lstatAt(src, name)
			if err != nil {
				return pathErr("stat", "work", joinRel(rel, name), err)
			}
			if !ok {
				continue
			}
			switch typeOf(st.Mode) {
			case TypeFile:
				if err := unix.Linkat(src, name, dst, name, 0); err != nil {
					return pathErr("link", "work", joinRel(rel, name), err)
				}
				lst, ok, err := lstatAt(dst, name)
				if err != nil || !ok {
					return pathErr("stat", "base", joinRel(rel, name), err)
				}
				seen(joinRel(rel, name), &lst)
			case TypeSymlink:
				seen(joinRel(rel, name), &st)
				t, err := readlinkAt(src, name)
				if err != nil {
					return pathErr("readlink", "work", joinRel(rel, name), err)
				}
				if err := unix.Symlinkat(t, dst, name); err != nil {
					return pathErr("symlink", "base", joinRel(rel, name), err)
				}
				unix.Fchownat(dst, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
			case TypeDir:
				if err := unix.Mkdirat(dst, name, 0o700); err != nil {
					return pathErr("mkdir", "base", joinRel(rel, name), err)
				}
				sfd, err := openat2(src, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					return pathErr("open", "work", joinRel(rel, name), err)
				}
				dfd, err := openat2(dst, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					unix.Close(sfd)
					return pathErr("open", "base", joinRel(rel, name), err)
				}
				seen(joinRel(rel, name), &st)
				err = linkFarm(sfd, dfd, joinRel(rel, name), seen)
				if err == nil {
					err = copyAttrs(sfd, dfd, &st)
				}
				unix.Close(sfd)
				unix.Close(dfd)
				if err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// writeFileSync creates name in dirfd with data atomically (temp file,
// fsync, rename, fsync of the directory).
func writeFileSync(dirfd int, name string, data []byte) error {
	tmp := name + ".tmp"
	fd, err := openat2(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := fdWriter(fd).Write(data); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Fsync(fd); err != nil {
		unix.Close(fd)
		return err
	}
	unix.Close(fd)
	if err := unix.Renameat(dirfd, tmp, dirfd, name); err != nil {
		return err
	}
	return unix.Fsync(dirfd)
}

func (s *Stager) loadIndex() (map[string]indexEntry, error) {
	data, err := os.ReadFile(s.l.Index)
	if errors.Is(err, os.ErrNotExist) {
		return make(map[string]indexEntry), nil
	}
	if err != nil {
		return nil, fmt.Errorf("staging: %w", err)
	}
	return decodeIndex(data, s.l.Index)
}

// resetCreated clears the created marks of the index when a fresh base is
// built: what earlier runs created and W still has is in the new base;
// what W lost since is not the agent's to remove. A path is marked
// created again when a commit of this run creates it.
//
// It also forgets the labels of paths W no longer has (the user removed
// them, or a git gc on the host packed the loose objects the agent
// wrote): a label lives as long as its location, a new entry at the path
// takes its pending label alone, and every commit rewrites the whole
// index, so such entries only made each commit slower, run after run
// (docs/soak.md). A path W still has, or one that cannot be looked at,
// keeps its label.
func (s *Stager) resetCreated(idx map[string]indexEntry) (map[string]indexEntry, error) {
	changed := false
	out := make(map[string]indexEntry, len(idx))
	for p, e := range idx {
		if e.Created {
			changed = true
			e.Created = false
		}
		if !e.HasLabel {
			continue
		}
		if p != "" && p != "." {
			if err := unix.Fstatat(s.wfd, p, new(unix.Stat_t), unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				changed = true
				continue
			}
		}
		out[p] = e
	}
	if !changed {
		return idx, nil
	}
	var b bytes.Buffer
	if err := encodeIndex(&b, out); err != nil {
		return nil, fmt.Errorf("staging: index: %w", err)
	}
	if err := writeFileSync(s.sfd, filepath.Base(s.l.Index), b.Bytes()); err != nil {
		return nil, fmt.Errorf("staging: index: %w", err)
	}
	return out, nil
}

// stampBase writes the seen log of an existing base.
func (s *Stager) stampBase() error {
	seen := []byte(seenMagic)
	var walk func(dfd int, rel string) error
	walk = func(dfd int, rel string) error {
		return dirNames(dfd, func(names []string) error {
			for _, n := range names {
				st, ok, err := lstatAt(dfd, n)
				if err != nil || !ok {
					return err
				}
				p := joinRel(rel, n)
				if typeOf(st.Mode) == TypeFile {
					seen = appendSeenSet(seen, p, stampOf(&st)) // B's link is W's inode
				} else if wpar, wn, err := parentOf(s.wfd, p); err == nil {
					// B's directories and symlinks are copies: stamp W's.
					if wst, ok, err := lstatAt(wpar, wn); err == nil && ok && typeOf(wst.Mode) == typeOf(st.Mode) {
						seen = appendSeenSet(seen, p, stampOf(&wst))
					}
					unix.Close(wpar)
				}
				if typeOf(st.Mode) == TypeDir {
					fd, err := openat2(dfd, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
					if err != nil {
						return pathErr("open", "base", p, err)
					}
					err = walk(fd, p)
					unix.Close(fd)
					if err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	bfd, err := openRoot(s.l.Base)
	if err != nil {
		return fmt.Errorf("staging: base dir: %w", err)
	}
	defer unix.Close(bfd)
	if err := walk(bfd, ""); err != nil {
		return fmt.Errorf("staging: stamp the base: %w", err)
	}
	if err := writeFileSync(s.lfd, filepath.Base(s.l.Seen), seen); err != nil {
		return fmt.Errorf("staging: seen log: %w", err)
	}
	return nil
}
