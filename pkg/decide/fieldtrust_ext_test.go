package decide_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
)

// TestAgentDojoPoliciesRoundTrip: the AgentDojo suite policies, with
// their fields sections, print in canonical form and parse back to the
// same policy.
func TestAgentDojoPoliciesRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "examples", "agentdojo", "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("want the 4 suite policies, got %v, %v", files, err)
	}
	rules := 0
	for _, file := range files {
		pol, err := decide.LoadPolicy(file)
		if err != nil {
			t.Fatal(err)
		}
		rules += len(pol.Fields)
		for _, r := range pol.Fields {
			if r.Reason == "" || len(r.Path) == 0 {
				t.Errorf("%s: rule %s without reason or path", file, r.Name)
			}
		}
		out, err := pol.YAML()
		if err != nil {
			t.Fatal(err)
		}
		again, err := decide.ParsePolicy(file, out)
		if err != nil {
			t.Fatalf("%s: canonical form does not parse: %v\n%s", file, err, out)
		}
		if d := cmp.Diff(pol, again, policyCmp...); d != "" {
			t.Errorf("%s: round trip changed the policy (-first +second):\n%s", file, d)
		}
	}
	if rules == 0 {
		t.Error("no field rule in the AgentDojo policies")
	}
}

func TestFieldsSummary(t *testing.T) {
	pol, err := decide.LoadPolicy(filepath.Join("testdata", "policy", "valid-fields.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const want = "  fields      5 rules: own-payees (trusted recipient), own-mail-recipients (trusted *.recipients), named-file-ids (trusted id_), api-account-ids (trusted data.accounts.*.id), catalogue-reviews (untrusted *.reviews)\n"
	if got := pol.Summary(); !strings.Contains(got, want) {
		t.Errorf("Summary has no line %q:\n%s", want, got)
	}
	pol, err = decide.LoadPolicy(filepath.Join("testdata", "policy", "valid-banking.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(pol.Summary(), "fields") {
		t.Errorf("a policy without field rules has a fields line:\n%s", pol.Summary())
	}
}
