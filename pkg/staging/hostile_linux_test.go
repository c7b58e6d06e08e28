package staging

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// The agent controls everything in the upper layer. Each test checks
// that W changes only as allowed, that nothing outside W changes, and
// that every refused entry is reported with its reason.

// outsideDir makes a directory next to W that commits must never touch.
func outsideDir(t *testing.T, e *env) (string, map[string]entry) {
	t.Helper()
	o := filepath.Join(e.base, "outside")
	mkdir(t, o, 0o755)
	writeFile(t, filepath.Join(o, "secret"), "do not touch", 0o600)
	writeFile(t, filepath.Join(o, "y"), "outside y", 0o644)
	return o, snapshot(t, o)
}

func refusals(res *Result) []string {
	var out []string
	for _, r := range res.Refused {
		out = append(out, r.Path+": "+r.Reason)
	}
	sortStrings(out)
	return out
}

func TestHostileSymlinks(t *testing.T) {
	e := newEnv(t, func(w string) {
		mkdir(t, filepath.Join(w, "d"), 0o755)
		writeFile(t, filepath.Join(w, "d/file"), "f", 0o644)
		mkdir(t, filepath.Join(w, "tree"), 0o755)
		writeFile(t, filepath.Join(w, "tree/x"), "x", 0o644)
	}, nil)
	o, osnap := outsideDir(t, e)
	before := snapshot(t, e.W)
	must(t, os.Symlink("/etc/passwd", e.m("abs")))
	must(t, os.Symlink("../outside/secret", e.m("up")))
	must(t, os.Symlink("../../x", e.m("d/up2")))
	must(t, os.Symlink("d/file", e.m("ok")))
	must(t, os.Symlink("../ok", e.m("d/ok2")))
	// A directory replaced by a symlink out of W: refused, W keeps it.
	must(t, os.RemoveAll(e.m("tree")))
	must(t, os.Symlink(o, e.m("tree")))
	cs := e.changes()
	want := []string{
		"symlink abs !" + ReasonLinkEscape,
		"symlink d/ok2",
		"symlink d/up2 !" + ReasonLinkEscape,
		"symlink ok",
		"symlink tree !" + ReasonLinkEscape,
		"symlink up !" + ReasonLinkEscape,
	}
	if d := cmp.Diff(want, opSummary(cs)); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	res := e.commit(nil)
	wantRef := []string{"abs: " + ReasonLinkEscape, "d/up2: " + ReasonLinkEscape, "tree: " + ReasonLinkEscape, "up: " + ReasonLinkEscape}
	if d := cmp.Diff(wantRef, refusals(res)); d != "" || res.Applied != 2 {
		t.Fatalf("refusals (-want +got):\n%s\napplied %d", d, res.Applied)
	}
	after := snapshot(t, e.W)
	before["ok"] = entry{Type: TypeSymlink, Data: "d/file"}
	before["d/ok2"] = entry{Type: TypeSymlink, Data: "../ok"}
	requireTree(t, "W", before, after)
	requireTree(t, "outside", osnap, snapshot(t, o))
	// The refused entries stay staged (and visible to the guest) until
	// aborted; abort removes them from M.
	e.abort(nil)
	requireTree(t, "M after abort", snapshot(t, e.W), snapshot(t, e.M))
	e.requireNoChanges()
}

// W's own path changes behind carbd's back into a symlink out of W:
// commits never follow it.
func TestHostileSymlinkInWorkPath(t *testing.T) {
	e := newEnv(t, func(w string) {
		mkdir(t, filepath.Join(w, "sub"), 0o755)
		writeFile(t, filepath.Join(w, "sub/y"), "w y", 0o644)
		writeFile(t, filepath.Join(w, "top"), "t", 0o644)
	}, nil)
	o, osnap := outsideDir(t, e)
	writeFile(t, e.m("sub/x"), "new x", 0o644)
	must(t, os.Remove(e.m("sub/y")))
	writeFile(t, e.m("top"), "t2", 0o644)
	cs := e.changes()
	// Someone swaps W/sub for a symlink to the outside directory.
	must(t, os.Rename(e.w("sub"), e.w("sub.moved")))
	must(t, os.Symlink(o, e.w("sub")))
	res := e.commit(cs)
	wantRef := []string{"sub/x: " + ReasonSymlinkW, "sub/y: " + ReasonSymlinkW}
	if d := cmp.Diff(wantRef, refusals(res)); d != "" || res.Applied != 1 {
		t.Fatalf("refusals (-want +got):\n%s\napplied %d", d, res.Applied)
	}
	requireTree(t, "outside", osnap, snapshot(t, o))
	if got := readFile(t, e.w("top")); got != "t2" {
		t.Errorf("top = %q", got)
	}
	if tg, err := os.Readlink(e.w("sub")); err != nil || tg != o {
		t.Errorf("W sub = %q %v", tg, err)
	}
}

func TestHostileHardLinks(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "keep"), "k", 0o644) }, nil)
	must(t, os.Link(e.m("keep"), e.m("alias")))
	writeFile(t, e.m("own"), "o", 0o644)
	must(t, os.Link(e.m("own"), e.m("own2")))
	if d := cmp.Diff([]string{"create alias", "create own", "create own2"}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	e.commit(nil)
	var k, a, o1, o2 unix.Stat_t
	must(t, unix.Lstat(e.w("keep"), &k))
	must(t, unix.Lstat(e.w("alias"), &a))
	must(t, unix.Lstat(e.w("own"), &o1))
	must(t, unix.Lstat(e.w("own2"), &o2))
	if a.Ino == k.Ino || a.Nlink != 1 || o1.Ino == o2.Ino || o1.Nlink != 1 || o2.Nlink != 1 {
		t.Fatalf("hard links committed as links: keep %d alias %d/%d own %d/%d own2 %d/%d",
			k.Ino, a.Ino, a.Nlink, o1.Ino, o1.Nlink, o2.Ino, o2.Nlink)
	}
	// The guest writes through one name: both change in M, and a commit
	// writes both, still as separate files.
	writeFileInPlace(t, e.m("alias"), "both")
	if d := cmp.Diff([]string{"write alias", "write keep"}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	e.commit(nil)
	if readFile(t, e.w("keep")) != "both" || readFile(t, e.w("alias")) != "both" {
		t.Fatalf("W keep/alias not both written")
	}
	must(t, unix.Lstat(e.w("keep"), &k))
	must(t, unix.Lstat(e.w("alias"), &a))
	if k.Ino == a.Ino {
		t.Fatalf("W keep and alias share an inode")
	}
}

func writeFileInPlace(t *testing.T, p, data string) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	_, err = f.WriteString(data)
	must(t, err)
	must(t, f.Close())
}

func TestHostileSpecialFiles(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "was-file"), "f", 0o644) }, nil)
	before := snapshot(t, e.W)
	must(t, unix.Mkfifo(e.m("fifo"), 0o644))
	must(t, unix.Mknod(e.m("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, unix.Mknod(e.m("blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.m("sock"), Net: "unix"})
	must(t, err)
	l.SetUnlinkOnClose(false)
	l.Close()
	// A regular file replaced by a FIFO: refused, W keeps the file.
	must(t, os.Remove(e.m("was-file")))
	must(t, unix.Mkfifo(e.m("was-file"), 0o644))
	want := []string{"mknod blk !" + ReasonSpecial, "mknod fifo !" + ReasonSpecial, "mknod null !" + ReasonSpecial,
		"mknod sock !" + ReasonSpecial, "mknod was-file !" + ReasonSpecial}
	if d := cmp.Diff(want, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	res := e.commit(nil)
	if res.Applied != 0 || len(res.Refused) != 5 {
		t.Fatalf("commit: %+v", res)
	}
	requireTree(t, "W", before, snapshot(t, e.W))
	res = e.abort(nil)
	if len(res.Refused) != 0 {
		t.Fatalf("abort: %+v", res)
	}
	requireTree(t, "M after abort", before, snapshot(t, e.M))
	e.requireNoChanges()
}

func TestHostileModesAndOwners(t *testing.T) {
	e := newEnv(t, func(w string) {
		writeFile(t, filepath.Join(w, "principal-suid"), "p", 0o644)
		must(t, unix.Chmod(filepath.Join(w, "principal-suid"), 0o4755))
	}, func(c *Config) { c.Owner = &Owner{UID: 4242, GID: 4343} })
	writeFile(t, e.m("suid"), "s", 0o755)
	must(t, os.Chown(e.m("suid"), 0, 0)) // the agent claims root
	must(t, unix.Chmod(e.m("suid"), 0o4755))
	writeFile(t, e.m("sgid"), "g", 0o755)
	must(t, unix.Chmod(e.m("sgid"), 0o2755))
	mkdir(t, e.m("sticky"), 0o777)
	must(t, unix.Chmod(e.m("sticky"), 0o1777))
	mkdir(t, e.m("sgiddir"), 0o755)
	must(t, unix.Chmod(e.m("sgiddir"), 0o2775))
	// The principal's own setuid file, untouched by the guest, is no change.
	res := e.commit(nil)
	wantStripped := []string{"sgid", "sgiddir", "sticky", "suid"}
	sortStrings(res.Stripped)
	if d := cmp.Diff(wantStripped, res.Stripped); d != "" {
		t.Fatalf("stripped (-want +got):\n%s", d)
	}
	for p, want := range map[string]uint32{"suid": 0o755, "sgid": 0o755, "sticky": 0o777, "sgiddir": 0o775, "principal-suid": 0o4755} {
		var st unix.Stat_t
		must(t, unix.Lstat(e.w(p), &st))
		if st.Mode&0o7777 != want {
			t.Errorf("%s: mode %#o, want %#o", p, st.Mode&0o7777, want)
		}
		if p != "principal-suid" && (st.Uid != 4242 || st.Gid != 4343) {
			t.Errorf("%s: owner %d:%d, want 4242:4343", p, st.Uid, st.Gid)
		}
	}
	// Nothing more to commit: stripped bits are not a pending change.
	e.requireNoChanges()
}

func TestHostileLargeFiles(t *testing.T) {
	const limit = 1 << 20
	e := newEnv(t, nil, func(c *Config) { c.MaxFileSize = limit })
	writeFile(t, e.m("fits"), strings.Repeat("a", limit), 0o644)
	writeFile(t, e.m("over"), strings.Repeat("b", limit+1), 0o644)
	if d := cmp.Diff([]string{"create fits", "create over !" + ReasonTooLarge}, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	res := e.commit(nil)
	if res.Applied != 1 || res.Bytes != limit || len(res.Refused) != 1 || res.Refused[0].Reason != ReasonTooLarge {
		t.Fatalf("commit: %+v", res)
	}
	if _, err := os.Lstat(e.w("over")); !os.IsNotExist(err) {
		t.Fatalf("over-limit file in W: %v", err)
	}
	// A file that grows past the limit after the scan is refused too.
	must(t, os.Remove(e.m("over")))
	writeFile(t, e.m("grow"), "small", 0o644)
	cs := e.changes()
	writeFile(t, e.m("grow"), strings.Repeat("c", limit+1), 0o644)
	res = e.commit(cs)
	if len(res.Refused) != 1 || res.Refused[0].Path != "grow" {
		t.Fatalf("commit of a grown file: %+v", res)
	}
}

// Content is streamed: committing a 64 MiB file allocates a small
// fraction of it.
func TestCommitStreamsLargeFiles(t *testing.T) {
	e := newEnv(t, nil, nil)
	const size = 64 << 20
	f, err := os.Create(e.m("huge"))
	must(t, err)
	chunk := []byte(strings.Repeat("0123456789abcdef", 4096))
	for n := 0; n < size; n += len(chunk) {
		_, err := f.Write(chunk)
		must(t, err)
	}
	must(t, f.Close())
	cs := e.changes()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := e.commit(cs)
	runtime.ReadMemStats(&after)
	if res.Bytes != size {
		t.Fatalf("committed %d bytes", res.Bytes)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/8 {
		t.Errorf("commit of %d bytes allocated %d bytes: not streamed", size, alloc)
	}
	var st unix.Stat_t
	must(t, unix.Lstat(e.w("huge"), &st))
	if st.Size != size {
		t.Errorf("W huge is %d bytes", st.Size)
	}
}

func TestHostileManyFiles(t *testing.T) {
	e := newEnv(t, nil, nil)
	n := 3000
	if testing.Short() {
		n = 300
	}
	for i := 0; i < n; i++ {
		d := e.m("many/" + string(rune('a'+i%7)))
		if i < 7 {
			mkdir(t, d, 0o755)
		}
		writeFile(t, filepath.Join(d, "f"+strings.Repeat("x", i%5)+string(rune('0'+i%10))+"-"+itoa(i)), itoa(i), 0o644)
	}
	count := 0
	must(t, e.st.Scan(context.Background(), func(c Change) error { count++; return nil }))
	if count != n+8 {
		t.Fatalf("Scan streamed %d changes, want %d", count, n+8)
	}
	res := e.commit(nil)
	if res.Applied != n+8 {
		t.Fatalf("commit applied %d", res.Applied)
	}
	requireTree(t, "W", snapshot(t, e.M), snapshot(t, e.W))
	e.requireNoChanges()
}

func itoa(i int) string {
	return strings.TrimSpace(strings.Repeat(" ", 0) + func() string { return fmtInt(i) }())
}

func fmtInt(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for i > 0 {
		b = append([]byte{byte('0' + i%10)}, b...)
		i /= 10
	}
	return string(b)
}

func TestHostileNames(t *testing.T) {
	e := newEnv(t, func(w string) { writeFile(t, filepath.Join(w, "old\nname"), "o", 0o644) }, nil)
	names := []string{"new\nline", "\xff\xfe\xfd", "tab\there", "-rf", " space ", "back\\slash", "quote\"'", "é€😀",
		strings.Repeat("n", 255), "ctl\x01\x1f\x7f", ".hidden", "...", "colon:comma,"}
	mkdir(t, e.m("dir\nwith\nnewlines"), 0o755)
	for _, n := range names {
		writeFile(t, e.m(n), "content of "+n, 0o644)
		writeFile(t, e.m("dir\nwith\nnewlines/"+n), n, 0o600)
	}
	must(t, os.Remove(e.m("old\nname")))
	must(t, e.st.Stage("\xff\xfe\xfd", labelOf(3)))
	e.commit(nil)
	requireTree(t, "W", snapshot(t, e.M), snapshot(t, e.W))
	e.reopen()
	if l, ok := e.st.Labels().Committed("\xff\xfe\xfd"); !ok || l != labelOf(3) {
		t.Errorf("label of an invalid UTF-8 name after restart: %v %v", l, ok)
	}
	e.requireNoChanges()
}

func TestHostileDepthAndLength(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.MaxDepth = 4 })
	mkdir(t, e.m("1/2/3/4/5/6"), 0o755)
	writeFile(t, e.m("1/2/3/4/f"), "ok", 0o644)
	writeFile(t, e.m("1/2/3/4/5/6/f"), "too deep", 0o644)
	want := []string{"create 1/2/3/4/f", "mkdir 1", "mkdir 1/2", "mkdir 1/2/3", "mkdir 1/2/3/4", "mkdir 1/2/3/4/5 !" + ReasonTooDeep}
	if d := cmp.Diff(want, opSummary(e.changes())); d != "" {
		t.Fatalf("Scan (-want +got):\n%s", d)
	}
	res := e.commit(nil)
	if res.Applied != 5 || len(res.Refused) != 1 {
		t.Fatalf("commit: %+v", res)
	}
	if _, err := os.Lstat(e.w("1/2/3/4/5")); !os.IsNotExist(err) {
		t.Fatalf("too-deep directory in W: %v", err)
	}

}

func TestHostileLongPaths(t *testing.T) {
	e := newEnv(t, nil, nil)
	// Paths longer than PATH_MAX, built with relative opens.
	name := strings.Repeat("L", 250)
	fd, err := unix.Open(e.M, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	depth := 0
	for rel := 0; rel+len(name)+1 <= maxPath; rel += len(name) + 1 {
		must(t, unix.Mkdirat(fd, name, 0o755))
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = next
		depth++
	}
	must(t, unix.Mkdirat(fd, name, 0o755)) // past 4095 bytes
	lfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	unix.Close(fd)
	fd = lfd
	ffd, err := unix.Openat(fd, "f", unix.O_CREAT|unix.O_WRONLY, 0o644)
	must(t, err)
	unix.Close(ffd)
	unix.Close(fd)
	cs := e.changes()
	var long []int
	for _, c := range cs {
		if c.Refused == ReasonTooLong {
			long = append(long, len(c.Path))
		} else if c.Refused != "" || len(c.Path) > maxPath {
			t.Errorf("change of %d bytes: op %v refused %q", len(c.Path), c.Op, c.Refused)
		}
	}
	if len(long) != 1 || len(cs) != depth+1 {
		var sum []string
		for _, c := range cs {
			sum = append(sum, fmt.Sprintf("%v/%d/%s", c.Op, len(c.Path), c.Refused))
		}
		t.Fatalf("%d changes (want %d), refused as too long: path lengths %v; %v", len(cs), depth+1, long, sum)
	}
	res := e.commit(nil)
	if len(res.Refused) != 1 || res.Applied != depth {
		t.Fatalf("commit: applied %d (want %d), %d refused", res.Applied, depth, len(res.Refused))
	}
	// Abort removes the long tree from M by descriptors.
	res = e.abort(nil)
	if len(res.Refused) != 0 {
		t.Fatalf("abort: %d refused: %.200s", len(res.Refused), res.Refused[0].Reason)
	}
	e.requireNoChanges()
}
