package staging

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// source drives the operation script: a seeded PRNG for the property
// test, the fuzz input's bytes for the fuzz target.
type source interface {
	Intn(n int) int
	Done() bool
}

type rngSource struct {
	r    *rand.Rand
	left int
}

func (s *rngSource) Intn(n int) int { return s.r.Intn(n) }
func (s *rngSource) Done() bool {
	s.left--
	return s.left < 0
}

type byteSource struct {
	b []byte
}

func (s *byteSource) Intn(n int) int {
	if len(s.b) == 0 {
		return 0
	}
	v := int(s.b[0])
	s.b = s.b[1:]
	return v % n
}
func (s *byteSource) Done() bool { return len(s.b) == 0 }

// driver performs random operations through M and keeps models of what
// M and W must hold: the merged view changes with every operation, the
// working directory only when a commit says so.
type driver struct {
	t      *testing.T
	e      *env
	src    source
	mm, wm map[string]entry // models of M and W
	group  map[string]int   // hard-link groups in M
	ngroup int
	log    []string
}

var names = []string{"a", "b", "c d", "new\nline", "\xff\xfe", "é", "x.txt", "-"}

func newDriver(t *testing.T, src source) *driver {
	e := newEnv(t, func(w string) {
		writeFile(t, filepath.Join(w, "a"), "initial a", 0o644)
		mkdir(t, filepath.Join(w, "b/c d"), 0o755)
		writeFile(t, filepath.Join(w, "b/x.txt"), "bx", 0o600)
		writeFile(t, filepath.Join(w, "b/c d/é"), "deep", 0o644)
		must(t, os.Symlink("a", filepath.Join(w, "ln")))
	}, nil)
	d := &driver{t: t, e: e, src: src, group: make(map[string]int)}
	d.wm = snapshot(t, e.W)
	d.mm = cloneTree(d.wm)
	return d
}

func cloneTree(m map[string]entry) map[string]entry {
	out := make(map[string]entry, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (d *driver) logf(format string, args ...any) {
	d.log = append(d.log, fmt.Sprintf(format, args...))
}

func (d *driver) fail(format string, args ...any) {
	d.t.Helper()
	tail := d.log
	if len(tail) > 40 {
		tail = tail[len(tail)-40:]
	}
	if os.Getenv("CARBD_STAGING_DEBUG") != "" {
		d.t.Logf("U:\n%s\nW:\n%s", dumpTree(d.e.st.Layout().Upper), dumpTree(d.e.W))
	}
	d.t.Fatalf("%s\nlast operations:\n  %s", fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
}

// pick returns a random model path matching the filter, or "".
func (d *driver) pick(filter func(string, entry) bool) string {
	var ps []string
	for p, e := range d.mm {
		if filter(p, e) {
			ps = append(ps, p)
		}
	}
	if len(ps) == 0 {
		return ""
	}
	sort.Strings(ps)
	return ps[d.src.Intn(len(ps))]
}

func isType(t Type) func(string, entry) bool {
	return func(_ string, e entry) bool { return e.Type == t }
}

// freshPath returns a path in a random existing directory that the model
// does not have.
func (d *driver) freshPath() string {
	dir := ""
	if d.src.Intn(3) > 0 {
		dir = d.pick(isType(TypeDir))
	}
	for i := 0; i < 20; i++ {
		n := names[d.src.Intn(len(names))]
		if i > 0 {
			n += fmt.Sprint(d.src.Intn(100))
		}
		p := joinRel(dir, n)
		if _, ok := d.mm[p]; !ok {
			return p
		}
	}
	return ""
}

func (d *driver) content() string {
	n := d.src.Intn(40)
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + d.src.Intn(26))
	}
	if d.src.Intn(8) == 0 {
		return strings.Repeat(string(b)+"\n", 1000) // larger than a page
	}
	return string(b)
}

// linked returns p and every path hard-linked to it in M.
func (d *driver) linked(p string) []string {
	g := d.group[p]
	if g == 0 {
		return []string{p}
	}
	var out []string
	for q, h := range d.group {
		if h == g {
			out = append(out, q)
		}
	}
	return out
}

// removeSubtree drops p and everything below it from the M model.
func (d *driver) removeSubtree(p string) {
	for q := range d.mm {
		if q == p || under(q, p) {
			delete(d.mm, q)
			delete(d.group, q)
		}
	}
}

var modes = []uint32{0o600, 0o644, 0o700, 0o755, 0o750}

func (d *driver) step() {
	t := d.t
	switch d.src.Intn(16) {
	case 0, 1: // create a file
		p := d.freshPath()
		if p == "" {
			return
		}
		c, mode := d.content(), modes[d.src.Intn(len(modes))]
		d.logf("create %q (%d bytes, %#o)", p, len(c), mode)
		writeFile(t, d.e.m(p), c, fs.FileMode(mode))
		d.mm[p] = entry{Type: TypeFile, Mode: mode, Data: c}
	case 2: // overwrite in place
		p := d.pick(isType(TypeFile))
		if p == "" {
			return
		}
		c := d.content()
		d.logf("overwrite %q", p)
		must(t, os.WriteFile(d.e.m(p), []byte(c), 0))
		for _, q := range d.linked(p) {
			e := d.mm[q]
			e.Data = c
			d.mm[q] = e
		}
	case 3: // append
		p := d.pick(isType(TypeFile))
		if p == "" {
			return
		}
		c := d.content()
		d.logf("append %q", p)
		f, err := os.OpenFile(d.e.m(p), os.O_APPEND|os.O_WRONLY, 0)
		must(t, err)
		_, err = f.WriteString(c)
		must(t, err)
		must(t, f.Close())
		for _, q := range d.linked(p) {
			e := d.mm[q]
			e.Data += c
			d.mm[q] = e
		}
	case 4: // truncate
		p := d.pick(isType(TypeFile))
		if p == "" {
			return
		}
		n := d.src.Intn(len(d.mm[p].Data) + 1)
		d.logf("truncate %q to %d", p, n)
		must(t, os.Truncate(d.e.m(p), int64(n)))
		for _, q := range d.linked(p) {
			e := d.mm[q]
			e.Data = e.Data[:n]
			d.mm[q] = e
		}
	case 5: // unlink a file or symlink
		p := d.pick(func(_ string, e entry) bool { return e.Type != TypeDir })
		if p == "" {
			return
		}
		d.logf("unlink %q", p)
		must(t, os.Remove(d.e.m(p)))
		d.removeSubtree(p)
	case 6: // mkdir
		p := d.freshPath()
		if p == "" {
			return
		}
		mode := modes[d.src.Intn(len(modes))] | 0o700
		d.logf("mkdir %q %#o", p, mode)
		mkdir(t, d.e.m(p), fs.FileMode(mode))
		d.mm[p] = entry{Type: TypeDir, Mode: mode}
	case 7: // remove a tree
		p := d.pick(isType(TypeDir))
		if p == "" {
			return
		}
		d.logf("rm -rf %q", p)
		must(t, os.RemoveAll(d.e.m(p)))
		d.removeSubtree(p)
	case 8: // rename a file, maybe across directories
		p := d.pick(func(_ string, e entry) bool { return e.Type != TypeDir })
		q := d.freshPath()
		if p == "" || q == "" {
			return
		}
		if e := d.mm[p]; e.Type == TypeSymlink && linkEscapes(q, e.Data) {
			return // hostile input has its own tests
		}
		d.logf("rename %q -> %q", p, q)
		must(t, os.Rename(d.e.m(p), d.e.m(q)))
		d.mm[q] = d.mm[p]
		if g := d.group[p]; g != 0 {
			d.group[q] = g
		}
		delete(d.mm, p)
		delete(d.group, p)
	case 9: // move a directory (rename, or copy and delete on EXDEV)
		p := d.pick(isType(TypeDir))
		q := d.freshPath()
		if p == "" || q == "" || under(q, p) {
			return
		}
		for r, e := range d.mm {
			if (r == p || under(r, p)) && e.Type == TypeSymlink && linkEscapes(q+r[len(p):], e.Data) {
				return
			}
		}
		d.logf("mv %q -> %q", p, q)
		err := os.Rename(d.e.m(p), d.e.m(q))
		copied := false
		if errors.Is(err, unix.EXDEV) {
			copyTreeRel(t, d.e.m(p), d.e.m(q))
			must(t, os.RemoveAll(d.e.m(p)))
			copied = true
		} else {
			must(t, err)
		}
		moved := make(map[string]entry)
		groups := make(map[string]int)
		for r, e := range d.mm {
			if r == p || under(r, p) {
				nr := q + r[len(p):]
				moved[nr] = e
				if g := d.group[r]; g != 0 && !copied {
					groups[nr] = g
				}
			}
		}
		d.removeSubtree(p)
		for r, e := range moved {
			d.mm[r] = e
		}
		for r, g := range groups {
			d.group[r] = g
		}
	case 10: // chmod
		p := d.pick(func(_ string, e entry) bool { return e.Type != TypeSymlink })
		if p == "" {
			return
		}
		mode := modes[d.src.Intn(len(modes))]
		if d.mm[p].Type == TypeDir {
			mode |= 0o700
		}
		d.logf("chmod %q %#o", p, mode)
		must(t, os.Chmod(d.e.m(p), fs.FileMode(mode)))
		for _, q := range d.linked(p) {
			e := d.mm[q]
			e.Mode = mode
			d.mm[q] = e
		}
	case 11: // symlink (inside W)
		p := d.freshPath()
		if p == "" {
			return
		}
		target := names[d.src.Intn(len(names))]
		if strings.Contains(p, "/") && d.src.Intn(2) == 0 {
			target = "../" + target
		}
		d.logf("symlink %q -> %q", p, target)
		must(t, os.Symlink(target, d.e.m(p)))
		d.mm[p] = entry{Type: TypeSymlink, Data: target}
	case 12: // hard link
		p := d.pick(isType(TypeFile))
		q := d.freshPath()
		if p == "" || q == "" {
			return
		}
		d.logf("link %q -> %q", q, p)
		must(t, os.Link(d.e.m(p), d.e.m(q)))
		g := d.group[p]
		if g == 0 {
			d.ngroup++
			g = d.ngroup
			d.group[p] = g
		}
		d.group[q] = g
		d.mm[q] = d.mm[p]
	case 13: // set a user xattr
		p := d.pick(func(_ string, e entry) bool { return e.Type != TypeSymlink })
		if p == "" {
			return
		}
		v := fmt.Sprint(d.src.Intn(5))
		d.logf("setxattr %q user.k=%s", p, v)
		must(t, unix.Lsetxattr(d.e.m(p), "user.k", []byte(v), 0))
		for _, q := range d.linked(p) {
			e := d.mm[q]
			e.Xattrs = "user.k=" + v + ";"
			d.mm[q] = e
		}
	case 14: // a file replaced by a directory
		p := d.pick(isType(TypeFile))
		if p == "" {
			return
		}
		d.logf("file %q -> dir", p)
		must(t, os.Remove(d.e.m(p)))
		d.removeSubtree(p)
		mkdir(t, d.e.m(p), 0o755)
		d.mm[p] = entry{Type: TypeDir, Mode: 0o755}
	case 15: // a directory replaced by a file
		p := d.pick(isType(TypeDir))
		if p == "" {
			return
		}
		d.logf("dir %q -> file", p)
		must(t, os.RemoveAll(d.e.m(p)))
		d.removeSubtree(p)
		writeFile(t, d.e.m(p), "was a dir", 0o644)
		d.mm[p] = entry{Type: TypeFile, Mode: 0o644, Data: "was a dir"}
	}
}

// expectedChanges is the set of paths Scan must report: what differs
// between the models, except entries below a directory that is removed
// or replaced (the directory's change covers them).
func (d *driver) expectedChanges() []string {
	var out []string
	seen := make(map[string]bool)
	for _, m := range []map[string]entry{d.mm, d.wm} {
		for p := range m {
			if seen[p] {
				continue
			}
			seen[p] = true
			a, inM := d.mm[p]
			b, inW := d.wm[p]
			switch {
			case inM && inW && a == b:
			case !inM:
				dir, _ := splitRel(p)
				if dir == "" || (d.mm[dir].Type == TypeDir && d.wm[dir].Type == TypeDir) {
					out = append(out, p)
				}
			default:
				out = append(out, p)
			}
		}
	}
	sort.Strings(out)
	return out
}

func (d *driver) check(what string) {
	d.t.Helper()
	if diff := cmp.Diff(d.wm, snapshot(d.t, d.e.W)); diff != "" {
		d.fail("%s: W differs from its model (-model +W):\n%s", what, diff)
	}
	if diff := cmp.Diff(d.mm, snapshot(d.t, d.e.M)); diff != "" {
		d.fail("%s: M differs from its model (-model +M):\n%s", what, diff)
	}
}

func (d *driver) resolve() {
	d.t.Helper()
	ctx := context.Background()
	cs, err := d.e.st.Changes(ctx)
	if err != nil {
		d.fail("scan: %v", err)
	}
	var got []string
	for _, c := range cs {
		got = append(got, c.Path)
		if c.Refused != "" {
			d.fail("benign change refused: %v", c)
		}
	}
	sort.Strings(got)
	if diff := cmp.Diff(d.expectedChanges(), got); diff != "" {
		d.fail("Scan reports other paths than the models differ in (-want +got):\n%s", diff)
	}
	switch d.src.Intn(5) {
	case 0, 1, 2:
		d.logf("== commit %d changes", len(cs))
		res, err := d.e.st.Commit(ctx, cs)
		if err != nil {
			d.fail("commit: %v", err)
		}
		if len(res.Refused) != 0 || res.Applied != len(cs) {
			d.fail("commit: applied %d of %d, refused %v", res.Applied, len(cs), res.Refused)
		}
		d.wm = cloneTree(d.mm)
	case 3:
		d.logf("== abort %d changes", len(cs))
		res, err := d.e.st.Abort(ctx, cs)
		if err != nil {
			d.fail("abort: %v", err)
		}
		if len(res.Refused) != 0 {
			d.fail("abort refused %v", res.Refused)
		}
		// Reverted entries are fresh copies of W's: their links are gone.
		for p := range d.mm {
			if w, ok := d.wm[p]; !ok || w != d.mm[p] {
				delete(d.group, p)
			}
		}
		for p := range d.wm {
			if _, ok := d.mm[p]; !ok {
				delete(d.group, p)
			}
		}
		d.mm = cloneTree(d.wm)
		for p := range d.group {
			if _, ok := d.mm[p]; !ok {
				delete(d.group, p)
			}
		}
	case 4:
		d.logf("== restart")
		if rec := d.e.reopen(); rec.Found {
			d.fail("restart found a journal: %+v", rec)
		}
		return
	}
	d.check("after resolution")
	if cs := d.e.changes(); len(cs) != 0 {
		d.fail("Scan after resolution reports %v", cs)
	}
}

func (d *driver) run() {
	for !d.src.Done() {
		d.step()
		if d.src.Intn(12) == 0 {
			d.resolve()
		}
	}
	d.resolve()
	d.check("end")
}

func TestPropertyRandomOperations(t *testing.T) {
	seeds := []int64{1, 2, 3}
	// CARBD_STAGING_SEEDS=A-B runs seeds A to B (a longer search).
	if r := os.Getenv("CARBD_STAGING_SEEDS"); r != "" {
		var a, b int64
		if _, err := fmt.Sscanf(r, "%d-%d", &a, &b); err != nil {
			t.Fatalf("CARBD_STAGING_SEEDS=%q: want A-B", r)
		}
		seeds = nil
		for i := a; i <= b; i++ {
			seeds = append(seeds, i)
		}
	}
	ops := 300
	if testing.Short() {
		seeds, ops = seeds[:1], 100
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			d := newDriver(t, &rngSource{r: rand.New(rand.NewSource(seed)), left: ops})
			d.run()
		})
	}
}

// FuzzOperations drives the same model check with the fuzz input as the
// operation script.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 11, 5, 0, 9, 1, 0, 0})
	f.Add([]byte{6, 1, 1, 0, 1, 2, 3, 4, 9, 2, 1, 0, 0, 15, 0, 0, 0, 14, 0, 0, 0})
	f.Add([]byte{12, 0, 1, 2, 2, 2, 2, 0, 13, 0, 3, 0, 0, 7, 1, 0, 0})
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 512 {
			script = script[:512]
		}
		d := newDriver(t, &byteSource{b: script})
		d.run()
	})
}
