package staging

import (
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/go-cmp/cmp"
)

// Under lists the labels strictly below a directory, committed and
// pending (joined), and sees the index a commit installs.
func TestLabelsUnder(t *testing.T) {
	secret, internal := decide.Label{Level: 2}, decide.Label{Level: 1}
	l := newLabels(map[string]indexEntry{
		"d":         {Label: internal, HasLabel: true},
		"d/x":       {Label: secret, HasLabel: true},
		"d/sub/y":   {Label: internal, HasLabel: true},
		"d/created": {Created: true}, // no label
		"d.bak":     {Label: secret, HasLabel: true},
		"dx/z":      {Label: secret, HasLabel: true},
		"e/x":       {Label: secret, HasLabel: true},
	})
	l.stage("d/sub/y", secret)
	l.stage("d/new", internal)
	l.stage("dz", secret)
	want := map[string]decide.Label{"d/x": secret, "d/sub/y": secret, "d/new": internal}
	if diff := cmp.Diff(want, l.Under("d")); diff != "" {
		t.Errorf("Under(d) (-want +got):\n%s", diff)
	}
	if got := l.Under(""); len(got) != 0 {
		t.Errorf("Under(\"\"): %v, want none", got)
	}
	// A commit replaces the index: the listing follows it.
	l.install(map[string]indexEntry{"d/only": {Label: secret, HasLabel: true}}, []string{"d/sub/y", "d/new"})
	want = map[string]decide.Label{"d/only": secret}
	if diff := cmp.Diff(want, l.Under("d")); diff != "" {
		t.Errorf("Under(d) after a commit (-want +got):\n%s", diff)
	}
}
