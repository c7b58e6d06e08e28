package staging

import (
	"bytes"
	"errors"
	"fmt"
	"hash"
	"io"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
)

// Event is the change as a decide.Event with its content: for a write,
// the bytes that differ from W's committed version, with ContentMargin
// unchanged bytes on each side (so a value split across the edge of the
// change is still seen whole); for a created file, its whole content.
// The mode as committed is the control field "mode" (Change.Event). Each
// user.* extended attribute whose value differs from W's entry (every
// one, for a created file) is shown as a control field "xattr" naming it
// followed by a content field of that name holding its value; so for a
// chmod or setxattr of a file (no content: W's), and for a directory's
// mkdir, chmod or setxattr (attributes only).
//
// The content shown is bounded by ContentLimit, and so is the sum of the
// attribute values shown. When a bound cuts what would be shown, a
// "truncated" control field says how much was shown: a decision on that
// event has not seen every byte the change would commit, so the caller
// must not release the change on it (the daemon keeps it staged and
// reports it).
//
// The whole staged file is read to check it still has the scanned
// digest, and the content shown is taken from that read; otherwise the
// error is ErrChanged and the caller rescans.
func (s *Stager) Event(c Change) (decide.Event, error) {
	ev := c.Event()
	if c.Refused != "" {
		return ev, nil
	}
	switch {
	case c.Type == TypeDir && (c.Op == OpMkdir || c.Op == OpChmod || c.Op == OpXattr):
		if err := s.lock(); err != nil {
			return ev, err
		}
		defer s.mu.Unlock()
		return s.dirEvent(c, ev)
	case c.Type != TypeFile || (c.Op != OpCreate && c.Op != OpWrite && c.Op != OpXattr && c.Op != OpChmod):
		return ev, nil
	}
	if err := s.lock(); err != nil {
		return ev, err
	}
	defer s.mu.Unlock()
	ufd, xs, st, err := s.openStaged(c)
	if err != nil {
		return ev, err
	}
	defer unix.Close(ufd)
	h := newDigest(TypeFile, st.Mode, xs, "")
	size := st.Size
	limit := int64(s.l.ContentLimit)
	start, end := int64(0), size
	var wxs []xattr
	if c.Op != OpCreate {
		if wpar, name, err := parentOf(s.wfd, c.Path); err == nil {
			wfd, err := openFile(wpar, name)
			unix.Close(wpar)
			if err == nil {
				wxs, err = listXattrs(wfd, userXattrs, nil)
				if err == nil && c.Op == OpWrite {
					start, end, err = changedRegion(ufd, wfd, size, int64(s.l.ContentMargin))
				}
				unix.Close(wfd)
				if err != nil {
					return ev, fmt.Errorf("staging: event %q: %w", c.Path, err)
				}
			}
		}
	}
	sameContent := c.Op == OpXattr || c.Op == OpChmod
	if sameContent {
		start, end = 0, 0 // W's content
	}
	ev.Fields = appendXattrFields(ev.Fields, xs, wxs, limit)
	n := end - start
	if n > limit {
		ev.Fields = append(ev.Fields, decide.Field{Name: "truncated", Role: decide.RoleControl,
			Value: fmt.Sprintf("%d of %d changed bytes at offset %d", limit, n, start)})
		n = limit
	}
	// The digest over the whole staged file, and the bytes shown taken
	// from the same read: what the event shows is part of what was
	// hashed, so a decision on it is a decision on the entry with that
	// digest, even if the file changes while it is read (a store through
	// a shared mapping moves no timestamp once its page is dirty).
	if _, err := unix.Seek(ufd, 0, io.SeekStart); err != nil {
		return ev, err
	}
	rw := &regionWriter{buf: make([]byte, n), start: start}
	if _, err := copyStream(rw, h, fdReader(ufd), s.l.MaxFileSize); err != nil {
		return ev, fmt.Errorf("staging: event %q: %w", c.Path, err)
	}
	if sum(h) != c.Digest || rw.got != n {
		return ev, fmt.Errorf("%w: %q", ErrChanged, c.Path)
	}
	if sameContent {
		return ev, nil
	}
	buf := rw.buf
	ev.Content = string(buf)
	ev.Fields = append(ev.Fields, decide.Field{Name: "data", Role: decide.RoleContent, Value: ev.Content})
	return ev, nil
}

// dirEvent adds to a directory's event the user.* attributes that differ
// from W's directory (every one, for a new directory), after checking
// the staged directory still has the scanned digest.
func (s *Stager) dirEvent(c Change, ev decide.Event) (decide.Event, error) {
	if err := checkRel(c.Path); err != nil {
		return ev, err
	}
	ufd, err := openDir(s.ufd, c.Path)
	if err != nil {
		return ev, fmt.Errorf("%w: %q: %v", ErrChanged, c.Path, err)
	}
	defer unix.Close(ufd)
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil {
		return ev, fmt.Errorf("staging: event %q: %w", c.Path, err)
	}
	xs, err := listXattrs(ufd, userXattrs, nil)
	if err != nil {
		return ev, fmt.Errorf("staging: event %q: %w", c.Path, err)
	}
	if sum(newDigest(TypeDir, st.Mode, xs, "")) != c.Digest {
		return ev, fmt.Errorf("%w: %q", ErrChanged, c.Path)
	}
	var wxs []xattr
	if c.Op != OpMkdir {
		// W's directory gone or replaced: every attribute is shown (the
		// commit reports the conflict).
		if wfd, err := openDir(s.wfd, c.Path); err == nil {
			wxs, err = listXattrs(wfd, userXattrs, nil)
			unix.Close(wfd)
			if err != nil {
				return ev, fmt.Errorf("staging: event %q: %w", c.Path, err)
			}
		}
	}
	ev.Fields = appendXattrFields(ev.Fields, xs, wxs, int64(s.l.ContentLimit))
	return ev, nil
}

// appendXattrFields appends to fs the user.* attributes of xs whose value
// differs from (or is missing in) was: a control field "xattr" with the
// name, then a content field of that name with the value, while the
// values shown add up to at most limit bytes; past that, a "truncated"
// control field says what was not shown.
func appendXattrFields(fs []decide.Field, xs, was []xattr, limit int64) []decide.Field {
	old := make(map[string][]byte, len(was))
	for _, x := range was {
		old[x.Name] = x.Value
	}
	var shown, skipped int64
	nskipped := 0
	for _, x := range xs {
		if v, ok := old[x.Name]; ok && bytes.Equal(v, x.Value) {
			continue
		}
		if shown+int64(len(x.Value)) > limit {
			skipped += int64(len(x.Value))
			nskipped++
			continue
		}
		shown += int64(len(x.Value))
		fs = append(fs, decide.Field{Name: "xattr", Role: decide.RoleControl, Value: x.Name},
			decide.Field{Name: x.Name, Role: decide.RoleContent, Value: string(x.Value)})
	}
	if nskipped > 0 {
		fs = append(fs, decide.Field{Name: "truncated", Role: decide.RoleControl,
			Value: fmt.Sprintf("%d user.* attribute values (%d bytes) not shown: over the bound of %d bytes", nskipped, skipped, limit)})
	}
	return fs
}

// regionWriter keeps the bytes of the stream it is written that fall in
// [start, start+len(buf)).
type regionWriter struct {
	buf   []byte
	start int64
	off   int64 // stream offset of the next byte written
	got   int64 // bytes of the region kept
}

func (w *regionWriter) Write(p []byte) (int, error) {
	end := w.start + int64(len(w.buf))
	lo, hi := max(w.off, w.start), min(w.off+int64(len(p)), end)
	if lo < hi {
		w.got += int64(copy(w.buf[lo-w.start:hi-w.start], p[lo-w.off:hi-w.off]))
	}
	w.off += int64(len(p))
	return len(p), nil
}

func (s *Stager) openStaged(c Change) (int, []xattr, *unix.Stat_t, error) {
	if err := checkRel(c.Path); err != nil {
		return -1, nil, nil, err
	}
	ufd, err := openFile(s.ufd, c.Path)
	if err != nil {
		return -1, nil, nil, fmt.Errorf("%w: %q: %v", ErrChanged, c.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(ufd, &st); err != nil || typeOf(st.Mode) != TypeFile {
		unix.Close(ufd)
		return -1, nil, nil, fmt.Errorf("%w: %q is not a regular file", ErrChanged, c.Path)
	}
	xs, err := listXattrs(ufd, userXattrs, nil)
	if err != nil {
		unix.Close(ufd)
		return -1, nil, nil, err
	}
	return ufd, xs, &st, nil
}

// OpenStaged opens the staged content of a created or written file for
// a full scan (e.g. for sensitive values beyond Event's bound). Reading
// to the end fails with ErrChanged if the content is not the scanned
// one. The caller closes it.
func (s *Stager) OpenStaged(c Change) (io.ReadCloser, error) {
	if c.Type != TypeFile || c.Refused != "" {
		return nil, fmt.Errorf("staging: %v has no staged content", c)
	}
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	ufd, xs, st, err := s.openStaged(c)
	if err != nil {
		return nil, err
	}
	return &stagedReader{fd: ufd, h: newDigest(TypeFile, st.Mode, xs, ""), want: c.Digest, path: c.Path}, nil
}

type stagedReader struct {
	fd   int
	h    hash.Hash
	want [32]byte
	path string
}

func (r *stagedReader) Read(p []byte) (int, error) {
	n, err := fdReader(r.fd).Read(p)
	r.h.Write(p[:n])
	if err == io.EOF && sum(r.h) != r.want {
		return n, fmt.Errorf("%w: %q", ErrChanged, r.path)
	}
	return n, err
}

func (r *stagedReader) Close() error {
	if r.fd < 0 {
		return errors.New("staging: staged reader already closed")
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// changedRegion returns the region [start, end) of the staged file u
// (of size usize) that differs from the committed file w, widened by
// margin bytes on each side. It compares a common prefix forwards and a
// common suffix backwards, in bounded memory.
func changedRegion(u, w int, usize, margin int64) (int64, int64, error) {
	var wst unix.Stat_t
	if err := unix.Fstat(w, &wst); err != nil {
		return 0, 0, err
	}
	wsize := wst.Size
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	ub := (*bp)[:len(*bp)/2]
	wb := (*bp)[len(*bp)/2:]
	common := min(usize, wsize)
	// Common prefix.
	var pre int64
	for pre < common {
		k := min(int64(len(ub)), common-pre)
		if _, err := unix.Pread(u, ub[:k], pre); err != nil {
			return 0, 0, err
		}
		if _, err := unix.Pread(w, wb[:k], pre); err != nil {
			return 0, 0, err
		}
		i := 0
		for i < int(k) && ub[i] == wb[i] {
			i++
		}
		pre += int64(i)
		if i < int(k) {
			break
		}
	}
	// Common suffix, not overlapping the prefix.
	var suf int64
	for suf < common-pre {
		k := min(int64(len(ub)), common-pre-suf)
		if _, err := unix.Pread(u, ub[:k], usize-suf-k); err != nil {
			return 0, 0, err
		}
		if _, err := unix.Pread(w, wb[:k], wsize-suf-k); err != nil {
			return 0, 0, err
		}
		i := 0
		for i < int(k) && ub[int(k)-1-i] == wb[int(k)-1-i] {
			i++
		}
		suf += int64(i)
		if i < int(k) {
			break
		}
	}
	start := max(0, pre-margin)
	end := min(usize, usize-suf+margin)
	if end < start {
		end = start
	}
	return start, end, nil
}
