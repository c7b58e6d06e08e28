package staging

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"

	"github.com/carbd/carbd/pkg/decide"
	"golang.org/x/sys/unix"
)

// SourceLabel returns, for a staged regular file, the label of the
// labelled content of B it holds byte for byte at another path: a rename,
// a link or an exchange of a labelled file that file tracing did not see
// (an io_uring operation, say) moved that content to c.Path, and its
// label must not be forgotten there. from is such a path (the first in
// order); the label joins every one. The label is the one B's content
// had when the run opened: a commit may have removed the old path, and
// its label, since.
//
// The overlay's own record of a copy-up (trusted.overlay.origin) cannot
// serve: B is a hard-link farm of W, and overlayfs with index=off sets
// no origin on the copy-up of a file with several links. Content is
// compared instead, so a file that happens to hold exactly a labelled
// file's bytes joins its label too (the conservative direction). Empty
// files carry nothing and are not compared.
//
// ok is false when no labelled path of B but c.Path holds the same
// content. An error means the content could not be compared: the caller
// fails closed.
func (s *Stager) SourceLabel(c Change) (from string, l decide.Label, ok bool, err error) {
	if c.Type != TypeFile || c.Refused != "" || c.Size <= 0 {
		return "", decide.Label{}, false, nil
	}
	cands, err := s.labelledOfSize(c.Size)
	if err != nil {
		return "", decide.Label{}, false, fmt.Errorf("staging: source of %q: %w", c.Path, err)
	}
	if len(cands) == 0 || len(cands) == 1 && cands[0] == c.Path {
		return "", decide.Label{}, false, nil
	}
	staged, err := contentSum(s.ufd, c.Path, s.l.MaxFileSize)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, errNotRegular) {
		// Gone or replaced since the scan: the commit's digest check
		// refuses what changed.
		return "", decide.Label{}, false, nil
	}
	if err != nil {
		return "", decide.Label{}, false, fmt.Errorf("staging: source of %q: %w", c.Path, err)
	}
	for _, p := range cands {
		if p == c.Path {
			continue // its own base content: its path's label covers it
		}
		base, err := s.baseSum(p)
		if err != nil {
			return "", decide.Label{}, false, fmt.Errorf("staging: source of %q: %w", c.Path, err)
		}
		if base != staged {
			continue
		}
		bl, _ := s.labels.baseLabel(p)
		if !ok {
			from, l, ok = p, bl, true
			continue
		}
		l = l.Combine(bl)
	}
	return from, l, ok, nil
}

// contentSum is the SHA-256 of the regular file path beneath dirfd.
func contentSum(dirfd int, path string, limit int64) ([32]byte, error) {
	fd, err := openFile(dirfd, path)
	if err != nil {
		return [32]byte{}, err
	}
	defer unix.Close(fd)
	h := sha256.New()
	if _, err := copyStream(nil, h, fdReader(fd), limit); err != nil {
		return [32]byte{}, err
	}
	return sum(h), nil
}

// labelledOfSize returns the labelled regular files of B of size n, in
// order. Their sizes are read on first use (B is frozen for the run, and
// only the labels Open loaded describe it).
func (s *Stager) labelledOfSize(n int64) ([]string, error) {
	lb := s.labels
	lb.sourceMu.Lock()
	defer lb.sourceMu.Unlock()
	if lb.bySize == nil {
		m := map[int64][]string{}
		for p, e := range lb.base {
			if !e.HasLabel {
				continue
			}
			fd, err := openat2(s.bfd, p, unix.O_PATH, 0)
			switch {
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
				continue // not in B: a label of a path W no longer has
			case err != nil:
				return nil, fmt.Errorf("base %q: %w", p, err)
			}
			var st unix.Stat_t
			err = unix.Fstat(fd, &st)
			unix.Close(fd)
			if err != nil {
				return nil, fmt.Errorf("base %q: %w", p, err)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > 0 {
				m[st.Size] = append(m[st.Size], p)
			}
		}
		for _, ps := range m {
			sort.Strings(ps)
		}
		lb.bySize, lb.baseSums = m, map[string][32]byte{}
	}
	return lb.bySize[n], nil
}

// baseSum is the SHA-256 of the content of path in B, computed once.
func (s *Stager) baseSum(path string) ([32]byte, error) {
	lb := s.labels
	lb.sourceMu.Lock()
	d, ok := lb.baseSums[path]
	lb.sourceMu.Unlock()
	if ok {
		return d, nil
	}
	d, err := contentSum(s.bfd, path, s.l.MaxFileSize)
	if err != nil {
		return d, fmt.Errorf("base %q: %w", path, err)
	}
	lb.sourceMu.Lock()
	lb.baseSums[path] = d
	lb.sourceMu.Unlock()
	return d, nil
}
