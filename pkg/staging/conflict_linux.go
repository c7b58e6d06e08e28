package staging

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func stampOf(st *unix.Stat_t) wstamp {
	return wstamp{Type: typeOf(st.Mode), Ino: st.Ino, Size: uint64(st.Size),
		Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec, Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec}
}

// newRunID names a run: its start time and a random suffix.
func newRunID() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// RunID names this run (the Open that built or resumed the layers): the
// directory of its conflicts is <StateDir>/conflicts/<RunID>.
func (s *Stager) RunID() string { return s.runID }

// Fresh reports whether Open built a fresh base from W; false means it
// resumed the layers of a run that did not finish (carbd crashed or was
// killed), whose staged changes are still to be decided.
func (s *Stager) Fresh() bool { return s.fresh }

// discardLayers removes a finished run's layers (the merged view must not
// be mounted). The finished marker goes last: a crash in between leaves
// a layer directory that is discarded again.
func (s *Stager) discardLayers() error {
	l := s.l
	if ok, err := Mounted(l); err != nil {
		return err
	} else if ok {
		if err := Unmount(l); err != nil {
			return fmt.Errorf("staging: unmount the finished run's merged view: %w", err)
		}
	}
	for _, p := range []string{l.Upper, l.OvlWork, l.Base, l.BaseDone, l.Seen, filepath.Join(l.Layers, "restamp"), l.Finished} {
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("staging: discard the finished run's layers: %w", err)
		}
	}
	return unix.Fsync(s.lfd)
}

// Discard removes the layers of a finished run (unmounting M if it is
// still mounted), so nothing of the run is left beside W, and closes the
// stager; the next Open builds a fresh base anyway. Without a successful
// Finish it only closes (the layers stay for the next Open to resume).
func (s *Stager) Discard() error {
	if err := s.lock(); err != nil {
		return err
	}
	defer s.mu.Unlock()
	defer func() {
		s.closed = true
		s.closeFds()
	}()
	if _, err := os.Lstat(s.l.Finished); err != nil {
		return nil
	}
	for _, fd := range []*int{&s.ufd, &s.bfd, &s.seenFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	if err := s.discardLayers(); err != nil {
		return err
	}
	if within(s.l.Merged, s.l.Layers) {
		_ = os.Remove(s.l.Merged) // the mount point, empty once unmounted
	}
	if s.l.Layers != s.l.State {
		_ = os.Remove(s.l.Layers) // only if empty
	}
	return nil
}

// loadSeen reads the seen log and opens it for appending.
func (s *Stager) loadSeen() error {
	name := filepath.Base(s.l.Seen)
	data, err := os.ReadFile(s.l.Seen)
	if err != nil {
		return fmt.Errorf("staging: %w", err)
	}
	if s.seen, err = decodeSeen(data, s.l.Seen); err != nil {
		return err
	}
	fd, err := openat2(s.lfd, name, unix.O_WRONLY|unix.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("staging: seen log: %w", err)
	}
	s.seenFd = fd
	return nil
}

// noteSeen records W's current entry at path as the one the agent's view
// has (after a commit), or its absence.
func (s *Stager) noteSeen(path string) {
	var b []byte
	wpar, name, err := parentOf(s.wfd, path)
	var st unix.Stat_t
	ok := false
	if err == nil {
		st, ok, err = lstatAt(wpar, name)
		unix.Close(wpar)
	}
	switch {
	case err == nil && ok:
		w := stampOf(&st)
		s.seen[path] = w
		b = appendSeenSet(nil, path, w)
	default:
		forgetBelow(s.seen, path)
		b = appendSeenDel(nil, path)
	}
	s.appendSeen(b)
}

// restamp refreshes the ctime of path's stamp when W's entry is the same
// inode with the same size and mtime: carbd's own journal links and
// unlinks move the ctime of W's entries whose commit then did not happen
// (discarded or rolled back).
func (s *Stager) restamp(path string) {
	old, had := s.seen[path]
	if !had || old.Type == TypeDir {
		return
	}
	wpar, name, err := parentOf(s.wfd, path)
	if err != nil {
		return
	}
	st, ok, err := lstatAt(wpar, name)
	unix.Close(wpar)
	if err != nil || !ok {
		return
	}
	w := stampOf(&st)
	if w.Type != old.Type || w.Ino != old.Ino || w.Size != old.Size || w.Mtime != old.Mtime || w.Ctime == old.Ctime {
		return
	}
	s.seen[path] = w
	s.appendSeen(appendSeenSet(nil, path, w))
}

// appendSeen appends to the seen log. A failed append is not an error:
// the stamp in memory is current, and one lost from the log only makes a
// later change of that path after a restart a reported conflict.
func (s *Stager) appendSeen(b []byte) {
	if s.seenFd >= 0 {
		_, _ = fdWriter(s.seenFd).Write(b)
	}
}

// checkConflict compares W's entry at c.Path (w; nil: absent) with the
// stamp of the agent's view and returns a conflict reason, or "". wpar
// is W's parent directory of the entry.
func (p *preparer) checkConflict(c Change, wpar int, name string, w *unix.Stat_t) (string, error) {
	exp, had := p.s.seen[c.Path]
	switch {
	case !had && w == nil:
		return "", nil
	case !had:
		return ConflictCreated, nil
	case w == nil:
		return ConflictRemoved, nil
	}
	got := stampOf(w)
	if got.Type != exp.Type || got.Ino != exp.Ino {
		return ConflictReplaced, nil
	}
	if !got.sameEntry(exp) {
		return ConflictWritten, nil
	}
	if got.Type == TypeDir && c.Type == TypeNone || c.Type != TypeDir && got.Type == TypeDir {
		// Removing or replacing a directory removes what is below it:
		// every entry there must be one the agent's view had.
		fd, err := openat2(wpar, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return "", pathErr("open", "work", c.Path, err)
		}
		defer unix.Close(fd)
		ok, err := p.s.subtreeSeen(fd, c.Path)
		if err != nil {
			return "", err
		}
		if !ok {
			return ConflictBelow, nil
		}
	}
	return "", nil
}

// subtreeSeen reports whether every entry below W's directory dirfd (at
// rel) is in the agent's view, unchanged.
func (s *Stager) subtreeSeen(dirfd int, rel string) (bool, error) {
	ok := true
	err := dirNames(dirfd, func(names []string) error {
		for _, n := range names {
			p := joinRel(rel, n)
			st, there, err := lstatAt(dirfd, n)
			if err != nil {
				return pathErr("stat", "work", p, err)
			}
			if !there {
				continue
			}
			exp, had := s.seen[p]
			if !had || !stampOf(&st).sameEntry(exp) {
				ok = false
				return errStop
			}
			if typeOf(st.Mode) == TypeDir {
				fd, err := openat2(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					return pathErr("open", "work", p, err)
				}
				sub, err := s.subtreeSeen(fd, p)
				unix.Close(fd)
				if err != nil {
					return err
				}
				if !sub {
					ok = false
					return errStop
				}
			}
		}
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	return ok, err
}

var errStop = errors.New("stop")

// conflictAncestor reports whether a proper ancestor of path is in
// conflict in this commit.
func (p *preparer) conflictAncestor(path string) bool {
	for i := len(path) - 1; i > 0; i-- {
		if path[i] == '/' && p.conflicts[path[:i]] {
			return true
		}
	}
	return false
}

// conflict reports c as a conflict and keeps the agent's version.
func (p *preparer) conflict(c Change, reason string) error {
	p.conflicts[c.Path] = true
	cf, err := p.s.preserve(c, reason)
	if err != nil {
		return err
	}
	p.res.Conflicts = append(p.res.Conflicts, cf)
	return nil
}

// preserve keeps the agent's version of c under the run's conflicts
// directory and appends c to the run's report. A change already kept
// with the same digest is not copied again. What cannot be kept (no
// space, a name clash in the conflicts tree) is said in the reason; the
// change then stays staged.
func (s *Stager) preserve(c Change, reason string) (Conflict, error) {
	cf := Conflict{Path: c.Path, Op: c.Op, Reason: reason}
	if kept, ok := s.preserved[c.Path]; ok && kept.digest == c.Digest {
		cf.Kept = kept.at
		return cf, nil
	}
	run := filepath.Join(s.l.Conflicts, s.runID)
	if err := os.MkdirAll(filepath.Join(run, "files"), 0o700); err != nil {
		return cf, fmt.Errorf("staging: conflicts: %w", err)
	}
	_ = os.Chmod(s.l.Conflicts, 0o711)
	for _, d := range []string{run, filepath.Join(run, "files")} {
		_ = os.Chown(d, int(s.owner.UID), int(s.owner.GID))
	}
	kept, err := s.keepAgentVersion(filepath.Join(run, "files"), c)
	if err != nil {
		cf.Reason += " (the agent's version could not be kept: " + err.Error() + "; it stays staged)"
	} else if kept {
		cf.Kept = filepath.Join(run, "files", c.Path)
	}
	label := "label=none"
	if lb, ok := s.labels.Get(c.Path); ok {
		// What the agent had read when it wrote this version: whoever
		// copies it into W should know (carbd does not follow it there).
		label = fmt.Sprintf("label=level:%d,integrity:%v", lb.Level, lb.Integrity)
	}
	line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\n", time.Now().UTC().Format(time.RFC3339), c.Op, strconv.Quote(c.Path), cf.Reason, label)
	f, err := os.OpenFile(filepath.Join(run, "report"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return cf, fmt.Errorf("staging: conflicts report: %w", err)
	}
	_, werr := f.WriteString(line)
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return cf, fmt.Errorf("staging: conflicts report: %w", werr)
	}
	_ = os.Chown(filepath.Join(run, "report"), int(s.owner.UID), int(s.owner.GID))
	if cf.Kept != "" || c.Type == TypeNone {
		s.preserved[c.Path] = keptVersion{digest: c.Digest, at: cf.Kept}
	}
	return cf, nil
}

// keptVersion is where a conflicting change was kept.
type keptVersion struct {
	digest [32]byte
	at     string
}

// keepAgentVersion copies U's entry at c.Path below root (the run's
// files directory), resolving every component beneath root without
// following symlinks (the agent names the paths). It reports false for
// a removal: nothing to keep.
func (s *Stager) keepAgentVersion(root string, c Change) (bool, error) {
	if c.Type == TypeNone {
		return false, nil
	}
	rfd, err := openRoot(root)
	if err != nil {
		return false, err
	}
	defer unix.Close(rfd)
	dir, name := splitRel(c.Path)
	pfd, err := mkdirBeneath(rfd, dir, s.owner)
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	if err := removeAt(pfd, name); err != nil {
		return false, err
	}
	switch c.Type {
	case TypeDir:
		if err := unix.Mkdirat(pfd, name, uint32(c.Mode.Perm())|0o700); err != nil {
			return false, err
		}
		return true, unix.Fchownat(pfd, name, int(s.owner.UID), int(s.owner.GID), unix.AT_SYMLINK_NOFOLLOW)
	case TypeSymlink:
		if err := unix.Symlinkat(c.Target, pfd, name); err != nil {
			return false, err
		}
		return true, unix.Fchownat(pfd, name, int(s.owner.UID), int(s.owner.GID), unix.AT_SYMLINK_NOFOLLOW)
	case TypeFile:
		ufd, err := openFile(s.ufd, c.Path)
		if err != nil {
			return false, err
		}
		defer unix.Close(ufd)
		nfd, err := openat2(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err != nil {
			return false, err
		}
		_, err = copyStream(fdWriter(nfd), nil, fdReader(ufd), s.l.MaxFileSize)
		if err == nil {
			err = unix.Fchown(nfd, int(s.owner.UID), int(s.owner.GID))
		}
		if err == nil {
			err = unix.Fchmod(nfd, uint32(c.Mode.Perm()))
		}
		if err == nil {
			err = unix.Fsync(nfd)
		}
		unix.Close(nfd)
		if err != nil {
			unix.Unlinkat(pfd, name, 0)
			return false, err
		}
		return true, nil
	}
	return false, fmt.Errorf("a %v is not kept", c.Type)
}

// mkdirBeneath opens the directory rel below root, creating missing
// components; it never follows a symlink.
func mkdirBeneath(root int, rel string, owner Owner) (int, error) {
	fd, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return fd, nil
	}
	for _, comp := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(fd, comp, 0o755); err == nil {
			_ = unix.Fchownat(fd, comp, int(owner.UID), int(owner.GID), unix.AT_SYMLINK_NOFOLLOW)
		} else if !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, err
		}
		next, err := openat2(fd, comp, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// Finish ends the run: every staged change for which keep returns true
// (released but not committed) is kept in the run's conflicts directory
// and reported; everything else still staged (refused, or undecided when
// the run ended) is discarded with its pending labels; and the layers are
// marked finished, so the next Open builds a fresh base from W as it is
// then. The merged view should be unmounted next. A run that never calls
// Finish (carbd crashed) is resumed by the next Open instead.
func (s *Stager) Finish(ctx context.Context, keep func(Change) bool) ([]Conflict, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if s.scope != nil {
		return nil, ErrScopeOpen
	}
	changes, err := s.changes(ctx)
	if err != nil {
		return nil, err
	}
	var out []Conflict
	var lost []string
	for _, c := range changes {
		if keep == nil || c.Refused != "" || !keep(c) {
			continue
		}
		if k, ok := s.preserved[c.Path]; ok && k.digest == c.Digest {
			continue
		}
		cf, err := s.preserve(c, ConflictEnded)
		if err != nil {
			return out, err
		}
		out = append(out, cf)
		if cf.Kept == "" && c.Type != TypeNone {
			lost = append(lost, strconv.Quote(c.Path))
		}
	}
	if len(lost) > 0 {
		// Not finished: the next Open resumes these layers, so the
		// released changes stay staged rather than being discarded.
		return out, fmt.Errorf("staging: finish: the agent's version of %s could not be kept; the run's layers are kept", strings.Join(lost, ", "))
	}
	s.labels.clearPending()
	if err := s.compactPending(); err != nil {
		return out, err
	}
	if err := writeFileSync(s.lfd, filepath.Base(s.l.Finished), []byte(s.runID+"\n")); err != nil {
		return out, fmt.Errorf("staging: finish: %w", err)
	}
	return out, nil
}
