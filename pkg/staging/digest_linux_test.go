package staging

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCommitRefusesChangedMetadata: the digest a change is committed on
// covers its mode and user.* xattrs as well as its content: a file whose
// mode or xattrs change after the scan (the decision) is not committed
// (nothing of it reaches W, W keeps its version), the other changes of
// the same commit are, and the next scan reports the change again with
// its new digest, which then commits.
func TestCommitRefusesChangedMetadata(t *testing.T) {
	e := newEnv(t, func(w string) {
		writeFile(t, filepath.Join(w, "m"), "m0", 0o644)
		writeFile(t, filepath.Join(w, "x"), "x0", 0o644)
	}, nil)
	writeFile(t, e.m("m"), "m1", 0o644)
	writeFile(t, e.m("x"), "x1", 0o644)
	writeFile(t, e.m("ok"), "fine", 0o644)
	cs := e.changes()
	must(t, os.Chmod(e.m("m"), 0o755))
	must(t, unix.Setxattr(e.m("x"), "user.late", []byte("v"), 0))
	res := e.commit(cs)
	var refused []string
	for _, r := range res.Refused {
		if r.Reason != ReasonChanged {
			t.Errorf("refusal %v, want %q", r, ReasonChanged)
		}
		refused = append(refused, r.Path)
	}
	sort.Strings(refused)
	if res.Applied != 1 || len(refused) != 2 || refused[0] != "m" || refused[1] != "x" {
		t.Fatalf("commit: applied %d, refused %v; want ok applied, m and x refused", res.Applied, refused)
	}
	if readFile(t, e.w("ok")) != "fine" || readFile(t, e.w("m")) != "m0" || readFile(t, e.w("x")) != "x0" {
		t.Fatalf("W: ok %q m %q x %q", readFile(t, e.w("ok")), readFile(t, e.w("m")), readFile(t, e.w("x")))
	}
	if st, err := os.Stat(e.w("m")); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("W m: %v %v, want mode 0644", st.Mode(), err)
	}
	// Nothing of the refused changes was journaled (the commit's journal
	// is gone: nothing to recover either).
	if _, err := os.Stat(e.st.Layout().Journal); !os.IsNotExist(err) {
		t.Fatalf("journal after the commit: %v", err)
	}
	// Decided again on what they hold now: committed.
	again := e.changes()
	if len(again) != 2 {
		t.Fatalf("changes after the refusal: %v, want m and x", again)
	}
	before := map[string][32]byte{}
	for _, c := range cs {
		before[c.Path] = c.Digest
	}
	for _, c := range again {
		if d, ok := before[c.Path]; !ok || c.Digest == d {
			t.Errorf("%s: same digest after its mode or xattrs changed", c.Path)
		}
	}
	if res := e.commit(again); res.Applied != 2 || len(res.Refused) != 0 {
		t.Fatalf("second commit: %+v", res)
	}
	if st, err := os.Stat(e.w("m")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("W m after the second commit: %v %v, want 0755", st.Mode(), err)
	}
	v := make([]byte, 8)
	n, err := unix.Getxattr(e.w("x"), "user.late", v)
	if err != nil || string(v[:max(n, 0)]) != "v" {
		t.Errorf("W x's user.late after the second commit: %q %v", v[:max(n, 0)], err)
	}
}
