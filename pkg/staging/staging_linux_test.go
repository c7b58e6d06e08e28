package staging

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// populateClasses is the working directory for the operation-class tests.
func populateClasses(t *testing.T) func(w string) {
	return func(w string) {
		writeFile(t, filepath.Join(w, "a.txt"), "hello", 0o644)
		writeFile(t, filepath.Join(w, "app.log"), "line1\n", 0o644)
		writeFile(t, filepath.Join(w, "big.txt"), "0123456789", 0o644)
		mkdir(t, filepath.Join(w, "d/sub"), 0o755)
		writeFile(t, filepath.Join(w, "d/f"), "f", 0o644)
		writeFile(t, filepath.Join(w, "d/sub/g"), "g", 0o600)
		writeFile(t, filepath.Join(w, "gone.txt"), "bye", 0o644)
		mkdir(t, filepath.Join(w, "gonedir/y"), 0o755)
		writeFile(t, filepath.Join(w, "gonedir/x"), "x", 0o644)
		writeFile(t, filepath.Join(w, "gonedir/y/z"), "z", 0o644)
		writeFile(t, filepath.Join(w, "mod.sh"), "#!/bin/sh\n", 0o644)
		writeFile(t, filepath.Join(w, "xattr.txt"), "x", 0o644)
		mkdir(t, filepath.Join(w, "mv"), 0o755)
		writeFile(t, filepath.Join(w, "mv/src.txt"), "moving", 0o644)
		mkdir(t, filepath.Join(w, "mvdir"), 0o750)
		writeFile(t, filepath.Join(w, "mvdir/inner"), "i", 0o644)
		writeFile(t, filepath.Join(w, "replace-file"), "was a file", 0o644)
		mkdir(t, filepath.Join(w, "replace-dir"), 0o755)
		writeFile(t, filepath.Join(w, "replace-dir/a"), "a", 0o644)
		writeFile(t, filepath.Join(w, "untouched"), "same", 0o644)
	}
}

// doClasses performs one operation of every class through M.
func doClasses(t *testing.T, e *env) {
	writeFile(t, e.m("new.txt"), "new", 0o644)                        // create
	writeFile(t, e.m("a.txt"), "HELLO world", 0o644)                  // write
	f, err := os.OpenFile(e.m("app.log"), os.O_APPEND|os.O_WRONLY, 0) // append
	must(t, err)
	_, err = f.WriteString("line2\n")
	must(t, err)
	must(t, f.Close())
	must(t, os.Truncate(e.m("big.txt"), 4))                               // truncate
	must(t, os.Remove(e.m("gone.txt")))                                   // unlink
	mkdir(t, e.m("newdir"), 0o750)                                        // mkdir
	writeFile(t, e.m("newdir/inner.txt"), "in", 0o640)                    //
	must(t, os.RemoveAll(e.m("gonedir")))                                 // rmdir (a tree)
	moveTree(t, e.m("mv/src.txt"), e.m("d/dst.txt"))                      // rename a file across directories
	moveTree(t, e.m("mvdir"), e.m("d/mvdir"))                             // rename a directory across directories
	must(t, os.Chmod(e.m("mod.sh"), 0o755))                               // chmod
	must(t, os.Symlink("../a.txt", e.m("d/link")))                        // symlink
	must(t, os.Link(e.m("new.txt"), e.m("d/hard")))                       // hard link
	must(t, unix.Setxattr(e.m("xattr.txt"), "user.tag", []byte("v1"), 0)) // xattr
	must(t, os.Remove(e.m("replace-file")))                               // a file replaced by a directory
	mkdir(t, e.m("replace-file"), 0o755)
	writeFile(t, e.m("replace-file/child"), "c", 0o644)
	must(t, os.RemoveAll(e.m("replace-dir"))) // a directory replaced by a file
	writeFile(t, e.m("replace-dir"), "now a file", 0o644)
}

var wantClasses = []string{
	"create d/dst.txt",
	"create d/hard",
	"create d/mvdir/inner",
	"create new.txt",
	"create newdir/inner.txt",
	"create replace-dir",
	"create replace-file/child",
	"chmod mod.sh",
	"mkdir d/mvdir",
	"mkdir newdir",
	"mkdir replace-file",
	"rmdir gonedir",
	"rmdir mvdir",
	"setxattr xattr.txt",
	"symlink d/link",
	"unlink gone.txt",
	"unlink mv/src.txt",
	"write a.txt",
	"write app.log",
	"write big.txt",
}

func init() {
	// keep the wanted list sorted like opSummary's output
	for i := range wantClasses {
		for j := i + 1; j < len(wantClasses); j++ {
			if wantClasses[j] < wantClasses[i] {
				wantClasses[i], wantClasses[j] = wantClasses[j], wantClasses[i]
			}
		}
	}
}

func TestOperationClassesCommit(t *testing.T) {
	e := newEnv(t, populateClasses(t), nil)
	before := snapshot(t, e.W)
	doClasses(t, e)
	if d := cmp.Diff(before, snapshot(t, e.W)); d != "" {
		t.Fatalf("W changed before commit:\n%s", d)
	}
	cs := e.changes()
	if d := cmp.Diff(wantClasses, opSummary(cs)); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	for _, c := range cs {
		switch c.Path {
		case "replace-file":
			if c.Prev != TypeFile || c.Type != TypeDir {
				t.Errorf("replace-file: prev %v type %v", c.Prev, c.Type)
			}
		case "replace-dir":
			if c.Prev != TypeDir || c.Type != TypeFile {
				t.Errorf("replace-dir: prev %v type %v", c.Prev, c.Type)
			}
		case "d/link":
			if c.Target != "../a.txt" {
				t.Errorf("d/link target %q", c.Target)
			}
		case "mod.sh":
			if c.Mode != 0o755 {
				t.Errorf("mod.sh mode %v", c.Mode)
			}
		}
	}
	model := snapshot(t, e.M)
	res := e.commit(nil)
	if res.Applied != len(wantClasses) || len(res.Refused) != 0 {
		t.Fatalf("commit: applied %d refused %v, want %d applied", res.Applied, res.Refused, len(wantClasses))
	}
	requireTree(t, "W after commit vs M", model, snapshot(t, e.W))
	requireTree(t, "M after commit", model, snapshot(t, e.M))
	e.requireNoChanges()
	// Hard links in U are committed as independent copies.
	var a, b unix.Stat_t
	must(t, unix.Lstat(e.w("new.txt"), &a))
	must(t, unix.Lstat(e.w("d/hard"), &b))
	if a.Ino == b.Ino || a.Nlink != 1 || b.Nlink != 1 {
		t.Errorf("hard link committed as a link: ino %d/%d nlink %d/%d", a.Ino, b.Ino, a.Nlink, b.Nlink)
	}
	// The frozen base never changed: it still mirrors W as it was.
	requireTree(t, "base after commit", before, snapshot(t, e.st.Layout().Base))
	// A restart finds nothing to do and nothing staged.
	if rec := e.reopen(); rec.Found {
		t.Errorf("recovery after a clean commit: %+v", rec)
	}
	e.requireNoChanges()
}

func TestOperationClassesAbort(t *testing.T) {
	e := newEnv(t, populateClasses(t), nil)
	before := snapshot(t, e.W)
	doClasses(t, e)
	if d := cmp.Diff(wantClasses, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	res := e.abort(nil)
	if res.Applied != len(wantClasses) || len(res.Refused) != 0 {
		t.Fatalf("abort: %+v", res)
	}
	requireTree(t, "W after abort", before, snapshot(t, e.W))
	requireTree(t, "M after abort", before, snapshot(t, e.M))
	e.requireNoChanges()
}

// After a commit, the guest changes committed entries again: removing
// an entry carbd created (which leaves no whiteout in U) must be seen.
func TestCommittedEntriesChangeAgain(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "keep"), "k", 0o644) }, nil)
	mkdir(t, e.m("nd/deeper"), 0o755)
	writeFile(t, e.m("nd/deeper/f"), "1", 0o644)
	writeFile(t, e.m("top"), "t", 0o644)
	e.commit(nil)
	e.requireNoChanges()

	must(t, os.Remove(e.m("top")))
	must(t, os.Remove(e.m("nd/deeper/f")))
	writeFile(t, e.m("nd/new"), "n", 0o644)
	if d := cmp.Diff([]string{"create nd/new", "unlink nd/deeper/f", "unlink top"}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	e.commit(nil)
	requireTree(t, "W", snapshot(t, e.M), snapshot(t, e.W))
	e.requireNoChanges()

	must(t, os.RemoveAll(e.m("nd")))
	if d := cmp.Diff([]string{"rmdir nd"}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	// Abort brings the created tree back through M.
	e.abort(nil)
	requireTree(t, "M after abort", snapshot(t, e.W), snapshot(t, e.M))
	e.requireNoChanges()
	// And the index survives restarts: removal is still detected.
	e.reopen()
	must(t, os.RemoveAll(e.m("nd")))
	if d := cmp.Diff([]string{"rmdir nd"}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan after restart (-want +got):\n%s", d)
	}
	e.commit(nil)
	if _, err := os.Lstat(e.w("nd")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("nd still in W: %v", err)
	}
	e.requireNoChanges()
}

func TestCommitSubset(t *testing.T) {
	e := newEnv(t, nil, nil)
	mkdir(t, e.m("d"), 0o755)
	writeFile(t, e.m("d/a"), "a", 0o644)
	writeFile(t, e.m("b"), "b", 0o644)
	cs := e.changes()
	var pick []Change
	for _, c := range cs {
		if c.Path == "d/a" || c.Path == "b" {
			pick = append(pick, c)
		}
	}
	// d/a without its new parent d is refused; b goes in.
	res := e.commit(pick)
	if res.Applied != 1 || len(res.Refused) != 1 || res.Refused[0].Path != "d/a" || res.Refused[0].Reason != ReasonParent {
		t.Fatalf("commit subset: %+v", res)
	}
	if got := readFile(t, e.w("b")); got != "b" {
		t.Errorf("W b = %q", got)
	}
	if d := cmp.Diff([]string{"create d/a", "mkdir d"}, opSummary(e.changes())); d != "" {
		t.Fatalf("still staged (-want +got):\n%s", d)
	}
	// A duplicate in the list is refused, once.
	cs = e.changes()
	res = e.commit(append(cs, cs[0]))
	if res.Applied != 2 || len(res.Refused) != 1 || res.Refused[0].Reason != ReasonDuplicate {
		t.Fatalf("commit with duplicate: %+v", res)
	}
	e.requireNoChanges()
}

// What is committed is what was scanned: a change made after the scan
// is refused, not committed.
func TestCommitRefusesChangedSinceScan(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "f"), "v0", 0o644) }, nil)
	writeFile(t, e.m("f"), "v1 decided", 0o644)
	writeFile(t, e.m("g"), "g", 0o644)
	cs := e.changes()
	writeFile(t, e.m("f"), "v2 never decided", 0o644)
	res := e.commit(cs)
	if res.Applied != 1 || len(res.Refused) != 1 || res.Refused[0].Path != "f" || res.Refused[0].Reason != ReasonChanged {
		t.Fatalf("commit: %+v", res)
	}
	if got := readFile(t, e.w("f")); got != "v0" {
		t.Fatalf("W f = %q, want v0", got)
	}
	if _, err := e.st.Event(cs[0]); !errors.Is(err, ErrChanged) {
		t.Errorf("Event of a stale change: %v, want ErrChanged", err)
	}
	res = e.commit(e.changes())
	if res.Applied != 1 || readFile(t, e.w("f")) != "v2 never decided" {
		t.Fatalf("second commit: %+v, W f = %q", res, readFile(t, e.w("f")))
	}
}

func TestEventContent(t *testing.T) {
	old := strings.Repeat("0123456789", 1000)
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "big"), old, 0o644) },
		func(c *Config) { c.ContentMargin = 4; c.ContentLimit = 64 })
	// Change 5 bytes in the middle.
	neu := old[:5000] + "SECRT" + old[5005:]
	writeFile(t, e.m("big"), neu, 0o644)
	writeFile(t, e.m("created"), "short new file", 0o644)
	writeFile(t, e.m("long"), strings.Repeat("x", 100), 0o644)
	must(t, os.Symlink("big", e.m("ln")))
	must(t, os.Chmod(e.m("created"), 0o600))
	for _, c := range e.changes() {
		ev, err := e.st.Event(c)
		if err != nil {
			t.Fatalf("Event(%v): %v", c, err)
		}
		if ev.Ch != decide.ChanFile || ev.Dir != decide.Out || ev.Kind != decide.Stageable || ev.Obj != c.Path {
			t.Errorf("event header %+v", ev)
		}
		if len(ev.Fields) == 0 || ev.Fields[0] != (decide.Field{Name: "path", Role: decide.RoleTarget, Value: c.Path}) {
			t.Errorf("%s: fields %+v", c.Path, ev.Fields)
		}
		switch c.Path {
		case "big":
			if ev.Op != "file:write" || ev.Content != old[4996:5000]+"SECRT"+old[5005:5009] {
				t.Errorf("big: op %s content %q", ev.Op, ev.Content)
			}
		case "created":
			if ev.Op != "file:write" || ev.Content != "short new file" {
				t.Errorf("created: op %s content %q", ev.Op, ev.Content)
			}
		case "long":
			if len(ev.Content) != 64 || ev.Fields[len(ev.Fields)-2].Name != "truncated" {
				t.Errorf("long: content %d bytes, fields %+v", len(ev.Content), ev.Fields)
			}
		case "ln":
			if ev.Op != "file:symlink" || ev.Fields[1] != (decide.Field{Name: "link", Role: decide.RoleTarget, Value: "big"}) {
				t.Errorf("ln: %+v", ev)
			}
		default:
			t.Errorf("unexpected change %v", c)
		}
	}
}

func TestLabels(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "old"), "o", 0o644) }, nil)
	ctx := context.Background()
	secret := decide.Label{Integrity: decide.Untrusted, Level: 2}
	low := decide.Label{Integrity: decide.Trusted, Level: 1}

	sc, err := e.st.Begin()
	must(t, err)
	if _, err := e.st.Begin(); !errors.Is(err, ErrScopeOpen) {
		t.Fatalf("second Begin: %v, want ErrScopeOpen", err)
	}
	if _, err := e.st.Commit(ctx, nil); !errors.Is(err, ErrScopeOpen) {
		t.Fatalf("Commit with a scope open: %v", err)
	}
	writeFile(t, e.m("report"), "data", 0o644)
	must(t, sc.Stage("report", secret))
	writeFile(t, e.m("old"), "o2", 0o644)
	must(t, sc.Stage("old", low))
	if lb, ok := e.st.Labels().Get("report"); !ok || lb != secret {
		t.Errorf("pending label of report = %v %v", lb, ok)
	}
	if _, ok := e.st.Labels().Committed("report"); ok {
		t.Errorf("label committed before the scope")
	}
	// Pending labels survive a restart (the scope does not: it is
	// resolved as a whole by whoever reopens).
	sc = nil
	e.reopen()
	if lb, ok := e.st.Labels().Pending("report"); !ok || lb != secret {
		t.Errorf("pending label of report after restart = %v %v", lb, ok)
	}
	sc, err = e.st.Begin()
	must(t, err)
	if _, err := sc.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sc.Stage("x", low); !errors.Is(err, ErrNoScope) {
		t.Errorf("Stage on a closed scope: %v", err)
	}
	if lb, ok := e.st.Labels().Committed("report"); !ok || lb != secret {
		t.Errorf("committed label of report = %v %v", lb, ok)
	}

	// An aborted scope's labels are discarded.
	sc, err = e.st.Begin()
	must(t, err)
	writeFile(t, e.m("report"), "tainted", 0o644)
	must(t, sc.Stage("report", decide.Label{Integrity: decide.Untrusted, Level: 5}))
	if _, err := sc.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if lb, ok := e.st.Labels().Get("report"); !ok || lb != secret {
		t.Errorf("label after abort = %v %v, want %v", lb, ok, secret)
	}

	// A further write combines with the committed label; labels survive
	// a restart.
	writeFile(t, e.m("report"), "more", 0o644)
	must(t, e.st.Stage("report", low))
	e.commit(nil)
	want := secret.Combine(low)
	e.reopen()
	if lb, ok := e.st.Labels().Get("report"); !ok || lb != want {
		t.Errorf("label after restart = %v %v, want %v", lb, ok, want)
	}
	if lb, ok := e.st.Labels().Get("old"); !ok || lb != low {
		t.Errorf("label of old = %v %v", lb, ok)
	}
	// Removing the path removes its label.
	must(t, os.Remove(e.m("report")))
	e.commit(nil)
	if _, ok := e.st.Labels().Get("report"); ok {
		t.Errorf("label of a removed path remains")
	}
}

func TestMountBehaviour(t *testing.T) {
	e := newEnv(t, func(w string) {
		mkdir(t, filepath.Join(w, "dir"), 0o755)
		writeFile(t, filepath.Join(w, "dir/f"), strings.Repeat("z", 10000), 0o644)
	}, nil)
	ok, err := Mounted(e.st.Layout())
	if err != nil || !ok {
		t.Fatalf("Mounted = %v, %v", ok, err)
	}
	// Mount again (a restarted carbd) keeps the existing mount.
	must(t, e.st.Mount())
	// redirect_dir=off: renaming a merged directory fails with EXDEV.
	if err := os.Rename(e.m("dir"), e.m("dir2")); !errors.Is(err, unix.EXDEV) {
		t.Errorf("rename of a lower directory: %v, want EXDEV", err)
	}
	// metacopy=off: a chmod copies the data up.
	must(t, os.Chmod(e.m("dir/f"), 0o600))
	if fi, err := os.Stat(filepath.Join(e.st.Layout().Upper, "dir/f")); err != nil || fi.Size() != 10000 {
		t.Errorf("upper copy after chmod: %v %v", fi, err)
	}
	// The guest cannot forge overlay metadata through M: overlayfs
	// refuses or escapes (trusted.overlay.overlay.*) its private xattrs.
	if err := unix.Setxattr(e.m("dir"), "trusted.overlay.opaque", []byte("y"), 0); err == nil {
		if v, err := getXattrPath(filepath.Join(e.st.Layout().Upper, "dir"), "trusted.overlay.opaque"); err == nil {
			t.Errorf("the guest made dir opaque in U: %q", v)
		}
		if d := cmp.Diff([]string{"chmod dir/f"}, opSummary(e.changes())); d != "" {
			t.Errorf("Scan after a forged opaque xattr (-want +got):\n%s", d)
		}
	}
	if err := unix.Mknod(e.m("wh"), unix.S_IFCHR, 0); err == nil {
		t.Errorf("creating a whiteout device through M succeeded")
	}
	// nodev: a device node in M cannot be opened.
	must(t, unix.Mknod(e.m("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	if f, err := os.Open(e.m("null")); err == nil {
		f.Close()
		t.Errorf("opened a device node through a nodev M")
	}
	// Unmount, and a second unmount reports ErrNotMounted.
	must(t, e.st.Unmount())
	if err := e.st.Unmount(); !errors.Is(err, ErrNotMounted) {
		t.Errorf("second Unmount: %v", err)
	}
	if _, err := e.st.Abort(context.Background(), nil); !errors.Is(err, ErrNotMounted) {
		t.Errorf("Abort without M: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	w := filepath.Join(base, "w")
	mkdir(t, w, 0o755)
	s1, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
	must(t, err)
	defer s1.Close()
	if _, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")}); !errors.Is(err, ErrLocked) {
		t.Errorf("second Open: %v, want ErrLocked", err)
	}
	// A state dir on another filesystem is refused.
	other := filepath.Join(base, "tmpfs")
	mkdir(t, other, 0o700)
	must(t, unix.Mount("tmpfs", other, "tmpfs", 0, "size=1m"))
	defer unix.Unmount(other, unix.MNT_DETACH)
	if _, err := Open(Config{WorkDir: w, StateDir: filepath.Join(other, "s")}); err == nil || !strings.Contains(err.Error(), "different filesystems") {
		t.Errorf("Open across filesystems: %v", err)
	}
	if _, err := Open(Config{WorkDir: filepath.Join(base, "missing"), StateDir: filepath.Join(base, "s2")}); err == nil {
		t.Errorf("Open of a missing work dir succeeded")
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
