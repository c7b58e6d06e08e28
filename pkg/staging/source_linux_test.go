package staging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// A file that holds the content of a labelled path of B at another path
// (moved there by a rename, a link or an exchange that the event stream
// may not have seen) joins that path's label, even once a commit removed
// the old path and its label. A file written in place, created with new
// content, empty, or moved from an unlabelled path has none.
func TestSourceLabel(t *testing.T) {
	secret, internal := labelOf(2), labelOf(1)
	r := newRunsEnv(t, nil)
	r.start()
	for p, l := range map[string]decide.Label{"notes.txt": secret, "notes2.txt": secret, "inplace.txt": internal,
		"twin.txt": internal, "empty.txt": secret} {
		content := "the content of " + p
		if p == "empty.txt" {
			content = ""
		}
		writeFile(t, filepath.Join(r.M, p), content, 0o644)
		must(t, r.st.Stage(p, l))
	}
	writeFile(t, filepath.Join(r.M, "plain.txt"), "plain", 0o644)
	r.commit()
	r.end(nil)

	// Run 2, untraced as far as this layer knows: renames, links, a
	// directory created and renamed, an exchange, writes in place.
	r.start()
	m := func(p string) string { return filepath.Join(r.M, p) }
	must(t, os.Rename(m("notes.txt"), m("public.txt")))
	must(t, os.Link(m("plain.txt"), m("plain-link.txt")))
	must(t, os.Link(m("twin.txt"), m("twin-link.txt")))
	must(t, os.Mkdir(m("d"), 0o755))
	must(t, os.Rename(m("notes2.txt"), m("d/x.txt")))
	must(t, os.Rename(m("d"), m("d2")))
	writeFile(t, m("exch.txt"), "exchange me", 0o644)
	must(t, unix.Renameat2(unix.AT_FDCWD, m("exch.txt"), unix.AT_FDCWD, m("inplace.txt"), unix.RENAME_EXCHANGE))
	writeFile(t, m("created.txt"), "new", 0o644)
	writeFile(t, m("empty2.txt"), "", 0o644)
	writeFile(t, m("same.txt"), "the content of notes2.txt", 0o644) // the same bytes, however they came

	got := map[string]string{}
	check := func() {
		t.Helper()
		clear(got)
		for _, c := range changesOf(t, r.st) {
			from, l, ok, err := r.st.SourceLabel(c)
			if err != nil {
				t.Fatalf("SourceLabel(%s): %v", c, err)
			}
			if ok {
				got[c.Path] = fmt.Sprintf("%s %d", from, l.Level)
			}
		}
	}
	check()
	want := map[string]string{
		"public.txt":    "notes.txt 2",
		"d2/x.txt":      "notes2.txt 2",
		"exch.txt":      "inplace.txt 1",
		"twin-link.txt": "twin.txt 1",
		"same.txt":      "notes2.txt 2",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("source labels (-want +got):\n%s", d)
	}
	// A commit of the removal forgets notes.txt's label; the content
	// B holds keeps it.
	var rm []Change
	for _, c := range changesOf(t, r.st) {
		if c.Path == "notes.txt" {
			rm = append(rm, c)
		}
	}
	if len(rm) != 1 {
		t.Fatalf("no staged removal of notes.txt: %v", changesOf(t, r.st))
	}
	if _, err := r.st.Commit(context.Background(), rm); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.st.Labels().Committed("notes.txt"); ok {
		t.Fatal("notes.txt's label is still committed after its removal: the test would not show the base's")
	}
	check()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("source labels after notes.txt's removal was committed (-want +got):\n%s", d)
	}
	r.end(nil)
}

func changesOf(t *testing.T, st *Stager) []Change {
	t.Helper()
	cs, err := st.Changes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// BenchmarkSourceLabel measures what SourceLabel costs the commit point
// with n labelled files in W (sizes spread over 4,096 values, as a
// repository's objects): first, the call that reads the sizes of B's
// labelled files (once a run); then one call for a staged file whose
// size matches a few of them (their hashes cached after the first).
func BenchmarkSourceLabel(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("labels=%d", n), func(b *testing.B) {
			base := b.TempDir()
			w := filepath.Join(base, "w")
			must(b, os.Mkdir(w, 0o755))
			idx := make(map[string]indexEntry, n)
			for i := 0; i < n; i++ {
				p := fmt.Sprintf("objects/%02x/%038x", i%256, i)
				must(b, os.MkdirAll(filepath.Join(w, filepath.Dir(p)), 0o755))
				must(b, os.WriteFile(filepath.Join(w, p), []byte(fmt.Sprintf("%0*d", 64+i%4096, i)), 0o644))
				idx[p] = indexEntry{Label: decide.Label{Level: 1}, HasLabel: true}
			}
			st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
			must(b, err)
			defer st.Close()
			must(b, st.Mount())
			defer st.Unmount()
			st.labels.install(idx, nil)
			st.labels.base = idx
			// A staged file of the size of objects 0, 4096, 8192, ...
			must(b, os.WriteFile(filepath.Join(st.Layout().Merged, "new.txt"), []byte(fmt.Sprintf("%064d", 1)), 0o644))
			cs, err := st.Changes(context.Background())
			must(b, err)
			if len(cs) != 1 {
				b.Fatalf("changes: %v", cs)
			}
			start := time.Now()
			if _, _, ok, err := st.SourceLabel(cs[0]); err != nil || ok {
				b.Fatalf("SourceLabel: %v %v", ok, err)
			}
			first := time.Since(start)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, _, ok, err := st.SourceLabel(cs[0]); err != nil || ok {
					b.Fatalf("SourceLabel: %v %v", ok, err)
				}
			}
			b.ReportMetric(float64(first.Microseconds()), "first-us")
		})
	}
}
