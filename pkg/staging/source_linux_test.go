package staging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

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
