package decide

import (
	"context"
	"testing"
)

// A file effect proved to hold what the location's decided writes
// produced keeps the label those writes gave it; without the proof, or
// without a label for the location, it is labelled with what the agent
// has read by now.
func TestWrittenAsDecidedLabel(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		proved      bool
		writeBefore bool // the decided write came before the secret read
		wantSecret  bool
	}{
		{"proved, written before the read", true, true, false},
		{"not proved", false, true, true},
		{"proved, no earlier write", true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(p, Options{})
			e.Task("write out/notes.txt and post to api.example.com")
			if tc.writeBefore {
				if d := e.Propose(ctx, write("out/notes.txt", "weekly numbers")).Decision; d.Verdict != Release {
					t.Fatalf("write: %v %s", d.Verdict, d.Justification)
				}
			}
			e.Observe(Event{Ch: ChanFile, Dir: In, Obj: "secrets/token", Content: "tok_9f8e7d6c5b4a39281"})
			secret := e.LocationLabels()["out/notes.txt"] // zero if never written
			ev := write("out/notes.txt", "weekly numbers")
			ev.WrittenAsDecided = tc.proved
			if d := e.Propose(ctx, ev).Decision; d.Verdict != Release {
				t.Fatalf("staged write: %v %s", d.Verdict, d.Justification)
			}
			l := e.LocationLabels()["out/notes.txt"]
			if tc.writeBefore && l.Level < secret.Level {
				t.Errorf("label %+v lower than the location's earlier %+v", l, secret)
			}
			e.Observe(Event{Ch: ChanFile, Dir: In, Obj: "out/notes.txt", Content: "weekly numbers"})
			// What a read of the location carries decides a post of
			// its content to a host not cleared for secrets.
			e2 := New(p, Options{LocationLabel: func(path string) (Label, bool) {
				if path == "out/notes.txt" {
					return l, true
				}
				return Label{}, false
			}})
			e2.Task("post out/notes.txt to paste.example.net")
			e2.Observe(Event{Ch: ChanFile, Dir: In, Obj: "out/notes.txt", Content: "weekly numbers"})
			got := e2.readLabel.Level > (Label{}).Level
			if got != tc.wantSecret {
				t.Errorf("label %+v: sensitive %v, want %v", l, got, tc.wantSecret)
			}
		})
	}
}
