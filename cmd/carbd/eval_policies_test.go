package main

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Without --policies, eval uses the example policies built into the
// binary, from any directory (this test runs in cmd/carbd, where no
// examples/agentdojo is), with the figures the same files on disk give.
func TestEvalBuiltInPolicies(t *testing.T) {
	dir := evalArchive(t, 20)
	args := []string{"eval", "agentdojo", "--runs", dir, "--splits", "4", "--ledger-alpha", "0.1", "--json"}
	report := func(extra ...string) map[string]any {
		t.Helper()
		code, stdout, stderr := runCLI(append(args, extra...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", extra, code, stderr)
		}
		var rep map[string]any
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	builtIn, onDisk := report(), report("--policies", evalPolicies)
	if got := builtIn["config"].(map[string]any)["policies"]; got != "examples/agentdojo (built in)" {
		t.Errorf("config.policies = %v, want the built-in policies named", got)
	}
	for _, r := range []map[string]any{builtIn, onDisk} {
		delete(r, "seconds")
		delete(r["config"].(map[string]any), "policies")
		for _, p := range r["pipelines"].([]any) {
			delete(p.(map[string]any), "seconds")
			delete(p.(map[string]any), "replays") // cache hits depend on the workers' timing
		}
	}
	if diff := cmp.Diff(onDisk, builtIn); diff != "" {
		t.Errorf("the built-in policies give other figures than %s (-disk +built in):\n%s", evalPolicies, diff)
	}
	code, _, stderr := runCLI("eval", "agentdojo", "--runs", dir, "--policies", t.TempDir(), "--splits", "4")
	if code == 0 {
		t.Errorf("a directory without policies was accepted:\n%s", stderr)
	}
}
