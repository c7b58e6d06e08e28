package staging

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// abort reverts changes (nil: every staged change) through the merged
// view: each path of M is made equal to W's committed entry. Overlayfs
// sees only its own writes, and the guest sees the reverted state at
// once. The reverted entries stay in U as copies of W's; Scan compares
// them with W and reports nothing.
func (s *Stager) abort(ctx context.Context, changes []Change) (*Result, error) {
	ok, err := Mounted(s.l)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w at %s", ErrNotMounted, s.l.Merged)
	}
	mfd, err := openRoot(s.l.Merged)
	if err != nil {
		return nil, fmt.Errorf("staging: abort: %w", err)
	}
	defer unix.Close(mfd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(mfd, &sfs); err != nil || sfs.Type != unix.OVERLAYFS_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: %s is not an overlay", ErrNotMounted, s.l.Merged)
	}
	if changes == nil {
		if changes, err = s.changes(ctx); err != nil {
			return nil, err
		}
	} else {
		changes = slices.Clone(changes)
	}
	slices.SortStableFunc(changes, func(a, b Change) int {
		switch {
		case pathLess(a.Path, b.Path):
			return -1
		case pathLess(b.Path, a.Path):
			return 1
		}
		return 0
	})
	res := &Result{}
	var restored string // the last subtree restored as a whole
	for i, c := range changes {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if err := checkRel(c.Path); err != nil {
			return res, err
		}
		if i > 0 && changes[i-1].Path == c.Path {
			continue
		}
		if restored != "" && under(c.Path, restored) {
			res.Applied++
			s.labels.drop(c.Path)
			continue
		}
		whole, err := s.revert(mfd, c.Path)
		if err != nil {
			res.Refused = append(res.Refused, Refusal{Path: c.Path, Op: c.Op, Reason: "abort: " + err.Error()})
			continue
		}
		if whole {
			restored = c.Path
		}
		delete(s.stamps, c.Path)
		res.Applied++
		s.labels.drop(c.Path)
	}
	if err := s.compactPending(); err != nil {
		return res, err
	}
	return res, nil
}

// revert makes M's entry at p equal to W's: absent, the same file
// content, the same directory attributes (its entries are reverted by
// their own changes) or, when M has no directory there, a copy of W's
// whole tree. whole reports that everything below p is settled too.
func (s *Stager) revert(mfd int, p string) (whole bool, err error) {
	wt := TypeNone
	var wst unix.Stat_t
	wpar, name, err := parentOf(s.wfd, p)
	switch {
	case err == nil:
		defer unix.Close(wpar)
		var ok bool
		if wst, ok, err = lstatAt(wpar, name); err != nil {
			return false, err
		}
		if ok {
			wt = typeOf(wst.Mode)
		}
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
	default:
		return false, fmt.Errorf("work dir: %w", err)
	}
	if wt == TypeSpecial {
		wt = TypeNone // not part of B, never seen by the guest
	}
	mpar, mname, err := parentOf(mfd, p)
	if err != nil {
		if wt == TypeNone && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) {
			return false, nil
		}
		return false, fmt.Errorf("merged view: %w", err)
	}
	defer unix.Close(mpar)
	mst, mok, err := lstatAt(mpar, mname)
	if err != nil {
		return false, err
	}
	mt := TypeNone
	if mok {
		mt = typeOf(mst.Mode)
	}
	switch wt {
	case TypeNone:
		// Everything below is gone with it.
		return mt == TypeDir, removeAt(mpar, mname)
	case TypeDir:
		wd, err := openat2(wpar, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return false, err
		}
		defer unix.Close(wd)
		if mt == TypeDir {
			md, err := openat2(mpar, mname, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				return false, err
			}
			defer unix.Close(md)
			return false, copyAttrs(wd, md, &wst)
		}
		if err := removeAt(mpar, mname); err != nil {
			return false, err
		}
		return true, copyEntry(wpar, name, mpar, mname)
	default:
		if mt == TypeDir {
			if err := removeAt(mpar, mname); err != nil {
				return false, err
			}
		}
		if wt == TypeSymlink {
			if mok && mt != TypeDir {
				if err := unix.Unlinkat(mpar, mname, 0); err != nil && !errors.Is(err, unix.ENOENT) {
					return false, err
				}
			}
			return false, copyEntry(wpar, name, mpar, mname)
		}
		// A file: a complete copy under a temporary name, renamed over
		// M's entry, so the guest never sees a partial file.
		var rnd [8]byte
		rand.Read(rnd[:])
		tmp := ".carbd-abort-" + hex.EncodeToString(rnd[:])
		if err := copyEntry(wpar, name, mpar, tmp); err != nil {
			removeAt(mpar, tmp)
			return false, err
		}
		if err := unix.Renameat(mpar, tmp, mpar, mname); err != nil {
			removeAt(mpar, tmp)
			return false, err
		}
		return false, nil
	}
}

// copyEntry copies W's entry src/sname to dst/dname (which must not
// exist): files with content, directories recursively, symlinks as
// symlinks, each with mode, owner, user.* xattrs and times. Device
// nodes, FIFOs and sockets are skipped.
func copyEntry(src int, sname string, dst int, dname string) error {
	st, ok, err := lstatAt(src, sname)
	if err != nil || !ok {
		return err
	}
	switch typeOf(st.Mode) {
	case TypeSymlink:
		t, err := readlinkAt(src, sname)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(t, dst, dname); err != nil {
			return err
		}
		return unix.Fchownat(dst, dname, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
	case TypeFile:
		sfd, err := openFile(src, sname)
		if err != nil {
			return err
		}
		defer unix.Close(sfd)
		dfd, err := openat2(dst, dname, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if _, err := copyStream(fdWriter(dfd), nil, fdReader(sfd), 1<<62); err != nil {
			return err
		}
		if err := copyAttrs(sfd, dfd, &st); err != nil {
			return err
		}
		return unix.UtimesNanoAt(dst, dname, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	case TypeDir:
		if err := unix.Mkdirat(dst, dname, 0o700); err != nil {
			return err
		}
		sfd, err := openat2(src, sname, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(sfd)
		dfd, err := openat2(dst, dname, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		err = dirNames(sfd, func(names []string) error {
			for _, n := range names {
				if err := copyEntry(sfd, n, dfd, n); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		return copyAttrs(sfd, dfd, &st)
	}
	return nil
}

// copyAttrs gives dst the owner, user.* xattrs and mode of src.
func copyAttrs(src, dst int, st *unix.Stat_t) error {
	xs, err := listXattrs(src, userXattrs, nil)
	if err != nil {
		return err
	}
	if err := syncXattrs(dst, xs); err != nil {
		return err
	}
	if err := unix.Fchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return unix.Fchmod(dst, st.Mode&0o7777)
}
