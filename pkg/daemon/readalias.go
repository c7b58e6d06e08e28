package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
)

// readAliases attributes a traced read to the file it actually read.
// The tracer names a read by the path its descriptor was opened by (the
// lexical path), and the policy's sensitive and trusted sources are path
// globs: through a symlink (`ln -s certs c; cat c/key.pem`) or a hard
// link (`ln certs/key.pem k`) a sensitive file would read as another,
// public one. Each read is resolved again inside M (openat2 with
// RESOLVE_IN_ROOT, as the sandbox's own view resolves it) and checked to
// be the inode the read used; the engine then sees it under the path it
// resolves to, with the lexical path and every other known name of the
// inode as decide.FieldAlias, so its label is the join of all of them. A
// read that cannot be resolved to that inode (the link changed or went
// away in between) is marked decide.FieldUnresolved and counts as an
// unattributed read (fail closed), unless no name on the read's path is
// or was a symlink (linked): then the name was replaced (sed -i, an
// editor's or os.replace's rename over it) and the read was the lexical
// path's.
type readAliases struct {
	merged string
	base   string // B: the overlay's lower layer, frozen for the run
	root   int    // O_PATH descriptor of M's root; -1 when closed

	mu sync.Mutex // guards sensitive and linked
	// linked holds the paths of M where the run made a symlink, or
	// renamed or linked a symlink or a directory to (which may hold
	// symlinks): with the symlinks of B and of M now, where a read's
	// path may have gone through a symlink at the time of the read.
	linked map[string]bool
	// sensitive maps the inode number of each file of M a sensitive
	// source names to those names (sorted): the files found when the
	// run started, and those read since under a sensitive name. A hard
	// link made before the run (not traced) is another name of the same
	// inode. Keyed by the inode number only: reads are of files on M's
	// device (the tracer's device check), and a wrong match only joins
	// a label (the conservative direction).
	sensitive map[uint64][]string
}

// maxAliasWalk bounds how many entries the run start's walk of the
// sensitive sources visits; past it the walk stops (logged).
const maxAliasWalk = 200_000

// openReadAliases opens M's root and indexes the inodes of the files the
// policy's sensitive sources name.
func openReadAliases(merged, base string, p *decide.Policy) (*readAliases, int, bool, error) {
	fd, err := unix.Open(merged, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, false, fmt.Errorf("read aliases: open %s: %w", merged, err)
	}
	// The path the kernel gives M's files (/proc/self/fd/N), whatever
	// symlinks merged's own path goes through.
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		unix.Close(fd)
		return nil, 0, false, fmt.Errorf("read aliases: the path of %s: %w", merged, err)
	}
	ra := &readAliases{merged: real, base: base, root: fd, sensitive: map[uint64][]string{}, linked: map[string]bool{}}
	n, complete := ra.index(p)
	return ra, n, complete, nil
}

// index walks the matches of the sensitive sources' path globs in M and
// records their inodes. It reports how many files it found and whether
// the walk was complete.
func (ra *readAliases) index(p *decide.Policy) (int, bool) {
	n := 0
	complete := walkSensitive(ra.merged, p, maxAliasWalk, func(rel string) bool {
		fd, err := unix.Openat2(ra.root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV})
		if err != nil {
			return true
		}
		defer unix.Close(fd)
		// As the tracer will report it (fileev.KernelIno).
		if ino, err := fileev.KernelIno(fd); err == nil && ra.addLocked(ino, rel) {
			n++
		}
		return true
	})
	return n, complete
}

// addLocked records rel as a sensitive name of inode ino; it reports
// whether it was new. ra.mu is held or not yet shared.
func (ra *readAliases) addLocked(ino uint64, rel string) bool {
	names := ra.sensitive[ino]
	i := sort.SearchStrings(names, rel)
	if i < len(names) && names[i] == rel {
		return false
	}
	names = append(names, "")
	copy(names[i+1:], names[i:])
	names[i] = rel
	ra.sensitive[ino] = names
	return true
}

func (ra *readAliases) close() {
	if ra != nil && ra.root >= 0 {
		unix.Close(ra.root)
		ra.root = -1
	}
}

// attribute rewrites ev, the incoming event of rec (a read, an mmap'd
// read, a copy's source), to name the file read: Obj the path it
// resolves to in M, the lexical path and the inode's other sensitive
// names as FieldAlias. It returns why the read could not be attributed
// ("" when it was); then ev carries FieldUnresolved.
func (ra *readAliases) attribute(p *decide.Policy, rec *fileev.Record, ev *decide.Event) string {
	lexical := ev.Obj
	canon, ino, why := ra.resolve(lexical, rec.Ino)
	if why != "" && rec.Ino != 0 {
		at, linked := ra.mayHaveLinked(lexical)
		if !linked {
			// No symlink on the way, then or now: the name was
			// replaced or removed since; the read was of lexical.
			links := ra.addAliases(ev, rec.Ino, lexical)
			ev.Source = "file:" + lexical + " (since replaced: " + why + ")"
			if len(links) > 0 {
				ev.Source = "file:" + lexical + " (a link of " + strings.Join(links, ", ") + "; since replaced: " + why + ")"
			}
			return ""
		}
		why += "; " + at + " is or was a symlink"
	}
	if why != "" {
		ev.Fields = append(ev.Fields, decide.Field{Name: decide.FieldUnresolved, Role: decide.RoleControl, Value: why})
		ev.Source = "file:" + lexical + " (unresolved: " + why + ")"
		if rec.Ino != 0 {
			ra.addAliases(ev, rec.Ino, lexical)
		}
		return why
	}
	if canon != lexical {
		ev.Obj = canon
		ev.Fields = append(ev.Fields, decide.Field{Name: decide.FieldAlias, Role: decide.RoleTarget, Value: lexical})
		ev.Source = "file:" + canon + " (read as " + lexical + ")"
	}
	if p.SourceLabel(ev).Level > 0 {
		// Read under a sensitive name: a later read of the same inode
		// under another name (a hard link the tracer did not see made)
		// joins it.
		ra.mu.Lock()
		ra.addLocked(ino, canon)
		ra.mu.Unlock()
	}
	if links := ra.addAliases(ev, ino, lexical); len(links) > 0 {
		ev.Source = "file:" + canon + " (a link of " + strings.Join(links, ", ") + ")"
	}
	return ""
}

// mayHaveLinked reports whether rel, or a directory on its way, is a
// symlink in B (made before the run) or in M now, or is a path where
// the run made a symlink or moved a symlink or a directory to; it
// returns the first such path. It never follows a symlink.
func (ra *readAliases) mayHaveLinked(rel string) (string, bool) {
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		ra.mu.Lock()
		linked := ra.linked[p]
		ra.mu.Unlock()
		if linked {
			return p, true
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(ra.base, p), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return p, true
		}
		err := unix.Fstatat(ra.root, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return p, true
		}
	}
	return "", false
}

// note follows the run's symlinks: a symlink made, or a symlink or a
// directory renamed or linked to a new path, makes that path linked.
// A destination that cannot be looked at any more counts as linked.
func (ra *readAliases) note(rec *fileev.Record) {
	if rec.Kind != fileev.KindSyscall || rec.Ret < 0 || rec.Malformed != "" {
		return
	}
	var paths []string
	switch rec.Op {
	case fileev.OpSymlink:
		if rec.InRoot && rec.Path != "" {
			ra.mu.Lock()
			ra.linked[rec.Path] = true
			ra.mu.Unlock()
		}
		return
	case fileev.OpRename, fileev.OpLink:
		if rec.InRoot2 && rec.Path2 != "" {
			paths = append(paths, rec.Path2)
		}
		if rec.Op == fileev.OpRename && rec.Flags&renameExchange != 0 && rec.InRoot && rec.Path != "" {
			paths = append(paths, rec.Path)
		}
	default:
		return
	}
	for _, p := range paths {
		var st unix.Stat_t
		err := unix.Fstatat(ra.root, p, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK || st.Mode&unix.S_IFMT == unix.S_IFDIR {
			ra.mu.Lock()
			ra.linked[p] = true
			ra.mu.Unlock()
		}
	}
}

// addAliases adds the sensitive names of inode ino other than ev.Obj
// and lexical to ev as FieldAlias, and returns them.
func (ra *readAliases) addAliases(ev *decide.Event, ino uint64, lexical string) []string {
	ra.mu.Lock()
	names := ra.sensitive[ino]
	ra.mu.Unlock()
	var out []string
	for _, n := range names {
		if n != lexical && n != ev.Obj {
			ev.Fields = append(ev.Fields, decide.Field{Name: decide.FieldAlias, Role: decide.RoleTarget, Value: n})
			out = append(out, n)
		}
	}
	return out
}

// resolve opens rel beneath M's root as the sandbox would resolve it
// (symlinks followed, absolute ones from M's root, never out of it) and
// returns the path it resolves to, relative to M, and its inode; want,
// when not 0, is the inode the read used: another one means the name
// was changed in between.
func (ra *readAliases) resolve(rel string, want uint64) (string, uint64, string) {
	if rel == "" || rel == "." || strings.HasPrefix(rel, "/") {
		return "", 0, "no path in M"
	}
	// Most reads name a file through no symlink: one openat2 and one
	// fstat tell.
	canon := rel
	fd, err := unix.Openat2(ra.root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err == unix.ELOOP {
		// A symlink on the way: resolve it as the sandbox does.
		fd, err = unix.Openat2(ra.root, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
		canon = ""
	}
	if err != nil {
		return "", 0, fmt.Sprintf("resolve %s in M: %v", rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", 0, fmt.Sprintf("stat %s in M: %v", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return "", 0, fmt.Sprintf("%s is no regular file in M", rel)
	}
	ino := st.Ino
	if want != 0 && ino != want {
		// The tracer reports the inode number the kernel holds for the
		// open file (overlayfs's own inode), and stat may report
		// another for the same file: the upper file's after a copy-up
		// when the file has more than one link. fdinfo says what the
		// tracer saw.
		if i, err := fileev.KernelIno(fd); err == nil {
			ino = i
		}
	}
	if want != 0 && ino != want {
		return "", 0, fmt.Sprintf("%s is another file than the one read (inode %d, read %d)", rel, ino, want)
	}
	if canon == "" {
		target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		if err != nil {
			return "", 0, fmt.Sprintf("the path %s resolves to: %v", rel, err)
		}
		c, ok := strings.CutPrefix(target, ra.merged+"/")
		if !ok || c == "" || strings.HasSuffix(target, " (deleted)") {
			return "", 0, fmt.Sprintf("%s resolves to %q, not a path in M", rel, target)
		}
		canon = c
	}
	return canon, ino, ""
}
