package staging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
)

// The crash tests run a commit (or a recovery) in a child process, the
// test binary re-executed, which SIGKILLs itself at the k-th journal
// step; the parent then recovers and checks that W is exactly the state
// before or after the commit, for every k.

const (
	envCrashState = "CARBD_STAGING_CRASH_STATE"
	envCrashWork  = "CARBD_STAGING_CRASH_WORK"
	envCrashAt    = "CARBD_STAGING_CRASH_AT"
	envCrashMode  = "CARBD_STAGING_CRASH_MODE"
	envCrashLayer = "CARBD_STAGING_CRASH_LAYERS"
)

// crashLabels are staged by the child before it commits.
var crashLabels = map[string]decide.Label{
	"mod.txt":         {Integrity: decide.Untrusted, Level: 2},
	"new\xff\nfile":   {Integrity: decide.Untrusted, Level: 1},
	"newdir/sub/file": {Integrity: decide.Trusted, Level: 3},
}

// TestCrashChild is the child process of the crash tests.
func TestCrashChild(t *testing.T) {
	state := os.Getenv(envCrashState)
	if state == "" {
		t.Skip("helper process of the crash tests")
	}
	at, err := strconv.Atoi(os.Getenv(envCrashAt))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	hook := func(point string) {
		n++
		if n == at {
			fmt.Fprintf(os.Stderr, "CRASH %d %s\n", n, point)
			unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		}
	}
	cfg := Config{WorkDir: os.Getenv(envCrashWork), StateDir: state, LayerDir: os.Getenv(envCrashLayer)}
	if os.Getenv(envCrashMode) == "recover" {
		faultHook = hook
	}
	st, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if os.Getenv(envCrashMode) == "commit" {
		for p, l := range crashLabels {
			must(t, st.Stage(p, l))
		}
		faultHook = hook
		if _, err := st.Commit(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Fprintf(os.Stderr, "DONE %d\n", n)
}

type crashCase struct {
	e       *env
	before  map[string]entry
	after   map[string]entry
	changes []string
	idx     []byte // the index file before the commit
}

// setupCrash prepares a crash case; split puts the state directory on
// a filesystem of its own (a tmpfs) and the layers and the journal
// beside W, as carbd run does, so the commit's index images and its
// journal are on two filesystems.
func setupCrash(t *testing.T, split bool) *crashCase {
	tweak := func(cfg *Config) {
		if !split {
			return
		}
		cfg.LayerDir = filepath.Join(filepath.Dir(cfg.StateDir), "layers")
		must(t, os.MkdirAll(cfg.StateDir, 0o700))
		must(t, unix.Mount("tmpfs", cfg.StateDir, "tmpfs", 0, "size=16m"))
		t.Cleanup(func() { unix.Unmount(cfg.StateDir, unix.MNT_DETACH) })
	}
	e := newEnv(t, func(w string) {
		writeFile(t, filepath.Join(w, "keep.txt"), "keep", 0o644)
		writeFile(t, filepath.Join(w, "mod.txt"), "old content", 0o644)
		writeFile(t, filepath.Join(w, "gone.txt"), "bye", 0o644)
		mkdir(t, filepath.Join(w, "dir/sub"), 0o755)
		writeFile(t, filepath.Join(w, "dir/a"), "a", 0o644)
		writeFile(t, filepath.Join(w, "dir/sub/b"), "b", 0o644)
		mkdir(t, filepath.Join(w, "chm"), 0o755)
		writeFile(t, filepath.Join(w, "chm/x"), "x", 0o644)
		writeFile(t, filepath.Join(w, "f2d"), "file to become a dir", 0o644)
		mkdir(t, filepath.Join(w, "d2f"), 0o755)
		writeFile(t, filepath.Join(w, "d2f/c"), "c", 0o644)
		writeFile(t, filepath.Join(w, "weird\nname"), "w", 0o644)
		must(t, os.Symlink("keep.txt", filepath.Join(w, "link")))
	}, tweak)
	// A first commit, so that the crashing one replaces an index.
	writeFile(t, e.m("seed.txt"), "seed", 0o644)
	must(t, e.st.Stage("seed.txt", decide.Label{Level: 1}))
	e.commit(nil)

	writeFile(t, e.m("mod.txt"), "new content", 0o644)
	writeFile(t, e.m("new\xff\nfile"), "binary-safe name", 0o644)
	must(t, os.Remove(e.m("gone.txt")))
	must(t, os.RemoveAll(e.m("dir")))
	must(t, os.Chmod(e.m("chm"), 0o700))
	must(t, unix.Setxattr(e.m("chm"), "user.a", []byte("1"), 0))
	must(t, os.Remove(e.m("f2d")))
	mkdir(t, e.m("f2d"), 0o755)
	writeFile(t, e.m("f2d/child"), "child", 0o644)
	must(t, os.RemoveAll(e.m("d2f")))
	writeFile(t, e.m("d2f"), "dir became a file", 0o644)
	writeFile(t, e.m("weird\nname"), "changed", 0o644)
	must(t, os.Remove(e.m("link")))
	must(t, os.Symlink("mod.txt", e.m("link")))
	mkdir(t, e.m("newdir/sub"), 0o755)
	writeFile(t, e.m("newdir/sub/file"), "deep", 0o644)
	writeFile(t, e.m("suid"), "#!/bin/sh\n", 0o755)
	must(t, unix.Chmod(e.m("suid"), 0o4755))

	c := &crashCase{e: e, before: snapshot(t, e.W), after: snapshot(t, e.M)}
	s := c.after["suid"]
	s.Mode = 0o755 // committed without the setuid bit
	c.after["suid"] = s
	c.changes = opSummary(e.changes())
	var err error
	c.idx, err = os.ReadFile(e.st.Layout().Index)
	must(t, err)
	e.st.Close() // the child takes the lock; the mount stays
	return c
}

// runChild runs the crash child; it returns the crash point, or "" and
// the number of steps when the child finished.
func runChild(t *testing.T, c *crashCase, mode string, at int) (point string, steps int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), envCrashState+"="+c.e.S, envCrashWork+"="+c.e.W, envCrashLayer+"="+c.e.cfg.LayerDir,
		envCrashAt+"="+strconv.Itoa(at), envCrashMode+"="+mode)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	for _, line := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "CRASH "); ok {
			_, p, _ := strings.Cut(rest, " ")
			if err == nil {
				t.Fatalf("child reported a crash at %s but exited normally", p)
			}
			return p, 0
		}
		if rest, ok := strings.CutPrefix(line, "DONE "); ok && err == nil {
			n, _ := strconv.Atoi(rest)
			return "", n
		}
	}
	t.Fatalf("child (%s at %d): %v\n%s", mode, at, err, out.String())
	return "", 0
}

// committedAt reports whether a crash at this point must recover to the
// state after the commit: only once the done marker is on disk.
func committedAt(point string) bool {
	return point == "done" || point == "cleaned"
}

// verify recovers in this process and checks the outcome.
func (c *crashCase) verify(t *testing.T, committed bool, what string) {
	t.Helper()
	e := c.e
	e.open()
	rec := e.st.Recovery()
	got := snapshot(t, e.W)
	want, wantName := c.before, "before"
	if committed {
		want, wantName = c.after, "after"
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("%s: recovery %+v: W is not the state %s the commit (-want +got):\n%s", what, rec, wantName, d)
	}
	if _, err := os.Lstat(e.st.Layout().Journal); !os.IsNotExist(err) {
		t.Fatalf("%s: journal left after recovery: %v", what, err)
	}
	for p, l := range crashLabels {
		got, ok := e.st.Labels().Committed(p)
		if committed && (!ok || got != l) {
			t.Fatalf("%s: label of %q = %v %v, want %v", what, p, got, ok, l)
		}
		if !committed && ok {
			t.Fatalf("%s: label of %q committed by a rolled-back commit", what, p)
		}
	}
	if l, ok := e.st.Labels().Committed("seed.txt"); !ok || l.Level != 1 {
		t.Fatalf("%s: the earlier commit's label was lost", what)
	}
	if !committed {
		// Nothing staged was lost: the same changes are pending, and
		// committing them now gives the state after.
		if d := cmp.Diff(c.changes, opSummary(e.changes())); d != "" {
			t.Fatalf("%s: staged changes after rollback (-want +got):\n%s", what, d)
		}
		for p, l := range crashLabels {
			must(t, e.st.Stage(p, l))
		}
		e.commit(nil)
		if d := cmp.Diff(c.after, snapshot(t, e.W)); d != "" {
			t.Fatalf("%s: commit after rollback (-want +got):\n%s", what, d)
		}
	}
	e.requireNoChanges()
	requireTree(t, what+": M", c.after, stripSuid(snapshot(t, e.M)))
}

func stripSuid(m map[string]entry) map[string]entry {
	if s, ok := m["suid"]; ok {
		s.Mode &= 0o777
		m["suid"] = s
	}
	return m
}

func TestCrashDuringCommit(t *testing.T) {
	t.Run("one directory", func(t *testing.T) { crashDuringCommit(t, false) })
	t.Run("state apart from the layers", func(t *testing.T) { crashDuringCommit(t, true) })
}

func crashDuringCommit(t *testing.T, split bool) {
	seen := make(map[string]bool)
	for k := 1; ; k++ {
		c := setupCrash(t, split)
		point, steps := runChild(t, c, "commit", k)
		if point == "" {
			if steps != k-1 {
				t.Fatalf("child finished after %d steps, but crashed at every step below %d", steps, k)
			}
			c.verify(t, true, "no crash")
			t.Logf("%d crash points covered: %v", k-1, keys(seen))
			break
		}
		seen[point] = true
		c.verify(t, committedAt(point), fmt.Sprintf("crash at step %d (%s)", k, point))
		if k > 500 {
			t.Fatal("too many steps")
		}
	}
	for _, p := range []string{"prepare:begin", "prepare:image", "prepare:index", "prepare:synced", "prepared",
		"applying", "apply:moved", "apply:unlinked", "apply:op", "apply:index", "apply:synced", "done", "cleaned"} {
		if !seen[p] {
			t.Errorf("crash point %s never reached", p)
		}
	}
}

// A crash during the recovery of a crashed commit: recovering again
// still yields exactly the state before.
func TestCrashDuringRecovery(t *testing.T) {
	t.Run("one directory", func(t *testing.T) { crashDuringRecovery(t, false) })
	t.Run("state apart from the layers", func(t *testing.T) { crashDuringRecovery(t, true) })
}

func crashDuringRecovery(t *testing.T, split bool) {
	// Find the steps of a full commit and crash after half of its
	// operations are applied (most to roll back).
	c := setupCrash(t, split)
	_, total := runChild(t, c, "commit", 1<<30)
	c.verify(t, true, "full commit")
	applyAt := total * 3 / 4
	seen := make(map[string]bool)
	for j := 1; ; j++ {
		c := setupCrash(t, split)
		point, _ := runChild(t, c, "commit", applyAt)
		if committedAt(point) || !strings.HasPrefix(point, "apply") {
			t.Fatalf("step %d of %d is %s, not in the apply phase", applyAt, total, point)
		}
		rpoint, steps := runChild(t, c, "recover", j)
		if rpoint == "" {
			if steps != j-1 {
				t.Fatalf("recovery finished after %d steps, expected %d", steps, j-1)
			}
			c.verify(t, false, "recovered in the child")
			t.Logf("%d recovery crash points covered: %v", j-1, keys(seen))
			break
		}
		seen[rpoint] = true
		c.verify(t, false, fmt.Sprintf("crash at recovery step %d (%s)", j, rpoint))
		if j > 500 {
			t.Fatal("too many steps")
		}
	}
	for _, p := range []string{"rollback:op", "rollback:index", "rollback:synced", "recover:removed"} {
		if !seen[p] {
			t.Errorf("recovery crash point %s never reached", p)
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}
