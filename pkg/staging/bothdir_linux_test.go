package staging

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The agent and the user both create directory d during a run (both
// sides' git writing a new .git/objects/XX/): the user's d/b, which the
// agent's view never had, is no change of the agent's. It was a phantom
// unlink (a decision, and a conflict) at every commit point; under a
// policy refusing unlinks below .git/objects a phantom refusal
// (docs/soak.md). The agent's own removal of what carbd committed into
// the directory this run is still one.
func TestBothCreateDirectory(t *testing.T) {
	r := newRunsEnv(t, func(w string) { writeFile(t, filepath.Join(w, "x"), "x", 0o644) })
	r.start()
	must(t, os.Mkdir(filepath.Join(r.M, "d"), 0o755))
	writeFile(t, filepath.Join(r.M, "d", "a"), "agent", 0o644)
	must(t, os.Mkdir(filepath.Join(r.W, "d"), 0o755))
	writeFile(t, filepath.Join(r.W, "d", "b"), "user", 0o644)
	ops := func() []string {
		cs, err := r.st.Changes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return opSummary(cs)
	}
	if d := cmp.Diff([]string{"create d/a"}, ops()); d != "" {
		t.Fatalf("changes (-want +got):\n%s", d)
	}
	if res := r.commit(); res.Applied != 1 || len(res.Conflicts) != 0 {
		t.Fatalf("commit: %+v", res)
	}
	// The agent removes its committed file: a removal of W's d/a.
	must(t, os.Remove(filepath.Join(r.M, "d", "a")))
	if d := cmp.Diff([]string{"unlink d/a"}, ops()); d != "" {
		t.Fatalf("changes after the agent's removal (-want +got):\n%s", d)
	}
	if res := r.commit(); res.Applied != 1 || len(res.Conflicts) != 0 {
		t.Fatalf("commit of the removal: %+v", res)
	}
	r.end(nil)
	if d := cmp.Diff(map[string]string{"x": "x", "d/b": "user"}, files(t, r.W)); d != "" {
		t.Fatalf("W (-want +got):\n%s", d)
	}
}
