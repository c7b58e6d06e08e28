package daemon

import (
	"bytes"
	"io"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/staging"
)

// maxImage bounds the image the file channel keeps of one file.
const maxImage = 1 << 20

// fileImages is what the file channel knows a file's content to be from
// its write records alone: per path created empty or truncated to empty
// in this run (O_CREAT|O_EXCL, O_TRUNC, creat, truncate to 0), the
// content its writes produced, built from writes whose bytes were
// captured whole at the system call. Every byte of an image is a byte a
// decided write showed. When the staged file holds exactly its image
// (the staging layer's read of it, checked against the scanned digest),
// the file's content is what those decisions saw, and the label they
// gave the location covers it (decide.Event.WrittenAsDecided).
//
// An image is dropped by anything else that changes the file: a write
// whose content was not captured whole, a copy into it, a truncate to a
// non-zero size, a fallocate, a rename or link onto it or from it, a
// removal, or an image grown past maxImage; a later truncation to empty
// starts a new one (none of those leaves anything behind that could
// change the file afterwards). A writable shared mapping of the file
// leaves one that can: the path, and where a rename takes it, never has
// an image again in this run, nor does any path once records were lost
// or malformed (a lost record may be such a mapping, or a write).
type fileImages struct {
	img map[string][]byte // path -> its image
	bad map[string]bool   // paths never imaged again in this run
	off bool              // records were lost: no image any more
}

// note follows one record. fc.mu is held.
func (fi *fileImages) note(r *fileev.Record) {
	if fi.off {
		return
	}
	if r.Kind == fileev.KindLoss || (r.Kind == fileev.KindSyscall && r.Malformed != "") {
		fi.off, fi.img, fi.bad = true, nil, nil
		return
	}
	if r.Kind != fileev.KindSyscall || r.Ret < 0 {
		return
	}
	switch r.Op {
	case fileev.OpOpen:
		acc := r.Flags & unix.O_ACCMODE
		switch {
		case !r.InRoot || acc == unix.O_RDONLY || r.Flags&unix.O_TMPFILE == unix.O_TMPFILE:
		case r.Flags&unix.O_TRUNC != 0, r.Flags&(unix.O_CREAT|unix.O_EXCL) == unix.O_CREAT|unix.O_EXCL:
			fi.start(r.Path)
		}
	case fileev.OpWrite:
		if !r.InRoot || r.Ret == 0 {
			return
		}
		b, ok := fi.img[r.Path]
		if !ok {
			return
		}
		end := r.Offset + int64(len(r.Content))
		if !r.ContentCaptured || r.ContentTruncated || r.ContentErr != "" || int64(len(r.Content)) != r.Ret ||
			r.Offset < 0 || end > maxImage {
			delete(fi.img, r.Path)
			return
		}
		if end > int64(len(b)) {
			b = append(b, make([]byte, end-int64(len(b)))...)
		}
		copy(b[r.Offset:], r.Content)
		fi.img[r.Path] = b
	case fileev.OpTruncate:
		if r.InRoot {
			if r.Length == 0 {
				fi.start(r.Path)
			} else {
				delete(fi.img, r.Path)
			}
		}
	case fileev.OpFallocate:
		if r.InRoot {
			delete(fi.img, r.Path)
		}
	case fileev.OpCopy:
		if r.InRoot2 {
			delete(fi.img, r.Path2)
		}
	case fileev.OpMmap:
		const protWrite, mapShared = 0x2, 0x1
		if r.InRoot && r.Mode&protWrite != 0 && r.Flags&mapShared != 0 {
			delete(fi.img, r.Path)
			fi.mark(r.Path)
		}
	case fileev.OpUnlink, fileev.OpRmdir:
		if r.InRoot {
			fi.drop(r.Path)
		}
	case fileev.OpRename, fileev.OpLink:
		// The names involved hold other content now, or share it with
		// another name: no image for either. What could still change
		// the content (a mapping) goes with it.
		if r.InRoot {
			fi.drop(r.Path)
		}
		if r.InRoot2 {
			fi.drop(r.Path2)
		}
		switch {
		case !r.InRoot2:
		case !r.InRoot:
			fi.mark(r.Path2) // from outside M: its mappings are not known
		default:
			bad := keysUnder(fi.bad, r.Path)
			if r.Op == fileev.OpRename && r.Flags&renameExchange != 0 {
				for _, p := range keysUnder(fi.bad, r.Path2) {
					fi.mark(r.Path + p[len(r.Path2):])
				}
			}
			for _, p := range bad {
				fi.mark(r.Path2 + p[len(r.Path):])
			}
		}
	}
}

func (fi *fileImages) start(path string) {
	if fi.bad[path] {
		return
	}
	if fi.img == nil {
		fi.img = map[string][]byte{}
	}
	fi.img[path] = fi.img[path][:0]
}

func (fi *fileImages) mark(path string) {
	if fi.bad == nil {
		fi.bad = map[string]bool{}
	}
	fi.bad[path] = true
}

// drop forgets the images at and below path.
func (fi *fileImages) drop(path string) {
	for _, p := range keysUnder(fi.img, path) {
		delete(fi.img, p)
	}
}

// keysUnder returns the keys of m at or below path.
func keysUnder[V any](m map[string]V, path string) []string {
	var out []string
	for p := range m {
		if p == path || strings.HasPrefix(p, path+"/") {
			out = append(out, p)
		}
	}
	return out
}

// imageOf returns a copy of the image of the staged change c's path,
// if it has one of c's size: a created or written file. fc.mu is held.
func (fi *fileImages) imageOf(c staging.Change) ([]byte, bool) {
	if fi.off || c.Type != staging.TypeFile || (c.Op != staging.OpCreate && c.Op != staging.OpWrite) || fi.bad[c.Path] {
		return nil, false
	}
	b, ok := fi.img[c.Path]
	if !ok || int64(len(b)) != c.Size {
		return nil, false
	}
	return bytes.Clone(b), true
}

// holdsExactly reports whether the staged change c holds img, whole:
// its staged file, read to the end with the scanned digest checked
// (Stager.OpenStaged: the entry the staging decision saw), is img, and
// it has one link (no other name can change its content).
func holdsExactly(st *staging.Stager, c staging.Change, img []byte) bool {
	if !singleLink(st.Layout().Upper, c.Path) {
		return false
	}
	r, err := st.OpenStaged(c)
	if err != nil {
		return false
	}
	defer r.Close()
	got, err := io.ReadAll(io.LimitReader(r, int64(len(img))+1))
	if err != nil || !bytes.Equal(got, img) {
		return false
	}
	// At the end: the reader checks the digest there.
	_, err = r.Read(make([]byte, 1))
	return err == io.EOF
}

// singleLink reports whether the staged file at rel below the upper
// layer upper has one link (no other name can change its content).
func singleLink(upper, rel string) bool {
	dfd, err := unix.Open(upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1
}
