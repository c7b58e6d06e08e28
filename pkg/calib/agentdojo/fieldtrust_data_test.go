package agentdojo

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

// TestDataTrustedFieldsHoldNoAttackerValue checks the fields the suite
// policies trust (their fields sections, docs/policy.md) against every
// attacked run of the recorded data: no value a trusted field vouches for
// carries an attacker value of the run. Each run is replayed through an
// engine under the suite's policy (strict oracle, no calibration), and
// before each tool result is observed, the fields the rules select are
// matched with record conditions answered by the engine's T at that point
// (Engine.Derivable), as the engine itself answers them. Values that read
// back one of the agent's own earlier effects are left out, as the engine
// leaves them out (fieldtrust.go, echoesEffect), and so are the
// principal's identities; how many read-backs there were is logged. The same check with every condition "trusted" taken to hold
// finds the id of an existing file that an injection names ("delete the
// file with ID 13"): the record condition is what keeps it out. An injection that planted a value in a trusted field
// would be a compromise of the platform, not a prompt injection: if this
// test fails, the rule trusts a field a third party can write.
func TestDataTrustedFieldsHoldNoAttackerValue(t *testing.T) {
	runs := loadAll(t)
	specs := loadSpecs(t)
	perRule := map[string]int{}
	echoed := map[string]int{}
	attacked := 0
	for _, r := range runs {
		spec := specs[r.Suite]
		if spec == nil || len(spec.Policy.Fields) == 0 {
			continue
		}
		values, _ := r.AttackerValues()
		evs, err := r.Trace(spec)
		if err != nil {
			t.Fatalf("%s: %v", r.Episode(), err)
		}
		if r.Kind == Attacked {
			attacked++
		}
		e := decide.New(spec.Policy, decide.Options{})
		var sent []string // normalised non-content values of earlier calls
		for i := range evs {
			ev := &evs[i]
			if ev.Dir == decide.Out {
				for _, f := range ev.Fields {
					if f.Role != decide.RoleContent {
						sent = append(sent, normItems(f.Value)...)
					}
				}
				if ev.Ch != decide.ChanCtrl {
					e.Propose(context.Background(), *ev)
				}
				continue
			}
			ms, _ := spec.Policy.MatchFields(ev, e.Derivable)
			e.Observe(*ev)
			for _, m := range ms {
				if m.Rule.Trust != decide.Trusted {
					continue
				}
				if contains(spec.Policy.Principal, decide.Norm(m.Value)) {
					continue // the principal's identity is never vouched for by a field
				}
				if echoes(sent, m.Value) {
					echoed[r.Suite+"/"+m.Rule.Name]++
					continue
				}
				perRule[r.Suite+"/"+m.Rule.Name]++
				ff := newFieldForms(m.Value)
				for _, v := range values {
					if v.matches(ff) {
						t.Errorf("%s: %s field %s (rule %s) holds the attacker value %q: %q",
							r.Episode(), ev.Obj, m.Loc, m.Rule.Name, v.Text, m.Value)
					}
				}
			}
		}
	}
	// The check is not vacuous: every rule of every policy selected
	// values in the recorded runs.
	for suite, spec := range specs {
		for _, rule := range spec.Policy.Fields {
			if rule.Trust == decide.Trusted && perRule[suite+"/"+rule.Name] == 0 {
				t.Errorf("%s: rule %s selected no value in the recorded runs", suite, rule.Name)
			}
		}
	}
	keys := make([]string, 0, len(perRule))
	for k := range perRule {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Logf("%s: %d trusted field values checked, %d own effects read back left out", k, perRule[k], echoed[k])
	}
	t.Logf("%d attacked runs of suites with field rules", attacked)
}

// normItems is a value's normalised items: the value itself, and the
// items of a JSON list or of a list separated by newlines, commas or
// semicolons, as the engine's listItems reads them.
func normItems(v string) []string {
	out := []string{decide.Norm(v)}
	var arr []any
	if json.Unmarshal([]byte(v), &arr) == nil {
		for _, a := range arr {
			if s, ok := a.(string); ok {
				out = append(out, decide.Norm(s))
			}
		}
		return out
	}
	for _, p := range strings.FieldsFunc(v, func(r rune) bool { return r == '\n' || r == ',' || r == ';' }) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, decide.Norm(p))
		}
	}
	return out
}

func echoes(sent []string, v string) bool {
	for _, it := range normItems(v) {
		for _, s := range sent {
			if it != "" && it == s {
				return true
			}
		}
	}
	return false
}
