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
// A rename of a file (renameat2's RENAME_NOREPLACE and RENAME_EXCHANGE
// included) within M carries its image to its new name: a rename
// changes no file's content, link count or mappings, so what proved the
// content under its old name proves it under the new one (a temporary
// file written, then renamed over its target: sed -i, Python's tempfile
// and os.replace, git's index.lock). The target's old images are
// dropped; an exchange swaps both sides'. The label the engine gives
// the new name at the rename joins the read label of that moment, which
// covers every write decided before it. The files below a renamed
// directory lose their images: the engine labels the directory's two
// names only, so a file's new name may keep a label older than its
// writes (one a removal there gave it before a secret was read).
//
// An image is dropped by anything else that changes the file: a write
// whose content was not captured whole, a copy into it, a truncate to a
// non-zero size, a fallocate, a link onto it or from it, a rename onto
// it from outside M, a removal, an abort of its staged change, or an
// image grown past maxImage; a later truncation to empty starts a new
// one (none of those leaves anything behind that could change the file
// afterwards). A writable shared mapping of the file leaves one that
// can: the path, and where a rename takes it, never has an image again
// in this run, nor does any path once records were lost or malformed (a
// lost record may be such a mapping, or a write). Each path without an
// image keeps why its last one was dropped (why), for the audit.
type fileImages struct {
	img map[string][]byte // path -> its image
	why map[string]string // path -> why it has no image (its last one dropped)
	bad map[string]string // paths never imaged again in this run -> why
	off string            // records were lost or malformed: no image any more, why
	// moved are the paths whose image came through a rename: its writes
	// were decided on another path (an operator's approval of them does
	// not cover this one: see fileChannel.cover).
	moved map[string]bool
}

// Why a file has no image, as the audit says (basis "read").
const (
	whyNotNew     = "not created or emptied in this run"
	whyUncaptured = "a write whose content was not captured whole"
	whyCut        = "a write past the capture (cut)"
	whyOverBound  = "an image past its bound (1 MiB)"
	whyCopy       = "a copy into it"
	whyTruncSize  = "a truncate to a non-zero size"
	whyFallocate  = "a fallocate"
	whyMapping    = "a writable shared mapping"
	whyLink       = "a hard link"
	whyRenamedIn  = "renamed in from outside the working directory"
	whyDirRenamed = "a directory above it was renamed"
	whyRemoved    = "removed"
	whyAborted    = "its staged change was aborted"
	whyLoss       = "file records were lost"
	whyMalformed  = "a malformed file record"
	whySize       = "its staged size differs from its image"
	whyContent    = "its staged content differs from its image"
	whyLinkCount  = "its staged file has more than one link"
	whyUnreadable = "its staged file could not be read"
	whyNotFile    = "not a file's content"
	whyNoLabel    = "no label for the location"
)

// Rename flags of renameat2.
const (
	renameNoreplace = 0x1
	renameExchange  = 0x2
	renameWhiteout  = 0x4
)

// note follows one record. fc.mu is held.
func (fi *fileImages) note(r *fileev.Record) {
	if fi.off != "" {
		return
	}
	if r.Kind == fileev.KindLoss || (r.Kind == fileev.KindSyscall && r.Malformed != "") {
		fi.off, fi.img, fi.bad, fi.why, fi.moved = whyLoss, nil, nil, nil, nil
		if r.Kind != fileev.KindLoss {
			fi.off = whyMalformed
		}
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
		switch {
		case r.ContentTruncated:
			fi.lose(r.Path, whyCut)
		case !r.ContentCaptured || r.ContentErr != "" || int64(len(r.Content)) != r.Ret || r.Offset < 0:
			fi.lose(r.Path, whyUncaptured)
		case end > maxImage:
			fi.lose(r.Path, whyOverBound)
		default:
			if end > int64(len(b)) {
				b = append(b, make([]byte, end-int64(len(b)))...)
			}
			copy(b[r.Offset:], r.Content)
			fi.img[r.Path] = b
		}
	case fileev.OpTruncate:
		if r.InRoot {
			if r.Length == 0 {
				fi.start(r.Path)
			} else {
				fi.lose(r.Path, whyTruncSize)
			}
		}
	case fileev.OpFallocate:
		if r.InRoot {
			fi.lose(r.Path, whyFallocate)
		}
	case fileev.OpCopy:
		if r.InRoot2 {
			fi.lose(r.Path2, whyCopy)
		}
	case fileev.OpMmap:
		const protWrite, mapShared = 0x2, 0x1
		if r.InRoot && r.Mode&protWrite != 0 && r.Flags&mapShared != 0 {
			fi.lose(r.Path, whyMapping)
			fi.mark(r.Path, whyMapping)
		}
	case fileev.OpUnlink, fileev.OpRmdir:
		if r.InRoot {
			fi.drop(r.Path, whyRemoved)
		}
	case fileev.OpRename:
		fi.rename(r)
	case fileev.OpLink:
		// The two names share the content now: no image for either.
		// What could still change the content (a mapping) goes with it.
		if r.InRoot {
			fi.drop(r.Path, whyLink)
		}
		if r.InRoot2 {
			fi.drop(r.Path2, whyLink)
		}
		switch {
		case !r.InRoot2:
		case !r.InRoot:
			fi.mark(r.Path2, whyRenamedIn) // from outside M: its mappings are not known
		default:
			fi.follow(keysUnder(fi.bad, r.Path), r.Path, r.Path2)
		}
	}
}

// rename follows a rename: the image of the source (and why the names
// have none, and the paths never imaged again at and below it) go to
// its new name; those at and below the target are dropped, or, for an
// exchange, go to the source's name. Images below a renamed directory
// are dropped. A rename with a flag it does not
// know, or from outside M, carries nothing (its target's images are
// dropped).
func (fi *fileImages) rename(r *fileev.Record) {
	exchange := r.Flags&renameExchange != 0
	known := r.Flags&^uint64(renameNoreplace|renameExchange|renameWhiteout) == 0
	type moved struct {
		img []byte
		has bool
		why string
	}
	take := func(root string) map[string]moved {
		out := map[string]moved{}
		for _, p := range keysUnder(fi.img, root) {
			m := out[p[len(root):]]
			m.img, m.has = fi.img[p], true
			out[p[len(root):]] = m
			delete(fi.img, p)
		}
		for _, p := range keysUnder(fi.why, root) {
			m := out[p[len(root):]]
			m.why = fi.why[p]
			out[p[len(root):]] = m
			delete(fi.why, p)
		}
		return out
	}
	var src, dst map[string]moved
	if r.InRoot {
		src = take(r.Path)
	}
	if r.InRoot2 {
		dst = take(r.Path2)
	}
	put := func(root string, from map[string]moved) {
		for rel, m := range from {
			p := root + rel
			if why, bad := fi.bad[p]; bad {
				fi.setWhy(p, why)
				continue
			}
			if rel != "" {
				// Below a renamed directory: the engine labels the
				// directory's names, not the files below, so a file's
				// new name may carry a label older than its writes.
				fi.setWhy(p, whyDirRenamed)
				continue
			}
			if m.has {
				if fi.img == nil {
					fi.img = map[string][]byte{}
				}
				fi.img[p] = m.img
				if fi.moved == nil {
					fi.moved = map[string]bool{}
				}
				fi.moved[p] = true
			} else if m.why != "" {
				fi.setWhy(p, m.why)
			}
		}
	}
	switch {
	case !r.InRoot2:
		// Moved out of M: nothing of it is staged here any more.
	case !r.InRoot:
		fi.setWhy(r.Path2, whyRenamedIn)
		fi.mark(r.Path2, whyRenamedIn) // from outside M: its mappings are not known
	case !known:
		fi.setWhy(r.Path2, "a rename with unknown flags")
		if exchange {
			fi.setWhy(r.Path, "a rename with unknown flags")
		}
	default:
		bad := keysUnder(fi.bad, r.Path)
		if exchange {
			fi.follow(keysUnder(fi.bad, r.Path2), r.Path2, r.Path)
		}
		fi.follow(bad, r.Path, r.Path2)
		put(r.Path2, src)
		if exchange {
			put(r.Path, dst)
		}
	}
}

// follow marks, for each path of bad at or below from, its place below to
// as never imaged again.
func (fi *fileImages) follow(bad []string, from, to string) {
	for _, p := range bad {
		fi.mark(to+p[len(from):], fi.bad[p])
	}
}

func (fi *fileImages) start(path string) {
	if _, bad := fi.bad[path]; bad {
		return
	}
	if fi.img == nil {
		fi.img = map[string][]byte{}
	}
	fi.img[path] = fi.img[path][:0]
	delete(fi.why, path)
	delete(fi.moved, path)
}

// lose drops path's image, if it has one, for why.
func (fi *fileImages) lose(path, why string) {
	if _, ok := fi.img[path]; ok {
		delete(fi.img, path)
		fi.setWhy(path, why)
	}
}

func (fi *fileImages) setWhy(path, why string) {
	if fi.why == nil {
		fi.why = map[string]string{}
	}
	fi.why[path] = why
}

func (fi *fileImages) mark(path, why string) {
	if fi.bad == nil {
		fi.bad = map[string]string{}
	}
	if _, ok := fi.bad[path]; !ok {
		fi.bad[path] = why
	}
}

// drop forgets the images at and below path, for why.
func (fi *fileImages) drop(path, why string) {
	for _, p := range keysUnder(fi.img, path) {
		delete(fi.img, p)
		fi.setWhy(p, why)
	}
}

// aborted forgets path's image: its staged change was aborted (the
// merged view no longer holds what the image says).
func (fi *fileImages) aborted(path string) {
	if fi.off == "" {
		fi.drop(path, whyAborted)
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
	img, why := fi.proof(c)
	return img, why == ""
}

// proof returns a copy of the image of the staged change c's path if it
// has one of c's size (a created or written file), else why not. fc.mu
// is held.
func (fi *fileImages) proof(c staging.Change) ([]byte, string) {
	if c.Type != staging.TypeFile || (c.Op != staging.OpCreate && c.Op != staging.OpWrite) {
		return nil, whyNotFile
	}
	if fi.off != "" {
		return nil, fi.off
	}
	if why, bad := fi.bad[c.Path]; bad {
		return nil, why
	}
	b, ok := fi.img[c.Path]
	switch {
	case !ok && fi.why[c.Path] != "":
		return nil, fi.why[c.Path]
	case !ok:
		return nil, whyNotNew
	case int64(len(b)) != c.Size:
		return nil, whySize
	}
	return bytes.Clone(b), ""
}

// holdsExactly reports why the staged change c does not hold img,
// whole, or "" when it does: its staged file, read to the end with the
// scanned digest checked (Stager.OpenStaged: the entry the staging
// decision saw), is img, and it has one link (no other name can change
// its content).
func holdsExactly(st *staging.Stager, c staging.Change, img []byte) string {
	if !singleLink(st.Layout().Upper, c.Path) {
		return whyLinkCount
	}
	r, err := st.OpenStaged(c)
	if err != nil {
		return whyUnreadable
	}
	defer r.Close()
	got, err := io.ReadAll(io.LimitReader(r, int64(len(img))+1))
	switch {
	case err != nil:
		return whyUnreadable
	case !bytes.Equal(got, img):
		return whyContent
	}
	// At the end: the reader checks the digest there.
	if _, err = r.Read(make([]byte, 1)); err != io.EOF {
		return whyContent
	}
	return ""
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
