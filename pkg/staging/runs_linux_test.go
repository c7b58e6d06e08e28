package staging

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
)

// runsEnv is one working directory used by many runs: each run opens the
// staging (a fresh base from W as it is), mounts, lets the agent and the
// user work, commits, finishes and unmounts.
type runsEnv struct {
	t     *testing.T
	cfg   Config
	W, M  string
	st    *Stager
	runID string
}

func newRunsEnv(t *testing.T, populate func(w string)) *runsEnv {
	t.Helper()
	testutil.RequireRoot(t)
	base := t.TempDir()
	r := &runsEnv{t: t, W: filepath.Join(base, "work")}
	must(t, os.Mkdir(r.W, 0o755))
	if populate != nil {
		populate(r.W)
	}
	// W's state apart from its layers, as carbd run lays them out.
	r.cfg = Config{WorkDir: r.W, StateDir: filepath.Join(base, "var-lib", "w1"), LayerDir: filepath.Join(base, "layers")}
	t.Cleanup(func() {
		if r.st != nil {
			unix.Unmount(r.st.Layout().Merged, unix.MNT_DETACH)
			r.st.Close()
		}
	})
	return r
}

func (r *runsEnv) start() {
	r.t.Helper()
	st, err := Open(r.cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := st.Mount(); err != nil {
		st.Close()
		r.t.Fatal(err)
	}
	r.st, r.M, r.runID = st, st.Layout().Merged, st.RunID()
}

// end finishes the run, keeping what keep says, and unmounts.
func (r *runsEnv) end(keep func(Change) bool) []Conflict {
	r.t.Helper()
	cfs, err := r.st.Finish(context.Background(), keep)
	if err != nil {
		r.t.Fatal(err)
	}
	must(r.t, r.st.Unmount())
	must(r.t, r.st.Close())
	r.st = nil
	return cfs
}

func (r *runsEnv) commit() *Result {
	r.t.Helper()
	res, err := r.st.Commit(context.Background(), nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return res
}

// files reads the regular files below root (relative path -> content).
func files(t testing.TB, root string) map[string]string {
	out := map[string]string{}
	for p, e := range snapshot(t, root) {
		if e.Type == TypeFile {
			out[p] = e.Data
		}
	}
	return out
}

// The model-based test of many runs on one working directory, with the
// user editing W between runs and during them (in place, by replacing
// rename, creating, removing and renaming): every run's agent starts
// from W as it is; a staged change is committed exactly when the user
// left the path alone since the agent's view of it; every other one is
// reported as a conflict with the agent's version kept; W always equals
// the model, so no user edit is ever lost.
func TestManyRunsUserEdits(t *testing.T) {
	for _, seed := range []int64{1, 2, 3, 4, 5, 6, 7, 8} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { manyRuns(t, seed, 12) })
	}
}

var runNames = []string{"f0", "f1", "f2", "f3", "f4", "d/g0", "d/g1", "d/g2"}

func manyRuns(t *testing.T, seed int64, runs int) {
	rng := rand.New(rand.NewSource(seed))
	r := newRunsEnv(t, func(w string) {
		mkdir(t, filepath.Join(w, "d"), 0o755)
		writeFile(t, filepath.Join(w, "f0"), "initial f0", 0o644)
		writeFile(t, filepath.Join(w, "d/g0"), "initial g0", 0o644)
	})
	n := 0
	content := func(who string) string {
		n++
		return fmt.Sprintf("%s %d %d\n", who, n, rng.Intn(1000))
	}
	model := files(t, r.W) // W as it must be
	// Inode identity: the base shares W's inodes (a hard-link farm), so
	// a write in place in W shows in the agent's view of an entry it has
	// not copied up. wid: W's path -> inode; vid: the view's path -> the
	// W inode it still shares (0: the agent's own copy).
	wid, vid := map[string]int{}, map[string]int{}
	nextID := 0
	newID := func() int { nextID++; return nextID }
	for p := range model {
		wid[p] = newID()
	}
	var view map[string]string // the agent's view (M) during a run
	var log []string
	logf := func(format string, args ...any) { log = append(log, fmt.Sprintf(format, args...)) }
	fail := func(format string, args ...any) {
		t.Helper()
		tail := log
		if len(tail) > 60 {
			tail = tail[len(tail)-60:]
		}
		t.Fatalf("seed %d: %s\nlast steps:\n  %s", seed, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
	}
	pick := func(m map[string]string, present bool) string {
		var ps []string
		for _, p := range runNames {
			if _, ok := m[p]; ok == present {
				ps = append(ps, p)
			}
		}
		if len(ps) == 0 {
			return ""
		}
		return ps[rng.Intn(len(ps))]
	}
	// Versions: every change of a W path by the user or a commit gives it
	// a new version; basever is the version the agent's view has. A
	// staged change of a path conflicts when the versions differ (0:
	// absent).
	wver, basever := map[string]int{}, map[string]int{}
	nextVer := 0
	newVer := func() int { nextVer++; return nextVer }
	for p := range model {
		wver[p] = newVer()
	}
	// The user, on W.
	user := func() {
		w := func(p string) string { return filepath.Join(r.W, p) }
		switch rng.Intn(5) {
		case 0: // write in place (same inode)
			if p := pick(model, true); p != "" {
				c := content("user-inplace")
				writeFileInPlace(t, w(p), c)
				model[p] = c
				wver[p] = newVer()
				for q, id := range vid {
					if id != 0 && id == wid[p] && view != nil {
						view[q] = c // shown through the base
					}
				}
				logf("user writes %s in place", p)
			}
		case 1: // replace by rename (a new inode), as editors do
			if p := pick(model, true); p != "" {
				c := content("user-replace")
				writeFile(t, w(p)+".tmp~", c, 0o644)
				must(t, os.Rename(w(p)+".tmp~", w(p)))
				model[p] = c
				wid[p] = newID()
				wver[p] = newVer()
				logf("user replaces %s", p)
			}
		case 2: // create
			if p := pick(model, false); p != "" {
				c := content("user-create")
				writeFile(t, w(p), c, 0o644)
				model[p] = c
				wid[p] = newID()
				wver[p] = newVer()
				logf("user creates %s", p)
			}
		case 3: // remove
			if p := pick(model, true); p != "" {
				must(t, os.Remove(w(p)))
				delete(model, p)
				delete(wid, p)
				delete(wver, p)
				logf("user removes %s", p)
			}
		case 4: // rename
			p, q := pick(model, true), pick(model, false)
			if p != "" && q != "" {
				must(t, os.Rename(w(p), w(q)))
				model[q], wid[q] = model[p], wid[p]
				delete(model, p)
				delete(wid, p)
				wver[q] = newVer()
				delete(wver, p)
				logf("user renames %s to %s", p, q)
			}
		}
	}
	for run := 0; run < runs; run++ {
		// Between runs the user edits W.
		for i := rng.Intn(3); i > 0; i-- {
			user()
		}
		r.start()
		logf("run %d starts (%s)", run, r.runID)
		// The agent starts from W as it is now.
		if d := cmp.Diff(snapshot(t, r.W), snapshot(t, r.M)); d != "" {
			fail("run %d: the merged view is not W at the start (-W +M):\n%s", run, d)
		}
		view = files(t, r.M)
		clear(vid)
		for p := range view {
			vid[p] = wid[p]
		}
		base := cloneFiles(view) // W as the agent's view has it: the base, then its commits
		clear(basever)
		for p, v := range wver {
			basever[p] = v
		}
		kept := map[string]string{} // conflicts of this run: path -> the agent's kept content ("" removal)
		for point := 0; point < 3; point++ {
			for i := rng.Intn(4) + 1; i > 0; i-- {
				m := func(p string) string { return filepath.Join(r.M, p) }
				switch rng.Intn(4) {
				case 0, 1: // write (create or overwrite)
					p := runNames[rng.Intn(len(runNames))]
					c := content("agent")
					writeFile(t, m(p), c, 0o644)
					view[p] = c
					vid[p] = 0
					logf("agent writes %s", p)
				case 2: // remove
					if p := pick(view, true); p != "" {
						must(t, os.Remove(m(p)))
						delete(view, p)
						delete(vid, p)
						logf("agent removes %s", p)
					}
				case 3: // rename
					p, q := pick(view, true), runNames[rng.Intn(len(runNames))]
					if p != "" && p != q {
						must(t, os.Rename(m(p), m(q)))
						view[q], vid[q] = view[p], 0 // copied up
						delete(view, p)
						delete(vid, p)
						logf("agent renames %s to %s", p, q)
					}
				}
				if rng.Intn(2) == 0 {
					user()
				}
			}
			// The commit point: what the model expects.
			wantConflicts := map[string]string{}
			for _, p := range runNames {
				v, inView := view[p]
				b, inBase := base[p]
				if inView && vid[p] != 0 {
					continue // the agent's view shows a base inode: no change of the agent's
				}
				if inView == inBase && v == b {
					continue // not changed by the agent since its view of W
				}
				if w, inW := model[p]; inW == inView && w == v {
					// The user made the same change: nothing to commit
					// (the scan compares the staged entry with W).
					if inView {
						base[p] = v
					} else {
						delete(base, p)
					}
					basever[p] = wver[p] // the agent's view now has W's version
					continue
				}
				if wver[p] != basever[p] {
					wantConflicts[p] = v
					continue
				}
				if inView {
					model[p], base[p] = v, v
					wid[p] = newID() // a new inode renamed into W
					wver[p] = newVer()
					basever[p] = wver[p]
				} else {
					delete(model, p)
					delete(base, p)
					delete(wid, p)
					delete(wver, p)
					delete(basever, p)
				}
			}
			res := r.commit()
			logf("commit point %d: applied %d, conflicts %v, refused %v", point, res.Applied, res.Conflicts, res.Refused)
			if len(res.Refused) > 0 {
				fail("refused: %v", res.Refused)
			}
			got := map[string]string{}
			for _, cf := range res.Conflicts {
				v := ""
				if cf.Kept != "" {
					b, err := os.ReadFile(cf.Kept)
					if err != nil {
						fail("conflict %v: the agent's version: %v", cf, err)
					}
					v = string(b)
				}
				got[cf.Path] = v
				if !strings.HasPrefix(cf.Reason, "conflict:") {
					fail("conflict %v has no conflict reason", cf)
				}
			}
			if d := cmp.Diff(wantConflicts, got); d != "" {
				fail("run %d point %d: conflicts (path -> agent's kept version) (-want +got):\n%s", run, point, d)
			}
			for p, v := range got {
				kept[p] = v
			}
			if d := cmp.Diff(model, files(t, r.W)); d != "" {
				fail("run %d point %d: W is not the model (-model +W):\n%s", run, point, d)
			}
		}
		cfs := r.end(func(Change) bool { return true })
		if len(cfs) != 0 {
			fail("Finish kept %v: every released change was committed or is a conflict already kept", cfs)
		}
		// The run's conflicts are in its report, one line per report.
		if len(kept) > 0 {
			rep, err := os.ReadFile(filepath.Join(r.cfg.StateDir, "conflicts", r.runID, "report"))
			if err != nil {
				fail("conflicts report: %v", err)
			}
			for p := range kept {
				if !strings.Contains(string(rep), fmt.Sprintf("%q", p)) {
					fail("the conflicts report lacks %q:\n%s", p, rep)
				}
			}
		}
		if d := cmp.Diff(model, files(t, r.W)); d != "" {
			fail("after run %d: W is not the model (-model +W):\n%s", run, d)
		}
	}
	// The layers of the finished runs are gone but for the last run's.
	if ents, err := os.ReadDir(filepath.Join(r.cfg.StateDir, "conflicts")); err == nil {
		t.Logf("seed %d: %d runs with conflicts", seed, len(ents))
	}
}

func cloneFiles(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// The directory cases: the agent removes a directory the user added a
// file to; the agent writes into a directory the user removed. Neither
// side is lost.
func TestConflictDirectories(t *testing.T) {
	r := newRunsEnv(t, func(w string) {
		mkdir(t, filepath.Join(w, "old"), 0o755)
		writeFile(t, filepath.Join(w, "old/a"), "a", 0o644)
		mkdir(t, filepath.Join(w, "gone"), 0o755)
		writeFile(t, filepath.Join(w, "gone/b"), "b", 0o644)
	})
	r.start()
	must(t, os.RemoveAll(filepath.Join(r.M, "old")))
	writeFile(t, filepath.Join(r.M, "gone/new"), "agent's new file", 0o644)
	writeFile(t, filepath.Join(r.W, "old/user.txt"), "the user's new file", 0o644)
	must(t, os.RemoveAll(filepath.Join(r.W, "gone")))
	must(t, r.st.Stage("gone/new", labelOf(2)))
	res := r.commit()
	var got, want []string
	for _, cf := range res.Conflicts {
		got = append(got, cf.Path+": "+cf.Reason)
	}
	sort.Strings(got)
	want = []string{"gone: " + ConflictRemoved, "gone/new: " + ConflictParent, "old: " + ConflictBelow}
	sort.Strings(want)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("conflicts (-want +got):\n%s", d)
	}
	if b, err := os.ReadFile(filepath.Join(r.W, "old/user.txt")); err != nil || string(b) != "the user's new file" {
		t.Fatalf("the user's file: %q %v", b, err)
	}
	for _, cf := range res.Conflicts {
		if cf.Path == "gone/new" {
			if b, err := os.ReadFile(cf.Kept); err != nil || string(b) != "agent's new file" {
				t.Fatalf("the agent's file kept at %q: %q %v", cf.Kept, b, err)
			}
		}
	}
	rep, err := os.ReadFile(filepath.Join(r.cfg.StateDir, "conflicts", r.runID, "report"))
	if err != nil || !strings.Contains(string(rep), "\"gone/new\"\t"+ConflictParent+"\tlabel=level:2,") {
		t.Fatalf("the conflicts report does not give the agent's version's label: %q %v", rep, err)
	}
	r.end(func(Change) bool { return true })
	// The next run starts from W as the user left it.
	r.start()
	if d := cmp.Diff(snapshot(t, r.W), snapshot(t, r.M)); d != "" {
		t.Fatalf("the next run's view is not W (-W +M):\n%s", d)
	}
	r.end(nil)
}

// A run that did not finish (carbd killed) is resumed: its staged
// changes are still there to decide, and still checked against the
// stamps of its base, which survive the restart.
func TestResumeKeepsStamps(t *testing.T) {
	r := newRunsEnv(t, func(w string) { writeFile(t, filepath.Join(w, "x"), "base", 0o644) })
	r.start()
	writeFile(t, filepath.Join(r.M, "x"), "agent", 0o644)
	writeFileInPlace(t, filepath.Join(r.W, "x"), "user")
	// carbd dies: no Finish, the mount stays.
	must(t, r.st.Close())
	st, err := Open(r.cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.st = st
	if st.Fresh() {
		t.Fatal("the unfinished run's layers were discarded")
	}
	must(t, st.Mount())
	res := r.commit()
	if len(res.Conflicts) != 1 || res.Conflicts[0].Reason != ConflictWritten || res.Applied != 0 {
		t.Fatalf("resumed commit: %+v", res)
	}
	if b, _ := os.ReadFile(filepath.Join(r.W, "x")); string(b) != "user" {
		t.Fatalf("the user's in-place write was overwritten: %q", b)
	}
	r.end(func(Change) bool { return true })
	if _, err := os.Stat(filepath.Join(r.cfg.LayerDir, "base")); !errors.Is(err, os.ErrNotExist) {
		// Finished: the next Open discards the layers; they are still
		// there until then.
		t.Logf("layers kept until the next Open: %v", err)
	}
}

// A user edit that lands while a commit prepares (after the path was
// checked, before it is applied) is not replaced: the commit rolls back
// (the agent's changes stay staged) and the next commit reports the
// conflict.
func TestLateUserEditDuringCommit(t *testing.T) {
	for _, how := range []string{"in place", "replace"} {
		t.Run(how, func(t *testing.T) {
			r := newRunsEnv(t, func(w string) {
				writeFile(t, filepath.Join(w, "a"), "base a", 0o644)
				writeFile(t, filepath.Join(w, "b"), "base b", 0o644)
			})
			r.start()
			writeFile(t, filepath.Join(r.M, "a"), "agent a", 0o644)
			writeFile(t, filepath.Join(r.M, "b"), "agent b", 0o644)
			faultHook = func(point string) {
				if point != "applying" {
					return
				}
				faultHook = nil
				if how == "in place" {
					writeFileInPlace(t, filepath.Join(r.W, "b"), "user b")
				} else {
					writeFile(t, filepath.Join(r.W, "b.tmp"), "user b", 0o644)
					must(t, os.Rename(filepath.Join(r.W, "b.tmp"), filepath.Join(r.W, "b")))
				}
			}
			defer func() { faultHook = nil }()
			_, err := r.st.Commit(context.Background(), nil)
			if !errors.Is(err, errLateConflict) {
				t.Fatalf("commit with a user edit during it: %v, want errLateConflict", err)
			}
			if d := cmp.Diff(map[string]string{"a": "base a", "b": "user b"}, files(t, r.W)); d != "" {
				t.Fatalf("W after the rolled-back commit (-want +got):\n%s", d)
			}
			res := r.commit()
			if len(res.Conflicts) != 1 || res.Conflicts[0].Path != "b" || res.Applied != 1 {
				t.Fatalf("the next commit: %+v", res)
			}
			if d := cmp.Diff(map[string]string{"a": "agent a", "b": "user b"}, files(t, r.W)); d != "" {
				t.Fatalf("W after the next commit (-want +got):\n%s", d)
			}
			if b, err := os.ReadFile(res.Conflicts[0].Kept); err != nil || string(b) != "agent b" {
				t.Fatalf("the agent's b kept: %q %v", b, err)
			}
			r.end(nil)
		})
	}
}

// A finished run's layers are removed by Discard: nothing of the run is
// left beside W, and the next run builds a fresh base.
func TestDiscardLeavesNothing(t *testing.T) {
	r := newRunsEnv(t, func(w string) { writeFile(t, filepath.Join(w, "x"), "x", 0o644) })
	r.start()
	writeFile(t, filepath.Join(r.M, "y"), "y", 0o644)
	r.commit()
	if _, err := r.st.Finish(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	must(t, r.st.Unmount())
	must(t, r.st.Discard())
	must(t, r.st.Close())
	r.st = nil
	if _, err := os.Lstat(r.cfg.LayerDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the layer directory is still there: %v", err)
	}
	if d := cmp.Diff(map[string]string{"x": "x", "y": "y"}, files(t, r.W)); d != "" {
		t.Fatalf("W (-want +got):\n%s", d)
	}
	r.start()
	if !r.st.Fresh() {
		t.Fatal("the next run did not build a fresh base")
	}
	// Without Finish (a crash), Discard keeps the layers for the next run.
	writeFile(t, filepath.Join(r.M, "z"), "z", 0o644)
	must(t, r.st.Unmount())
	must(t, r.st.Discard())
	r.st = nil
	r.start()
	if r.st.Fresh() {
		t.Fatal("the unfinished run's layers were discarded")
	}
	if res := r.commit(); res.Applied != 1 {
		t.Fatalf("the resumed run's staged change: %+v", res)
	}
	r.end(nil)
}

// The labels of paths W lost between runs (the user removed them; a git
// gc on the host packed the agent's loose objects) are forgotten when the
// next run builds its base, and the index shrinks; a path W still has, a
// path the user recreated beside a removed sibling, and a file whose
// parent the user replaced with a file keep or lose theirs as W says.
// Kept, such labels grew the index (rewritten whole at every commit) by
// every path an agent ever wrote (docs/soak.md).
func TestLabelsOfRemovedPathsForgotten(t *testing.T) {
	r := newRunsEnv(t, nil)
	r.start()
	for _, p := range []string{"keep.txt", "gone.txt", "d/gone.txt", "d/kept.txt", "e/f.txt"} {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(r.M, p)), 0o755))
		writeFile(t, filepath.Join(r.M, p), p, 0o644)
		must(t, r.st.Stage(p, labelOf(2)))
	}
	r.commit()
	r.end(nil)
	indexSize := func() int64 {
		fi, err := os.Stat(filepath.Join(r.cfg.StateDir, "index"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := indexSize()
	// The user, between runs: removes two files, replaces directory e
	// by a file (e/f.txt is then ENOTDIR).
	must(t, os.Remove(filepath.Join(r.W, "gone.txt")))
	must(t, os.Remove(filepath.Join(r.W, "d", "gone.txt")))
	must(t, os.RemoveAll(filepath.Join(r.W, "e")))
	writeFile(t, filepath.Join(r.W, "e"), "the user's file", 0o644)
	r.start()
	if !r.st.Fresh() {
		t.Fatal("not a fresh base")
	}
	got := map[string]bool{}
	for _, p := range []string{"keep.txt", "gone.txt", "d/gone.txt", "d/kept.txt", "e/f.txt", "e"} {
		_, got[p] = r.st.Labels().Committed(p)
	}
	want := map[string]bool{"keep.txt": true, "d/kept.txt": true, "gone.txt": false, "d/gone.txt": false, "e/f.txt": false, "e": false}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("committed labels after the user's removals (-want +got):\n%s", d)
	}
	if after := indexSize(); after >= before {
		t.Fatalf("the index did not shrink: %d bytes before, %d after", before, after)
	}
	r.end(nil)
	// And they stay forgotten after a restart (the index on disk).
	r.start()
	if _, ok := r.st.Labels().Committed("gone.txt"); ok {
		t.Fatal("gone.txt's label came back")
	}
	if _, ok := r.st.Labels().Committed("keep.txt"); !ok {
		t.Fatal("keep.txt lost its label")
	}
	r.end(nil)
}
