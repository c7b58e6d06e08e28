package staging

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The commit protocol (see docs/staging.md):
//
//	prepare  every change checked against the stamp of W's entry in the
//	         agent's view: a changed entry is a conflict, kept aside, not journaled
//	         journal/new/<n>  new images copied from U (digest verified)
//	         journal/pre/<n>  hard links to the W entries to be replaced or removed
//	         <state>/index.next, <state>/index.pre (the label index, new and old)
//	         syncfs; journal/records.tmp -> journal/records; fsync   ("prepared")
//	apply    journal/applying; fsync                                 ("applying")
//	         per record: rename/unlink/mkdir/chmod in W; removed directories
//	         are moved to journal/pre/<n>; index.next renamed to index; syncfs
//	done     journal/done; fsync; remove the journal and index.pre
//
// The journal is in the layer directory (on W's mount: its images are
// linked from and renamed into W); the index files are in the state
// directory, which may be on another filesystem, so they never cross
// filesystems either. W is untouched until "applying" exists. Recovery
// discards a journal that is not applying, rolls back one that is
// applying but not done (every pre-image is on disk by then), and
// finishes one that is done.

const (
	jRecords  = "records"
	jApplying = "applying"
	jDone     = "done"
	jPre      = "pre"
	jNew      = "new"
	jIndex    = "index"
	journal   = "journal"
	indexNext = "index.next" // in the state directory
	indexPre  = "index.pre"  // in the state directory
)

type preparer struct {
	s       *Stager
	ctx     context.Context
	jw      *journalWriter
	prefd   int
	newfd   int
	res     *Result
	n       uint64
	mkdirs  map[string]bool // directories this commit creates (W has none there)
	gone    map[string]bool // W entries this commit removes or replaces
	idx     map[string]indexEntry
	wdirs   *dirCache         // W's directory of the last change
	bdirs   *dirCache         // B's directory of the last change
	used    []string          // paths whose pending label became permanent
	dropped []string          // removed paths whose pending labels go on success
	stamps  map[string]stamp  // upper stamps of committed files, installed on success
	touched []string          // journaled paths: their seen stamps are updated after the commit
	expect  map[string]wstamp // journaled paths: W's entry as checked (TypeNone: absent), checked again right before applying
	// conflicts: paths not committed because W changed under the agent.
	conflicts map[string]bool
}

func (s *Stager) commit(ctx context.Context, changes []Change) (res *Result, err error) {
	if _, ok, err := lstatAt(s.lfd, journal); err != nil || ok {
		if err == nil {
			err = errors.New("a journal is present (reopen the stager to recover it)")
		}
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	res = &Result{}
	var h journalHeader
	if _, err := rand.Read(h.ID[:]); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	_, h.IndexPre, err = lstatAt(s.sfd, jIndex)
	if err != nil {
		return nil, fmt.Errorf("staging: commit: index: %w", err)
	}
	for _, n := range []string{indexNext, indexPre} {
		if err := unix.Unlinkat(s.sfd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("staging: commit: %w", err)
		}
	}
	fault("prepare:begin")
	if err := unix.Mkdirat(s.lfd, journal, 0o700); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	prepared := false
	var p *preparer
	defer func() {
		if !prepared {
			// Nothing in W changed: drop the partial journal.
			if rerr := s.removeJournal(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("staging: remove journal: %w", rerr))
			}
		}
		if err != nil && p != nil {
			// The journal's links moved the ctime of W's entries that
			// stay as they were.
			for _, t := range p.touched {
				s.restamp(t)
			}
		}
	}()
	jfd, err := openat2(s.lfd, journal, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	defer unix.Close(jfd)
	p = &preparer{s: s, ctx: ctx, res: res, prefd: -1, newfd: -1,
		mkdirs: make(map[string]bool), gone: make(map[string]bool),
		stamps: make(map[string]stamp), conflicts: make(map[string]bool), expect: make(map[string]wstamp),
		wdirs: &dirCache{root: s.wfd, fd: -1}, bdirs: &dirCache{root: s.bfd, fd: -1}}
	defer p.wdirs.close()
	defer p.bdirs.close()
	for _, d := range []string{jPre, jNew} {
		if err := unix.Mkdirat(jfd, d, 0o700); err != nil {
			return nil, fmt.Errorf("staging: commit: %w", err)
		}
	}
	if p.prefd, err = openat2(jfd, jPre, unix.O_RDONLY|unix.O_DIRECTORY, 0); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	defer unix.Close(p.prefd)
	if p.newfd, err = openat2(jfd, jNew, unix.O_RDONLY|unix.O_DIRECTORY, 0); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	defer unix.Close(p.newfd)
	rfd, err := openat2(jfd, jRecords+".tmp", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	rf := os.NewFile(uintptr(rfd), jRecords)
	defer rf.Close()
	if p.jw, err = newJournalWriter(rf, h); err != nil {
		return nil, fmt.Errorf("staging: commit: journal: %w", err)
	}
	// The new index starts as a copy of the committed one.
	old := s.labels.snapshot()
	p.idx = make(map[string]indexEntry, len(old))
	for k, v := range old {
		p.idx[k] = v
	}

	if changes == nil {
		err = s.scan(ctx, p.add)
	} else {
		cs := slices.Clone(changes)
		slices.SortStableFunc(cs, func(a, b Change) int {
			switch {
			case pathLess(a.Path, b.Path):
				return -1
			case pathLess(b.Path, a.Path):
				return 1
			}
			return 0
		})
		for i, c := range cs {
			if i > 0 && cs[i-1].Path == c.Path {
				res.Refused = append(res.Refused, Refusal{Path: c.Path, Op: c.Op, Reason: ReasonDuplicate})
				continue
			}
			if err = p.add(c); err != nil {
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	// Drop the index entries of everything below removed entries (a
	// walk of the whole index: only when something was removed).
	if len(p.gone) > 0 {
		for k := range p.idx {
			if p.goneAncestor(k) {
				delete(p.idx, k)
			}
		}
	}
	if h.IndexPre {
		if err := unix.Linkat(s.sfd, jIndex, s.sfd, indexPre, 0); err != nil {
			return nil, fmt.Errorf("staging: commit: link index pre-image: %w", err)
		}
	}
	if err := writeIndexAt(s.sfd, indexNext, p.idx); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	fault("prepare:index")
	if err := p.jw.Close(); err != nil {
		return nil, fmt.Errorf("staging: commit: journal: %w", err)
	}
	if err := unix.Syncfs(s.sfd); err != nil {
		return nil, fmt.Errorf("staging: commit: syncfs: %w", err)
	}
	if err := unix.Syncfs(s.lfd); err != nil {
		return nil, fmt.Errorf("staging: commit: syncfs: %w", err)
	}
	fault("prepare:synced")
	if err := unix.Renameat(jfd, jRecords+".tmp", jfd, jRecords); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	if err := unix.Fsync(jfd); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	fault("prepared")
	if err := createMarker(jfd, jApplying); err != nil {
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	prepared = true
	fault("applying")

	if applied, err := s.apply(jfd, p.prefd, p.newfd, p.stamps, p.expect); err != nil {
		undo := applied + 1 // the failing record may be half done
		if errors.Is(err, errLateConflict) {
			undo = applied // nothing of it was done: never undo over the user's entry
		}
		rerr := s.rollback(jfd, undo)
		if rerr == nil {
			rerr = s.removeJournal()
		}
		if rerr != nil {
			return nil, fmt.Errorf("staging: commit: %w (rollback: %v; reopen to recover)", err, rerr)
		}
		return nil, fmt.Errorf("staging: commit rolled back: %w", err)
	}
	if err := createMarker(jfd, jDone); err != nil {
		// Not marked done: recovery will roll back. Try now.
		if rerr := s.rollback(jfd, -1); rerr == nil {
			s.removeJournal()
		}
		return nil, fmt.Errorf("staging: commit: %w", err)
	}
	fault("done")
	s.labels.install(p.idx, p.used)
	for _, d := range p.dropped {
		s.labels.drop(d)
	}
	for k, v := range p.stamps {
		s.stamps[k] = v
	}
	for _, t := range p.touched {
		s.noteSeen(t)
	}
	p.touched = nil
	if err := s.removeJournal(); err != nil {
		return res, fmt.Errorf("staging: commit applied; remove journal: %w", err)
	}
	fault("cleaned")
	if err := s.compactPending(); err != nil {
		return res, fmt.Errorf("staging: commit applied; %w", err)
	}
	return res, nil
}

func createMarker(jfd int, name string) error {
	fd, err := openat2(jfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return unix.Fsync(jfd)
}

func writeIndexAt(dirfd int, name string, idx map[string]indexEntry) error {
	fd, err := openat2(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := encodeIndex(f, idx); err != nil {
		return fmt.Errorf("write index: %w", err)
	}
	return nil
}

func (s *Stager) removeJournal() error {
	if err := removeAt(s.lfd, journal); err != nil {
		return err
	}
	if err := unix.Fsync(s.lfd); err != nil {
		return err
	}
	for _, n := range []string{indexNext, indexPre} {
		if err := unix.Unlinkat(s.sfd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return unix.Fsync(s.sfd)
}

// goneAncestor reports whether a proper ancestor of p is removed or
// replaced by this commit.
func (p *preparer) goneAncestor(path string) bool {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '/' && p.gone[path[:i]] {
			return true
		}
	}
	return false
}

func (p *preparer) mkdirAncestor(path string) bool {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '/' && p.mkdirs[path[:i]] {
			return true
		}
	}
	return false
}

func (p *preparer) refuse(c Change, reason string) error {
	p.res.Refused = append(p.res.Refused, Refusal{Path: c.Path, Op: c.Op, Reason: reason})
	return nil
}

// add journals one change: checks it against U, writes its new image,
// links the pre-image of W's entry, and records the operation.
func (p *preparer) add(c Change) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	if err := checkRel(c.Path); err != nil {
		return err
	}
	if c.Refused != "" {
		return p.refuse(c, c.Refused)
	}
	if len(c.Path) > maxPath {
		return p.refuse(c, ReasonTooLong)
	}
	if p.goneAncestor(c.Path) {
		return p.refuse(c, ReasonUnderDel)
	}
	if p.conflictAncestor(c.Path) {
		return p.conflict(c, ConflictParent)
	}
	s := p.s
	r := record{N: p.n + 1, Op: c.Op, Path: c.Path}

	// W's entry now: its type is the pre-image.
	var wpar int
	var name string
	var err error
	if p.mkdirAncestor(c.Path) {
		// A directory this commit creates (maybe replacing a file or a
		// symlink of W) is on the way: W has nothing here yet. Applying
		// resolves the path again, never following a symlink.
		wpar, err = -1, errSkip
	} else {
		var dir string
		dir, name = splitRel(c.Path)
		wpar, err = p.wdirs.get(dir)
	}
	switch {
	case err == errSkip:
		r.NewUID, r.NewGID = s.owner.UID, s.owner.GID
	case err == nil:
		st, ok, err := lstatAt(wpar, name)
		if err != nil {
			return pathErr("stat", "work", c.Path, err)
		}
		var wst *unix.Stat_t
		if ok {
			wst = &st
		}
		if reason, err := p.checkConflict(c, wpar, name, wst); err != nil {
			return err
		} else if reason != "" {
			return p.conflict(c, reason)
		}
		if ok {
			r.Pre = typeOf(st.Mode)
			r.NewUID, r.NewGID = st.Uid, st.Gid
			if r.Pre == TypeDir {
				r.PreMode = st.Mode & 0o7777
				dfd, err := openat2(wpar, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					if errors.Is(err, unix.EXDEV) {
						return p.refuse(c, ReasonSymlinkW)
					}
					return pathErr("open", "work", c.Path, err)
				}
				r.PreXattrs, err = listXattrs(dfd, userXattrs, nil)
				unix.Close(dfd)
				if err != nil {
					return pathErr("xattrs", "work", c.Path, err)
				}
			}
		} else {
			r.NewUID, r.NewGID = s.owner.UID, s.owner.GID
		}
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
		dir, _ := splitRel(c.Path)
		if crossesSymlink(s.wfd, dir) {
			return p.refuse(c, ReasonSymlinkW)
		}
		if _, had := s.seen[dir]; had {
			// The agent's view has the directory; W lost it during
			// the run (the user removed or renamed it).
			return p.conflict(c, ConflictGone)
		}
		return p.refuse(c, ReasonParent)
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV):
		return p.refuse(c, ReasonSymlinkW)
	case errors.Is(err, unix.ENAMETOOLONG):
		return p.refuse(c, ReasonTooLong)
	default:
		return pathErr("open parent", "work", c.Path, err)
	}

	// U's entry now, checked against the scanned digest; the new image.
	newName := strconv.FormatUint(r.N, 10)
	var st *unix.Stat_t
	switch c.Type {
	case TypeNone:
		if c.Op != OpUnlink && c.Op != OpRmdir {
			return fmt.Errorf("%w: change %v has no staged entry", ErrBadPath, c)
		}
		ok, err := p.removalStaged(c.Path)
		if err != nil {
			return err
		}
		if !ok || c.Digest != digestNone {
			return p.refuse(c, ReasonChanged)
		}
		if r.Pre == TypeNone {
			return nil // already absent from W
		}
		r.New = TypeNone
	case TypeFile:
		reason, stp, err := p.fileImage(c, newName, r.NewUID, r.NewGID)
		if err != nil || reason != "" {
			return errOrRefuse(p, c, reason, err)
		}
		st = stp
		r.New = TypeFile
	case TypeSymlink:
		if linkEscapes(c.Path, c.Target) {
			return p.refuse(c, ReasonLinkEscape)
		}
		upar, uname, err := parentOf(s.ufd, c.Path)
		if err != nil {
			return p.refuse(c, ReasonChanged)
		}
		t, err := readlinkAt(upar, uname)
		unix.Close(upar)
		if err != nil || t != c.Target || sum(newDigest(TypeSymlink, 0, nil, t)) != c.Digest {
			return p.refuse(c, ReasonChanged)
		}
		if err := unix.Symlinkat(t, p.newfd, newName); err != nil {
			return fmt.Errorf("symlink new image: %w", err)
		}
		if err := unix.Fchownat(p.newfd, newName, int(r.NewUID), int(r.NewGID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown new image: %w", err)
		}
		r.New = TypeSymlink
	case TypeDir:
		ufd, err := openat2(s.ufd, c.Path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return p.refuse(c, ReasonChanged)
		}
		var ust unix.Stat_t
		err = unix.Fstat(ufd, &ust)
		var xs []xattr
		if err == nil {
			xs, err = listXattrs(ufd, userXattrs, nil)
		}
		unix.Close(ufd)
		if err != nil {
			return pathErr("stat", "upper", c.Path, err)
		}
		if sum(newDigest(TypeDir, ust.Mode, xs, "")) != c.Digest {
			return p.refuse(c, ReasonChanged)
		}
		r.New = TypeDir
		r.NewMode = ust.Mode & 0o777
		r.NewXattrs = xs
		if r.Pre != TypeDir {
			p.mkdirs[c.Path] = true
		}
	default:
		return p.refuse(c, ReasonSpecial)
	}

	// Pre-image: a hard link to W's non-directory entry (directories are
	// moved into the journal while applying, or changed in place).
	var exp wstamp // W's entry as the apply step must find it (TypeNone: absent)
	if r.Pre != TypeNone && r.Pre != TypeDir {
		if err := unix.Linkat(wpar, name, p.prefd, newName, 0); err != nil {
			unix.Unlinkat(p.newfd, newName, 0)
			return pathErr("link pre-image of", "work", c.Path, err)
		}
		pst, ok, err := lstatAt(p.prefd, newName)
		if err != nil || !ok {
			return pathErr("stat pre-image of", "work", c.Path, err)
		}
		exp = stampOf(&pst) // the link moved its ctime
	} else if r.Pre == TypeDir && wpar >= 0 {
		if dst, ok, err := lstatAt(wpar, name); err == nil && ok {
			exp = stampOf(&dst)
		}
	}
	p.expect[c.Path] = exp
	// Below a removed entry, or a directory replaced by a non-directory,
	// nothing else of this commit can go (a directory replacing a file
	// may of course have new children: see mkdirs).
	if r.New != TypeDir && r.Pre != TypeNone {
		p.gone[c.Path] = true
	}
	if err := p.jw.Write(&r); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	p.n = r.N
	p.touched = append(p.touched, c.Path)
	fault("prepare:image")

	// Result and index.
	p.res.Applied++
	if r.New == TypeNone {
		// A whiteout in U: remember it, so that a path the user creates
		// again after the commit is not taken for a staged removal.
		if upar, uname, err := parentOf(s.ufd, c.Path); err == nil {
			if ust, ok, err := lstatAt(upar, uname); err == nil && ok && isWhiteout(upar, uname, &ust) {
				p.stamps[c.Path] = stamp{uIno: ust.Ino, uCtime: ctimeNs(&ust), uSize: uint64(ust.Size)}
			}
			unix.Close(upar)
		}
	}
	if r.New == TypeFile {
		p.res.Bytes += c.Size
		if st != nil {
			p.stamps[c.Path] = stamp{uIno: st.Ino, uCtime: ctimeNs(st), uSize: uint64(st.Size)}
		}
	}
	if c.Stripped && r.New != TypeNone {
		p.res.Stripped = append(p.res.Stripped, c.Path)
	}
	p.index(c, &r)
	return nil
}

func errOrRefuse(p *preparer, c Change, reason string, err error) error {
	if err != nil {
		return err
	}
	return p.refuse(c, reason)
}

// index updates the new label index for a journaled change.
func (p *preparer) index(c Change, r *record) {
	if r.New == TypeNone {
		delete(p.idx, c.Path)
		p.dropped = append(p.dropped, c.Path)
		return
	}
	e, had := p.idx[c.Path]
	if r.Pre != r.New {
		// A new entry (or a new type): it starts without a label.
		e = indexEntry{}
		had = false
	}
	if lb, ok := p.s.labels.Pending(c.Path); ok {
		if had && e.HasLabel {
			e.Label = e.Label.Combine(lb)
		} else {
			e.Label = lb
		}
		e.HasLabel = true
		p.used = append(p.used, c.Path)
	}
	e.Created = !p.inBase(c.Path)
	if e.HasLabel || e.Created {
		p.idx[c.Path] = e
	} else {
		delete(p.idx, c.Path)
	}
}

// inBase reports whether the frozen base B has an entry at path.
func (p *preparer) inBase(path string) bool {
	dir, name := splitRel(path)
	bpar, err := p.bdirs.get(dir)
	if err != nil {
		return false
	}
	_, ok, _ := lstatAt(bpar, name)
	return ok
}

// errSkip: no lookup needed.
var errSkip = errors.New("skip")

// removalStaged reports whether the merged view lacks path: resolving
// it as overlayfs does, U has a whiteout on the way, or a non-directory,
// or U lacks it where B is hidden (opaque directory) or lacks it too.
func (p *preparer) removalStaged(path string) (bool, error) {
	comps := strings.Split(path, "/")
	ufd, err := openDir(p.s.ufd, "")
	if err != nil {
		return false, err
	}
	defer func() { unix.Close(ufd) }()
	bVisible := true
	for i, c := range comps {
		st, ok, err := lstatAt(ufd, c)
		if err != nil {
			return false, pathErr("stat", "upper", path, err)
		}
		if !ok {
			if !bVisible {
				return true, nil
			}
			bpar, name, err := parentOf(p.s.bfd, path)
			if err != nil {
				return true, nil
			}
			defer unix.Close(bpar)
			_, inB, err := lstatAt(bpar, name)
			return !inB, err
		}
		if isWhiteout(ufd, c, &st) {
			return true, nil
		}
		if i == len(comps)-1 {
			return false, nil
		}
		if typeOf(st.Mode) != TypeDir {
			return true, nil
		}
		next, err := openat2(ufd, c, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return false, pathErr("open", "upper", path, err)
		}
		unix.Close(ufd)
		ufd = next
		if v, err := getXattr(ufd, xattrOpaque); err == nil && string(v) == "y" {
			bVisible = false
		}
	}
	return false, nil
}

// fileImage copies U's file to journal/new/<name> with the committed
// mode, owner, user.* xattrs and mtime, verifying the digest. It returns
// a refusal reason, or the upper file's stat.
func (p *preparer) fileImage(c Change, name string, uid, gid uint32) (string, *unix.Stat_t, error) {
	s := p.s
	ufd, err := openFile(s.ufd, c.Path)
	if err != nil {
		return ReasonChanged, nil, nil
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		return "", nil, pathErr("stat", "upper", c.Path, err)
	}
	if typeOf(st.Mode) != TypeFile {
		return ReasonChanged, nil, nil
	}
	if st.Size > s.l.MaxFileSize {
		return ReasonTooLarge, nil, nil
	}
	xs, err := listXattrs(ufd, userXattrs, nil)
	if err != nil {
		return "", nil, pathErr("xattrs", "upper", c.Path, err)
	}
	h := newDigest(TypeFile, st.Mode, xs, "")
	nfd, err := openat2(p.newfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return "", nil, fmt.Errorf("create new image: %w", err)
	}
	ok := false
	defer func() {
		unix.Close(nfd)
		if !ok {
			unix.Unlinkat(p.newfd, name, 0)
		}
	}()
	if _, err := copyStream(fdWriter(nfd), h, fdReader(ufd), s.l.MaxFileSize); err != nil {
		if errors.Is(err, errTooLarge) {
			return ReasonTooLarge, nil, nil
		}
		return "", nil, pathErr("copy", "upper", c.Path, err)
	}
	if sum(h) != c.Digest {
		return ReasonChanged, nil, nil
	}
	perm, _ := stripMode(st.Mode)
	if err := unix.Fchown(nfd, int(uid), int(gid)); err != nil {
		return "", nil, fmt.Errorf("chown new image: %w", err)
	}
	if err := syncXattrs(nfd, xs); err != nil {
		return "", nil, fmt.Errorf("new image of %q: %w", c.Path, err)
	}
	if err := unix.Fchmod(nfd, uint32(perm)); err != nil {
		return "", nil, fmt.Errorf("chmod new image: %w", err)
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(p.newfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return "", nil, fmt.Errorf("set times of new image: %w", err)
	}
	ok = true
	return "", &st, nil
}

// dirCache keeps the last W parent directory open while applying.
type dirCache struct {
	root  int
	path  string
	fd    int
	err   error
	valid bool
}

func (d *dirCache) get(dir string) (int, error) {
	if d.valid && d.path == dir {
		return d.fd, d.err
	}
	d.close()
	d.fd, d.err = openDir(d.root, dir)
	d.path, d.valid = dir, true
	return d.fd, d.err
}

func (d *dirCache) close() {
	if d.fd >= 0 {
		unix.Close(d.fd)
	}
	d.fd, d.err, d.valid = -1, nil, false
}

// errLateConflict: W's entry changed between the commit's check and its
// apply step; the commit is rolled back and the next one reports the
// conflict.
var errLateConflict = errors.New("changed in the working directory during the commit")

// apply performs every journaled operation on W and returns how many it
// completed. Right before each, W's entry is checked again against what
// the prepare step found (expect), so a user edit that lands while the
// commit prepares is never replaced.
func (s *Stager) apply(jfd, prefd, newfd int, stamps map[string]stamp, expect map[string]wstamp) (int, error) {
	f, err := openJournal(jfd)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	jr, err := newJournalReader(f, s.l.Journal)
	if err != nil {
		return 0, err
	}
	dc := &dirCache{root: s.wfd, fd: -1}
	defer dc.close()
	applied := 0
	for {
		r, err := jr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return applied, err
		}
		dir, name := splitRel(r.Path)
		wpar, err := dc.get(dir)
		if err != nil {
			return applied, pathErr("open parent", "work", r.Path, err)
		}
		if exp, ok := expect[r.Path]; ok {
			cur, there, err := lstatAt(wpar, name)
			if err != nil {
				return applied, pathErr("stat", "work", r.Path, err)
			}
			if there != (exp.Type != TypeNone) || there && !stampOf(&cur).sameEntry(exp) {
				return applied, pathErr(r.Op.String(), "work", r.Path, errLateConflict)
			}
		}
		n := strconv.FormatUint(r.N, 10)
		if err := applyRecord(r, wpar, name, n, prefd, newfd); err != nil {
			return applied, pathErr(r.Op.String(), "work", r.Path, err)
		}
		applied++
		if r.New == TypeFile {
			if st, ok, err := lstatAt(wpar, name); err == nil && ok {
				if sp, have := stamps[r.Path]; have {
					sp.wIno, sp.wCtime = st.Ino, ctimeNs(&st)
					stamps[r.Path] = sp
				}
			}
		}
		fault("apply:op")
	}
	if err := unix.Renameat(s.sfd, indexNext, s.sfd, jIndex); err != nil {
		return applied, fmt.Errorf("install index: %w", err)
	}
	fault("apply:index")
	if err := unix.Syncfs(s.wfd); err != nil {
		return applied, fmt.Errorf("syncfs: %w", err)
	}
	if err := unix.Fsync(s.sfd); err != nil {
		return applied, fmt.Errorf("fsync state dir: %w", err)
	}
	fault("apply:synced")
	return applied, nil
}

func openJournal(jfd int) (*os.File, error) {
	fd, err := openat2(jfd, jRecords, unix.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open journal: %w", err)
	}
	return os.NewFile(uintptr(fd), jRecords), nil
}

func applyRecord(r *record, wpar int, name, n string, prefd, newfd int) error {
	switch r.New {
	case TypeNone:
		if r.Pre == TypeDir {
			return unix.Renameat(wpar, name, prefd, n)
		}
		return unix.Unlinkat(wpar, name, 0)
	case TypeFile, TypeSymlink:
		if r.Pre == TypeDir {
			if err := unix.Renameat(wpar, name, prefd, n); err != nil {
				return err
			}
			fault("apply:moved")
		}
		return unix.Renameat(newfd, n, wpar, name)
	case TypeDir:
		if r.Pre != TypeDir {
			if r.Pre != TypeNone {
				if err := unix.Unlinkat(wpar, name, 0); err != nil {
					return err
				}
				fault("apply:unlinked")
			}
			if err := unix.Mkdirat(wpar, name, 0o700); err != nil {
				return err
			}
		}
		fd, err := openat2(wpar, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if r.Pre != TypeDir {
			if err := unix.Fchown(fd, int(r.NewUID), int(r.NewGID)); err != nil {
				return err
			}
		}
		if err := syncXattrs(fd, r.NewXattrs); err != nil {
			return err
		}
		return unix.Fchmod(fd, r.NewMode)
	}
	return fmt.Errorf("bad record type %v", r.New)
}

// rollback restores the journaled W entries to their pre-images: the
// first limit records, or all (limit < 0, after a crash: unapplied
// records are no-ops then, their pre-image being W's entry). It is
// idempotent: a crash during rollback is recovered by rolling back again.
func (s *Stager) rollback(jfd int, limit int) error {
	f, err := openJournal(jfd)
	if err != nil {
		return err
	}
	defer f.Close()
	// Read the whole journal once before acting on it: a corrupt journal
	// is reported, never half-applied.
	jr, err := newJournalReader(f, s.l.Journal)
	if err != nil {
		return err
	}
	for {
		if _, err := jr.Next(); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if jr, err = newJournalReader(f, s.l.Journal); err != nil {
		return err
	}
	prefd, err := openat2(jfd, jPre, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("open pre-images: %w", err)
	}
	defer unix.Close(prefd)
	for {
		r, err := jr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if limit >= 0 && r.N > uint64(limit) {
			continue // never applied (records are numbered from 1)
		}
		if err := s.undo(r, prefd); err != nil {
			return pathErr("roll back "+r.Op.String(), "work", r.Path, err)
		}
		fault("rollback:op")
	}
	if jr.Header.IndexPre {
		if _, ok, _ := lstatAt(s.sfd, indexPre); ok {
			if err := unix.Renameat(s.sfd, indexPre, s.sfd, jIndex); err != nil {
				return fmt.Errorf("restore index: %w", err)
			}
		}
	} else if err := unix.Unlinkat(s.sfd, jIndex, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove index: %w", err)
	}
	fault("rollback:index")
	if err := unix.Syncfs(s.wfd); err != nil {
		return fmt.Errorf("syncfs: %w", err)
	}
	if err := unix.Fsync(s.sfd); err != nil {
		return fmt.Errorf("fsync state dir: %w", err)
	}
	fault("rollback:synced")
	return nil
}

// undo restores one record's pre-image.
func (s *Stager) undo(r *record, prefd int) error {
	n := strconv.FormatUint(r.N, 10)
	wpar, name, err := parentOf(s.wfd, r.Path)
	if err != nil {
		if r.Pre == TypeNone && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) {
			return nil // the parent is gone, so is the entry
		}
		return err
	}
	defer unix.Close(wpar)
	cur, curOK, err := lstatAt(wpar, name)
	if err != nil {
		return err
	}
	_, preOK, err := lstatAt(prefd, n)
	if err != nil {
		return err
	}
	switch r.Pre {
	case TypeNone:
		return removeAt(wpar, name)
	case TypeDir:
		if preOK { // moved into the journal: put it back
			if err := removeAt(wpar, name); err != nil {
				return err
			}
			return unix.Renameat(prefd, n, wpar, name)
		}
		if !curOK || typeOf(cur.Mode) != TypeDir {
			return errors.New("directory pre-image is missing")
		}
		fd, err := openat2(wpar, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := syncXattrs(fd, r.PreXattrs); err != nil {
			return err
		}
		return unix.Fchmod(fd, r.PreMode)
	default:
		if !preOK {
			return nil // restored by an earlier rollback
		}
		if curOK && typeOf(cur.Mode) == TypeDir {
			if err := removeAt(wpar, name); err != nil {
				return err
			}
		}
		// Renaming a link onto another link of the same inode does
		// nothing; the unlink below then drops the journal's link.
		if err := unix.Renameat(prefd, n, wpar, name); err != nil {
			return err
		}
		if err := unix.Unlinkat(prefd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		return nil
	}
}

// recover finishes an interrupted commit (see the protocol above), sets
// s.recovery and returns the journaled paths.
func (s *Stager) recover() ([]string, error) {
	jfd, err := openat2(s.lfd, journal, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		// A journal removed, but not the index images after it.
		if err := s.removeJournal(); err != nil {
			return nil, fmt.Errorf("staging: recover: %w", err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("staging: recover: %w", err)
	}
	defer unix.Close(jfd)
	rec := Recovery{Found: true}
	var paths []string
	_, hasRecords, _ := lstatAt(jfd, jRecords)
	_, applying, _ := lstatAt(jfd, jApplying)
	_, done, _ := lstatAt(jfd, jDone)
	switch {
	case !hasRecords || (!applying && !done):
		rec.Action = "discarded"
	case done:
		rec.Action = "completed"
	default:
		rec.Action = "rolled back"
		if err := s.rollback(jfd, -1); err != nil {
			s.recovery = rec
			return nil, fmt.Errorf("staging: recover: %w", err)
		}
	}
	if hasRecords {
		if f, err := openJournal(jfd); err == nil {
			if jr, err := newJournalReader(f, s.l.Journal); err == nil {
				for {
					r, err := jr.Next()
					if err != nil {
						break
					}
					rec.Ops++
					paths = append(paths, r.Path)
				}
			}
			f.Close()
		}
	}
	s.recovery = rec
	return paths, nil
}

// endRecovery removes the recovered journal and brings the stamps of W's
// entries up to date: the entries a completed commit wrote get theirs,
// and the entries whose ctime the journal's links moved (and removing
// it moves again) get theirs back. Which entries were linked is not
// known when the crash came before the records were complete, so every
// stamp is refreshed (one stat per entry). A marker file keeps this
// crash-safe: until the refresh is done, the next Open does it again.
func (s *Stager) endRecovery(paths []string) error {
	const marker = "restamp"
	_, pending, err := lstatAt(s.lfd, marker)
	if err != nil {
		return fmt.Errorf("staging: recover: %w", err)
	}
	if !s.recovery.Found && !pending {
		return nil
	}
	if s.recovery.Action == "completed" {
		for _, p := range paths {
			s.noteSeen(p)
		}
	}
	if s.recovery.Found {
		if s.seenFd >= 0 {
			if err := unix.Fsync(s.seenFd); err != nil {
				return fmt.Errorf("staging: recover: seen log: %w", err)
			}
		}
		if err := writeFileSync(s.lfd, marker, nil); err != nil {
			return fmt.Errorf("staging: recover: %w", err)
		}
		if err := s.removeJournal(); err != nil {
			return fmt.Errorf("staging: recover: remove journal: %w", err)
		}
		fault("recover:removed")
	}
	if !s.fresh {
		for p := range s.seen {
			s.restamp(p)
		}
	}
	if err := unix.Unlinkat(s.lfd, marker, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("staging: recover: %w", err)
	}
	return nil
}
