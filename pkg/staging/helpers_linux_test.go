package staging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// entry is what tests compare of a file system entry.
type entry struct {
	Type   Type
	Mode   uint32 // st_mode & 07777
	Data   string // file content or symlink target
	Xattrs string // user.* xattrs, "name=value;" sorted
}

func (e entry) String() string {
	return fmt.Sprintf("%v %#o %q %s", e.Type, e.Mode, e.Data, e.Xattrs)
}

// snapshot reads the tree below root (root itself excluded).
func snapshot(t testing.TB, root string) map[string]entry {
	t.Helper()
	out := make(map[string]entry)
	var walk func(dir, rel string)
	walk = func(dir, rel string) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("snapshot %s: %v", dir, err)
		}
		for _, de := range ents {
			p := joinRel(rel, de.Name())
			full := filepath.Join(dir, de.Name())
			var st unix.Stat_t
			if err := unix.Lstat(full, &st); err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			e := entry{Type: typeOf(st.Mode), Mode: st.Mode & 0o7777}
			switch e.Type {
			case TypeFile:
				b, err := os.ReadFile(full)
				if err != nil {
					t.Fatalf("snapshot: %v", err)
				}
				e.Data = string(b)
			case TypeSymlink:
				e.Mode = 0
				tg, err := os.Readlink(full)
				if err != nil {
					t.Fatalf("snapshot: %v", err)
				}
				e.Data = tg
			}
			if e.Type == TypeFile || e.Type == TypeDir {
				e.Xattrs = userXattrString(t, full)
			}
			out[p] = e
			if e.Type == TypeDir {
				walk(full, p)
			}
		}
	}
	walk(root, "")
	return out
}

func userXattrString(t testing.TB, p string) string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	var names []string
	for _, nm := range bytes.Split(buf[:n], []byte{0}) {
		if strings.HasPrefix(string(nm), "user.") {
			names = append(names, string(nm))
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, nm := range names {
		v := make([]byte, 64<<10)
		k, err := unix.Lgetxattr(p, nm, v)
		if err != nil {
			t.Fatalf("getxattr %s %s: %v", p, nm, err)
		}
		fmt.Fprintf(&b, "%s=%s;", nm, v[:k])
	}
	return b.String()
}

// env is a mounted staging session in temporary directories.
type env struct {
	t    *testing.T
	base string
	W, S string
	M    string
	st   *Stager
	cfg  Config
}

// newEnv makes W, fills it with populate, opens and mounts the staging.
func newEnv(t *testing.T, populate func(w string), tweak func(*Config)) *env {
	t.Helper()
	testutil.RequireRoot(t)
	base := t.TempDir()
	e := &env{t: t, base: base, W: filepath.Join(base, "work"), S: filepath.Join(base, "state")}
	must(t, os.Mkdir(e.W, 0o755))
	if populate != nil {
		populate(e.W)
	}
	e.cfg = Config{WorkDir: e.W, StateDir: e.S}
	if tweak != nil {
		tweak(&e.cfg)
	}
	e.open()
	if err := e.st.Mount(); err != nil {
		t.Fatal(err)
	}
	e.M = e.st.Layout().Merged
	t.Cleanup(func() {
		if err := unix.Unmount(e.M, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			unix.Unmount(e.M, unix.MNT_DETACH)
		}
		if e.st != nil {
			e.st.Close()
		}
	})
	return e
}

func (e *env) open() {
	e.t.Helper()
	st, err := Open(e.cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.st = st
}

// reopen simulates a restart: close and open again (the mount stays).
func (e *env) reopen() Recovery {
	e.t.Helper()
	e.st.Close()
	e.open()
	return e.st.Recovery()
}

func (e *env) m(p string) string { return filepath.Join(e.M, p) }
func (e *env) w(p string) string { return filepath.Join(e.W, p) }

func (e *env) changes() []Change {
	e.t.Helper()
	cs, err := e.st.Changes(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	sort.Slice(cs, func(i, j int) bool { return pathLess(cs[i].Path, cs[j].Path) })
	return cs
}

func (e *env) commit(cs []Change) *Result {
	e.t.Helper()
	res, err := e.st.Commit(context.Background(), cs)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func (e *env) abort(cs []Change) *Result {
	e.t.Helper()
	res, err := e.st.Abort(context.Background(), cs)
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func (e *env) requireNoChanges() {
	e.t.Helper()
	if cs := e.changes(); len(cs) != 0 {
		e.t.Fatalf("Scan reports %d changes, want none: %v", len(cs), cs)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeFile(t testing.TB, p, data string, mode fs.FileMode) {
	t.Helper()
	must(t, os.WriteFile(p, []byte(data), mode))
	must(t, os.Chmod(p, mode))
}

func mkdir(t testing.TB, p string, mode fs.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(p, 0o755))
	must(t, os.Chmod(p, mode))
}

// opSummary lists changes as "op path" lines for comparison.
func opSummary(cs []Change) []string {
	var out []string
	for _, c := range cs {
		s := c.Op.String() + " " + c.Path
		if c.Refused != "" {
			s += " !" + c.Refused
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func requireTree(t testing.TB, what string, want, got map[string]entry) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("%s differs (-want +got):\n%s", what, d)
	}
}

// copyTreeRel copies a directory tree through plain paths (what `mv`
// does when rename(2) fails with EXDEV).
func copyTreeRel(t testing.TB, src, dst string) {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(src, &st))
	switch typeOf(st.Mode) {
	case TypeDir:
		must(t, os.Mkdir(dst, 0o700))
		ents, err := os.ReadDir(src)
		must(t, err)
		for _, de := range ents {
			copyTreeRel(t, filepath.Join(src, de.Name()), filepath.Join(dst, de.Name()))
		}
		must(t, os.Chmod(dst, fs.FileMode(st.Mode&0o777)))
	case TypeFile:
		b, err := os.ReadFile(src)
		must(t, err)
		writeFile(t, dst, string(b), fs.FileMode(st.Mode&0o777))
	case TypeSymlink:
		tg, err := os.Readlink(src)
		must(t, err)
		must(t, os.Symlink(tg, dst))
	}
	// user xattrs
	if typeOf(st.Mode) != TypeSymlink {
		buf := make([]byte, 64<<10)
		n, _ := unix.Llistxattr(src, buf)
		for _, nm := range bytes.Split(buf[:n], []byte{0}) {
			if strings.HasPrefix(string(nm), "user.") {
				v := make([]byte, 64<<10)
				k, err := unix.Lgetxattr(src, string(nm), v)
				must(t, err)
				must(t, unix.Lsetxattr(dst, string(nm), v[:k], 0))
			}
		}
	}
}

// moveTree renames through M, falling back to copy and delete on EXDEV
// (overlayfs with redirect_dir=off refuses to rename merged directories).
func moveTree(t testing.TB, src, dst string) {
	t.Helper()
	err := os.Rename(src, dst)
	if err == nil {
		return
	}
	if !errors.Is(err, unix.EXDEV) {
		t.Fatal(err)
	}
	copyTreeRel(t, src, dst)
	must(t, os.RemoveAll(src))
}

func getXattrPath(p, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func labelOf(level int) decide.Label {
	return decide.Label{Integrity: decide.Untrusted, Level: decide.Level(level)}
}
