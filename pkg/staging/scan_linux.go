package staging

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"slices"

	"golang.org/x/sys/unix"
)

// Overlayfs' private attributes in the upper layer (trusted namespace,
// since carbd mounts as root without userxattr).
const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrWhiteout = "trusted.overlay.whiteout"
	xattrRedirect = "trusted.overlay.redirect"
	xattrMetacopy = "trusted.overlay.metacopy"
)

// errUpperUnsupported: U holds entries the layout's options exclude.
var errUpperUnsupported = errors.New("staging: upper layer has redirect or metacopy entries (mounted with other options?)")

// newDigest starts the digest of a staged entry: everything that Commit
// would write for it except the content, which the caller adds.
func newDigest(t Type, rawMode uint32, xs []xattr, target string) hash.Hash {
	h := sha256.New()
	b := []byte("carbd-staging-1\x00")
	b = append(b, byte(t))
	b = binary.LittleEndian.AppendUint32(b, rawMode&0o7777)
	b = appendXattrs(b, xs)
	b = appendBytes(b, []byte(target))
	h.Write(b)
	return h
}

func sum(h hash.Hash) (d [32]byte) {
	h.Sum(d[:0])
	return d
}

// digestNone is the digest of a removal.
var digestNone = sum(newDigest(TypeNone, 0, nil, ""))

type scanner struct {
	s       *Stager
	ctx     context.Context
	fn      func(Change) error
	created map[string][]string // W directory -> names carbd created there that B lacks
}

func (s *Stager) scan(ctx context.Context, fn func(Change) error) error {
	sc := &scanner{s: s, ctx: ctx, fn: fn, created: make(map[string][]string)}
	for p, e := range s.labels.snapshot() {
		if e.Created {
			d, n := splitRel(p)
			sc.created[d] = append(sc.created[d], n)
		}
	}
	ufd, err := openDir(s.ufd, "")
	if err != nil {
		return fmt.Errorf("staging: scan: %w", err)
	}
	defer unix.Close(ufd)
	wfd, err := openDir(s.wfd, "")
	if err != nil {
		return fmt.Errorf("staging: scan: %w", err)
	}
	defer unix.Close(wfd)
	bfd, err := openDir(s.bfd, "")
	if err != nil {
		return fmt.Errorf("staging: scan: %w", err)
	}
	defer unix.Close(bfd)
	return sc.dir("", ufd, wfd, bfd, 0)
}

func (sc *scanner) emit(c Change) error {
	if c.Refused != "" {
		c.Digest = [32]byte{}
	}
	return sc.fn(c)
}

// dir scans the upper directory ufd at rel. wfd is W's directory at
// rel, or -1 when W has none there. bfd is B's directory at rel when the
// merged view shows it (no opaque directory at or above rel), else -1:
// then M's directory holds exactly U's entries.
func (sc *scanner) dir(rel string, ufd, wfd, bfd int, depth int) error {
	err := dirNames(ufd, func(names []string) error {
		for _, name := range names {
			if err := sc.ctx.Err(); err != nil {
				return err
			}
			if err := sc.entry(rel, name, ufd, wfd, bfd, depth); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return scanErr(rel, err)
	}
	if wfd < 0 {
		return nil
	}
	// Removals that leave no entry in U. Where B is hidden (an opaque
	// directory, or B has no directory here), every W entry U lacks is
	// gone. Where B shows through, an entry U and B lack is gone if
	// carbd created it (overlayfs leaves no whiteout for a purely upper
	// entry); other W entries neither layer has were added to W behind
	// carbd's back, never seen by the guest, and are left alone.
	gone := func(name string) error {
		if _, ok, err := lstatAt(ufd, name); err != nil || ok {
			return err
		}
		if bfd >= 0 {
			if _, ok, err := lstatAt(bfd, name); err != nil || ok {
				return err
			}
		}
		wst, ok, err := lstatAt(wfd, name)
		if err != nil || !ok {
			return err
		}
		t := typeOf(wst.Mode)
		if t == TypeSpecial {
			return nil // never in B, never seen by the guest
		}
		if _, seen := sc.s.seen[joinRel(rel, name)]; !seen {
			// The agent's view never had W's entry: the user made it
			// during the run, in a directory the agent made too (both
			// sides' git writing .git/objects/XX/): nothing of the
			// agent's removes it (docs/soak.md).
			return nil
		}
		return sc.emit(removal(joinRel(rel, name), t))
	}
	if bfd < 0 {
		err = dirNames(wfd, func(names []string) error {
			for _, name := range names {
				if err := gone(name); err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		for _, name := range sc.created[rel] {
			if err = gone(name); err != nil {
				break
			}
		}
	}
	return scanErr(rel, err)
}

func scanErr(rel string, err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errUpperUnsupported) {
		return err
	}
	var se *scanError
	if errors.As(err, &se) {
		return err
	}
	return &scanError{path: rel, err: err}
}

type scanError struct {
	path string
	err  error
}

func (e *scanError) Error() string {
	p := e.path
	if p == "" {
		p = "."
	}
	return fmt.Sprintf("staging: scan %q: %v", p, e.err)
}
func (e *scanError) Unwrap() error { return e.err }

func removal(p string, prev Type) Change {
	op := OpUnlink
	if prev == TypeDir {
		op = OpRmdir
	}
	return Change{Op: op, Path: p, Type: TypeNone, Prev: prev, Digest: digestNone}
}

// isWhiteout reports whether the upper entry is an overlay whiteout: a
// 0/0 character device, or an empty file marked with the whiteout xattr.
func isWhiteout(dirfd int, name string, st *unix.Stat_t) bool {
	if isWhiteoutStat(st) {
		return true
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
		return false
	}
	fd, err := openFile(dirfd, name)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	_, err = unix.Fgetxattr(fd, xattrWhiteout, nil)
	return err == nil
}

func (sc *scanner) entry(rel, name string, ufd, wfd, bfd, depth int) error {
	p := joinRel(rel, name)
	ust, ok, err := lstatAt(ufd, name)
	if err != nil || !ok {
		return err // vanished: the guest removed it meanwhile
	}
	var wst unix.Stat_t
	prev := TypeNone
	if wfd >= 0 {
		var wok bool
		if wst, wok, err = lstatAt(wfd, name); err != nil {
			return err
		}
		if wok {
			prev = typeOf(wst.Mode)
		}
	}
	if old, ok := sc.s.stamps[p]; ok && old.uIno == ust.Ino && old.uCtime == ctimeNs(&ust) && old.uSize == uint64(ust.Size) {
		// The agent has not changed this entry since it was committed:
		// whatever W holds now is the user's, not a staged change.
		return nil
	}
	if isWhiteout(ufd, name, &ust) {
		if _, seen := sc.s.seen[p]; !seen && prev != TypeNone {
			// The agent's view never had W's entry here (the user made
			// it during the run): the whiteout removes nothing of it.
			return nil
		}
		if prev != TypeNone && prev != TypeSpecial {
			return sc.emit(removal(p, prev))
		}
		if prev == TypeNone {
			// Removed in both: the agent's removal is done.
			sc.s.stamps[p] = stamp{uIno: ust.Ino, uCtime: ctimeNs(&ust), uSize: uint64(ust.Size)}
			sc.agree(p, nil)
		}
		return nil
	}
	ut := typeOf(ust.Mode)
	perm, stripped := stripMode(ust.Mode)
	if len(p) > maxPath {
		op := map[Type]Op{TypeFile: OpCreate, TypeDir: OpMkdir, TypeSymlink: OpSymlink, TypeSpecial: OpMknod}[ut]
		return sc.emit(Change{Op: op, Path: p, Type: ut, Prev: prev, Mode: perm, Refused: ReasonTooLong})
	}
	switch ut {
	case TypeFile:
		return sc.file(p, name, ufd, wfd, &ust, prev, &wst)
	case TypeDir:
		return sc.subdir(p, name, ufd, wfd, bfd, &ust, prev, &wst, depth+1)
	case TypeSymlink:
		t, err := readlinkAt(ufd, name)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
				return nil
			}
			return err
		}
		if prev == TypeSymlink {
			if wt, err := readlinkAt(wfd, name); err == nil && wt == t {
				return nil
			}
		}
		c := Change{Op: OpSymlink, Path: p, Type: TypeSymlink, Prev: prev, Mode: 0o777, Target: t,
			Digest: sum(newDigest(TypeSymlink, 0, nil, t))}
		if linkEscapes(p, t) {
			c.Refused = ReasonLinkEscape
		}
		return sc.emit(c)
	}
	return sc.emit(Change{Op: OpMknod, Path: p, Type: TypeSpecial, Prev: prev, Mode: perm, Stripped: stripped, Refused: ReasonSpecial})
}

func (sc *scanner) file(p, name string, ufd, wfd int, ust *unix.Stat_t, prev Type, wst *unix.Stat_t) error {
	if prev == TypeFile {
		// Committed and unchanged since: nothing to read.
		stp := stamp{uIno: ust.Ino, uCtime: ctimeNs(ust), uSize: uint64(ust.Size), wIno: wst.Ino, wCtime: ctimeNs(wst)}
		if old, ok := sc.s.stamps[p]; ok && old == stp {
			return nil
		}
	}
	fd, err := openFile(ufd, name)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, errNotRegular) {
			return nil // replaced meanwhile: the next scan sees it
		}
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if typeOf(st.Mode) != TypeFile {
		return nil
	}
	var names []string
	xs, err := listXattrs(fd, userXattrs, &names)
	if err != nil {
		return err
	}
	if slices.Contains(names, xattrMetacopy) {
		return fmt.Errorf("%w: %q", errUpperUnsupported, p)
	}
	perm, stripped := stripMode(st.Mode)
	c := Change{Op: OpCreate, Path: p, Type: TypeFile, Prev: prev, Mode: perm, Size: st.Size, Stripped: stripped}
	if prev == TypeFile {
		c.Op = OpWrite
	}
	if st.Size > sc.s.l.MaxFileSize {
		c.Refused = ReasonTooLarge
		return sc.emit(c)
	}
	h := newDigest(TypeFile, st.Mode, xs, "")
	if prev != TypeFile {
		if _, err := copyStream(nil, h, fdReader(fd), sc.s.l.MaxFileSize); err != nil {
			if errors.Is(err, errTooLarge) {
				c.Refused = ReasonTooLarge
				return sc.emit(c)
			}
			return err
		}
		c.Digest = sum(h)
		return sc.emit(c)
	}
	// W has a regular file here: is this a change, and of what?
	stp := stamp{uIno: st.Ino, uCtime: ctimeNs(&st), uSize: uint64(st.Size), wIno: wst.Ino, wCtime: ctimeNs(wst)}
	if old, ok := sc.s.stamps[p]; ok && old == stp {
		return nil
	}
	same := false
	var wxs []xattr
	if st.Size == wst.Size {
		wf, err := openFile(wfd, name)
		if err != nil {
			return pathErr("open", "work", p, err)
		}
		same, err = compareHash(h, fd, wf, sc.s.l.MaxFileSize)
		if err == nil && same {
			wxs, err = listXattrs(wf, userXattrs, nil)
		}
		unix.Close(wf)
		if err != nil {
			if errors.Is(err, errTooLarge) {
				c.Refused = ReasonTooLarge
				return sc.emit(c)
			}
			return err
		}
	} else if _, err := copyStream(nil, h, fdReader(fd), sc.s.l.MaxFileSize); err != nil {
		if errors.Is(err, errTooLarge) {
			c.Refused = ReasonTooLarge
			return sc.emit(c)
		}
		return err
	}
	c.Digest = sum(h)
	if !same {
		return sc.emit(c)
	}
	switch {
	case modeChanged(st.Mode, wst.Mode):
		c.Op = OpChmod
	case !equalXattrs(xs, wxs):
		c.Op = OpXattr
	default:
		sc.s.stamps[p] = stp
		sc.agree(p, wst)
		return nil
	}
	return sc.emit(c)
}

// agree records that the agent's view and W agree at p (W's entry wst,
// or absent when wst is nil), whoever made them agree: the entry W has
// now is the one a later staged change of p replaces.
func (sc *scanner) agree(p string, wst *unix.Stat_t) {
	s := sc.s
	old, had := s.seen[p]
	if wst == nil {
		if had {
			forgetBelow(s.seen, p)
			s.appendSeen(appendSeenDel(nil, p))
		}
		return
	}
	if w := stampOf(wst); !had || old != w {
		s.seen[p] = w
		s.appendSeen(appendSeenSet(nil, p, w))
	}
}

func ctimeNs(st *unix.Stat_t) uint64 {
	return uint64(st.Ctim.Sec)*1e9 + uint64(st.Ctim.Nsec)
}

// compareHash reads the upper file u to its end into h and reports
// whether the working file w has exactly the same content.
func compareHash(h hash.Hash, u, w int, limit int64) (bool, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	ub := (*bp)[:len(*bp)/2]
	wb := (*bp)[len(*bp)/2:]
	same := true
	var total int64
	for {
		n, err := io.ReadFull(fdReader(u), ub)
		total += int64(n)
		if total > limit {
			return false, errTooLarge
		}
		h.Write(ub[:n])
		if same {
			m, werr := io.ReadFull(fdReader(w), wb[:n])
			if m != n || string(ub[:n]) != string(wb[:m]) {
				same = false
			}
			if werr != nil && werr != io.EOF && werr != io.ErrUnexpectedEOF {
				return false, werr
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return false, err
		}
	}
	if same {
		// W must end where U ends.
		var one [1]byte
		if m, _ := fdReader(w).Read(one[:]); m != 0 {
			same = false
		}
	}
	return same, nil
}

func (sc *scanner) subdir(p, name string, ufd, wfd, bfd int, ust *unix.Stat_t, prev Type, wst *unix.Stat_t, depth int) error {
	cfd, err := openat2(ufd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil
		}
		return err
	}
	defer unix.Close(cfd)
	var st unix.Stat_t
	if err := unix.Fstat(cfd, &st); err != nil {
		return err
	}
	var names []string
	xs, err := listXattrs(cfd, userXattrs, &names)
	if err != nil {
		return err
	}
	if slices.Contains(names, xattrRedirect) {
		return fmt.Errorf("%w: %q", errUpperUnsupported, p)
	}
	opaque := false
	if slices.Contains(names, xattrOpaque) {
		v, err := getXattr(cfd, xattrOpaque)
		opaque = err == nil && string(v) == "y"
	}
	perm, stripped := stripMode(st.Mode)
	c := Change{Op: OpMkdir, Path: p, Type: TypeDir, Prev: prev, Mode: perm, Stripped: stripped,
		Digest: sum(newDigest(TypeDir, st.Mode, xs, ""))}
	if depth > sc.s.l.MaxDepth {
		if prev == TypeDir {
			c.Op = OpChmod
		}
		c.Refused = ReasonTooDeep
		return sc.emit(c)
	}
	if prev != TypeDir {
		if err := sc.emit(c); err != nil {
			return err
		}
		return sc.dir(p, cfd, -1, -1, depth)
	}
	cbfd := -1
	if bfd >= 0 && !opaque {
		if fd, err := openat2(bfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
			cbfd = fd
			defer unix.Close(cbfd)
		}
	}
	wcfd, err := openat2(wfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
			c.Op = OpChmod
			c.Refused = ReasonSymlinkW
			return sc.emit(c)
		}
		return pathErr("open", "work", p, err)
	}
	defer unix.Close(wcfd)
	var wxs []xattr
	if wxs, err = listXattrs(wcfd, userXattrs, nil); err != nil {
		return err
	}
	switch {
	case modeChanged(st.Mode, wst.Mode):
		c.Op = OpChmod
	case !equalXattrs(xs, wxs):
		c.Op = OpXattr
	default:
		c.Op = 0
	}
	if c.Op != 0 {
		if err := sc.emit(c); err != nil {
			return err
		}
	}
	return sc.dir(p, cfd, wcfd, cbfd, depth)
}
