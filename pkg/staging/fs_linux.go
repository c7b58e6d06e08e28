package staging

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Every operation on W, U, B and M resolves paths with openat2 relative
// to a directory fd of the layer: never below a symlink, never through a
// magic link, never across a mount, never above the layer's root.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// openat2 opens path beneath dirfd ("." is dirfd itself).
func openat2(dirfd int, path string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Mode: uint64(mode), Resolve: resolveFlags}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, path, &how)
		if (err == unix.EAGAIN || err == unix.EINTR) && i < 100 {
			continue // a concurrent rename raced the lookup
		}
		return fd, err
	}
}

// errNotRegular: the entry is not a regular file (any more).
var errNotRegular = errors.New("not a regular file")

// openFile opens a regular file beneath dirfd for reading without ever
// opening anything else: the agent may swap a staged file for a device
// node at any moment, and opening a device (a tape, a tty) can act. The
// entry is first opened O_PATH (which opens nothing), checked to be a
// regular file, then reopened through /proc/self/fd, which yields the
// same inode whatever the name points to by then.
func openFile(dirfd int, path string) (int, error) {
	pfd, err := openat2(dirfd, path, unix.O_PATH, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, errNotRegular
	}
	for {
		fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// openDir opens the directory rel ("" is dirfd itself) beneath dirfd.
func openDir(dirfd int, rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	return openat2(dirfd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// openRoot opens an absolute directory path to serve as a layer root.
func openRoot(p string) (int, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

// lstatAt stats name (one component) in dirfd without following it.
// ok is false when it does not exist.
func lstatAt(dirfd int, name string) (st unix.Stat_t, ok bool, err error) {
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil:
		return st, true, nil
	case errors.Is(err, unix.ENOENT):
		return st, false, nil
	}
	return st, false, err
}

// typeOf classifies st_mode.
func typeOf(mode uint32) Type {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return TypeFile
	case unix.S_IFDIR:
		return TypeDir
	case unix.S_IFLNK:
		return TypeSymlink
	}
	return TypeSpecial
}

func isWhiteoutStat(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// readlinkAt reads a symlink's target.
func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= 1<<16 {
			return "", unix.ENAMETOOLONG
		}
		buf = make([]byte, 2*len(buf))
	}
}

// dirNames streams the names of the directory dirfd in batches. It reads
// through a duplicate, so dirfd stays usable.
func dirNames(dirfd int, fn func(names []string) error) error {
	fd, err := openat2(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	for {
		names, err := f.Readdirnames(512)
		if len(names) > 0 {
			if err := fn(names); err != nil {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// removeAt removes name in dirfd and, if it is a directory, everything
// below it. Symlinks are removed, never followed. A missing name is not
// an error.
func removeAt(dirfd int, name string) error {
	st, ok, err := lstatAt(dirfd, name)
	if err != nil || !ok {
		return err
	}
	if typeOf(st.Mode) != TypeDir {
		err := unix.Unlinkat(dirfd, name, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	for attempt := 0; ; attempt++ {
		fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) {
				return nil
			}
			return err
		}
		err = dirNames(fd, func(names []string) error {
			for _, n := range names {
				if err := removeAt(fd, n); err != nil {
					return err
				}
			}
			return nil
		})
		unix.Close(fd)
		if err != nil {
			return err
		}
		err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) || attempt > 3 {
			return err
		}
	}
}

// parentOf opens the parent directory of rel beneath root and returns
// its fd and rel's last component. The caller closes the fd.
func parentOf(root int, rel string) (int, string, error) {
	dir, name := splitRel(rel)
	fd, err := openDir(root, dir)
	return fd, name, err
}

// crossesSymlink reports whether the relative directory path dir has a
// symlink among its components (looked at, never followed).
func crossesSymlink(root int, dir string) bool {
	if dir == "" {
		return false
	}
	fd, err := openDir(root, "")
	if err != nil {
		return false
	}
	defer func() { unix.Close(fd) }()
	for _, c := range strings.Split(dir, "/") {
		st, ok, err := lstatAt(fd, c)
		if err != nil || !ok {
			return false
		}
		switch typeOf(st.Mode) {
		case TypeSymlink:
			return true
		case TypeDir:
		default:
			return false
		}
		next, err := openat2(fd, c, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return errors.Is(err, unix.EXDEV)
		}
		unix.Close(fd)
		fd = next
	}
	return false
}

// listXattrs returns the extended attributes of an open file whose
// names start with one of the prefixes, sorted by name. When all is
// non-nil it also receives every attribute name present.
func listXattrs(fd int, prefixes []string, all *[]string) ([]xattr, error) {
	size, err := unix.Flistxattr(fd, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	if size == 0 {
		return nil, nil
	}
	buf := make([]byte, size+256)
	size, err = unix.Flistxattr(fd, buf)
	if err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	var xs []xattr
	for _, n := range bytes.Split(buf[:size], []byte{0}) {
		if len(n) == 0 {
			continue
		}
		name := string(n)
		if all != nil {
			*all = append(*all, name)
		}
		keep := false
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				keep = true
			}
		}
		if !keep {
			continue
		}
		v, err := getXattr(fd, name)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return nil, err
		}
		xs = append(xs, xattr{Name: name, Value: v})
	}
	sortXattrs(xs)
	return xs, nil
}

func getXattr(fd int, name string) ([]byte, error) {
	size, err := unix.Fgetxattr(fd, name, nil)
	if err != nil {
		return nil, fmt.Errorf("getxattr %s: %w", name, err)
	}
	buf := make([]byte, size)
	if size == 0 {
		return buf, nil
	}
	size, err = unix.Fgetxattr(fd, name, buf)
	if err != nil {
		return nil, fmt.Errorf("getxattr %s: %w", name, err)
	}
	return buf[:size], nil
}

// userXattrs are the attributes staging carries: the user namespace
// only. security.* (capabilities, LSM labels), trusted.* (overlayfs'
// own) and system.* (ACLs) are never copied from U.
var userXattrs = []string{"user."}

// syncXattrs makes the user.* attributes of fd exactly want.
func syncXattrs(fd int, want []xattr) error {
	have, err := listXattrs(fd, userXattrs, nil)
	if err != nil {
		return err
	}
	keep := make(map[string]bool, len(want))
	for _, x := range want {
		keep[x.Name] = true
	}
	for _, x := range have {
		if !keep[x.Name] {
			if err := unix.Fremovexattr(fd, x.Name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("removexattr %s: %w", x.Name, err)
			}
		}
	}
	for _, x := range want {
		if err := unix.Fsetxattr(fd, x.Name, x.Value, 0); err != nil {
			return fmt.Errorf("setxattr %s: %w", x.Name, err)
		}
	}
	return nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// copyStream copies src to dst (if dst is non-nil) and into h, with a
// pooled buffer: memory stays bounded whatever the file size. It stops
// with an error after limit bytes.
func copyStream(dst, h io.Writer, src io.Reader, limit int64) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n += int64(k)
			if n > limit {
				return n, errTooLarge
			}
			if h != nil {
				h.Write(buf[:k])
			}
			if dst != nil {
				if _, werr := dst.Write(buf[:k]); werr != nil {
					return n, werr
				}
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

var errTooLarge = errors.New("staging: " + ReasonTooLarge)

// fdReader reads a raw fd without taking ownership of it.
type fdReader int

func (r fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(p) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

// fdWriter writes a raw fd without taking ownership of it.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		n, err := unix.Write(int(w), p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		total += n
		p = p[n:]
	}
	return total, nil
}

// pathErr names the layer and the relative path in an error.
func pathErr(op, layer, rel string, err error) error {
	if rel == "" {
		rel = "."
	}
	return fmt.Errorf("%s %s %q: %w", op, layer, rel, err)
}
