package agentdojo

import (
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// The suite policies read from a file system are those read from the
// directory, and a file system without any is an error naming it.
func TestLoadSuiteSpecsFS(t *testing.T) {
	fromDir, err := LoadSuiteSpecs(policyDir)
	if err != nil {
		t.Fatal(err)
	}
	fromFS, err := LoadSuiteSpecsFS(os.DirFS(policyDir), "examples/agentdojo")
	if err != nil {
		t.Fatal(err)
	}
	if len(fromFS) != len(Suites) || len(fromDir) != len(fromFS) {
		t.Fatalf("%d suites from the file system, %d from the directory, want %d", len(fromFS), len(fromDir), len(Suites))
	}
	for s, d := range fromDir {
		f := fromFS[s]
		if f == nil {
			t.Errorf("%s: missing", s)
			continue
		}
		if f.Policy.Name != "examples/agentdojo/"+s+".yaml" {
			t.Errorf("%s: policy name %q", s, f.Policy.Name)
		}
		if diff := cmp.Diff(d.Tool("send_money"), f.Tool("send_money")); diff != "" {
			t.Errorf("%s: send_money differs (-dir +fs):\n%s", s, diff)
		}
	}
	_, err = LoadSuiteSpecsFS(fstest.MapFS{"other.yaml": {Data: []byte("x")}}, "empty-place")
	if err == nil || !strings.Contains(err.Error(), "empty-place") {
		t.Errorf("no policies: error %v, want one naming empty-place", err)
	}
	_, err = LoadSuiteSpecsFS(fstest.MapFS{"banking.yaml": {Data: []byte("nonsense: [")}}, "bad")
	if err == nil || !strings.Contains(err.Error(), "bad/banking.yaml") {
		t.Errorf("a malformed policy: error %v, want one naming bad/banking.yaml", err)
	}
}
