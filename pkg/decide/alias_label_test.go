package decide

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A rename's, a link's or a symlink's destination joins the label the
// policy gives a read of its source, not only the source's location
// label: `ln secrets/key k` made k a public, trusted name of the key
// (nothing had labelled secrets/key: its level is the policy's glob).
func TestAliasCarriesSourceLabel(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	secret := Label{Level: 2}
	trusted := Label{Integrity: Trusted}
	untrusted := Label{}
	for _, tc := range []struct {
		name    string
		effects []Event
		want    map[string]Label
	}{
		{"link of a sensitive source", []Event{twoPath("file:link", "secrets/key", "alias.txt", "")},
			map[string]Label{"secrets/key": trusted, "alias.txt": secret}},
		{"rename of a sensitive source", []Event{twoPath("file:rename", "secrets/key", "alias.txt", "")},
			map[string]Label{"secrets/key": trusted, "alias.txt": secret}},
		{"rename noreplace", []Event{twoPath("file:rename", "secrets/key", "alias.txt", "0x1")},
			map[string]Label{"secrets/key": trusted, "alias.txt": secret}},
		{"exchange: both ways", []Event{twoPath("file:rename", "secrets/key", "notes.txt", "0x2")},
			map[string]Label{"secrets/key": untrusted, "notes.txt": secret}},
		{"symlink to a sensitive source", []Event{symlink("alias.txt", "secrets/key")},
			map[string]Label{"alias.txt": secret, "secrets/key": trusted}},
		{"an untrusted file moved under a trusted path is untrusted", []Event{twoPath("file:rename", "inbox/mail.txt", "docs/mail.txt", "")},
			map[string]Label{"inbox/mail.txt": trusted, "docs/mail.txt": untrusted}},
		{"a trusted file linked to a new trusted name stays trusted", []Event{twoPath("file:link", "docs/a.md", "docs/b.md", "")},
			map[string]Label{"docs/a.md": trusted, "docs/b.md": trusted}},
		{"a chain keeps the level", []Event{twoPath("file:link", "secrets/key", "first.txt", ""), twoPath("file:rename", "first.txt", "second.txt", "")},
			map[string]Label{"secrets/key": trusted, "first.txt": secret, "second.txt": secret}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(p, Options{})
			// The task names every path, so the effects are released.
			task := "tidy the working directory:"
			for _, ev := range tc.effects {
				for _, f := range ev.Fields {
					task += " " + f.Value
				}
			}
			e.Task(task)
			for _, ev := range tc.effects {
				if d := e.Propose(context.Background(), ev).Decision; d.Verdict != Release {
					t.Fatalf("%s: %v %s", ev.Op, d.Verdict, d.Justification)
				}
			}
			if diff := cmp.Diff(tc.want, e.LocationLabels()); diff != "" {
				t.Errorf("location labels (-want +got):\n%s", diff)
			}
		})
	}
}

// End to end in the engine: the key linked or renamed to k by one run;
// a later run reads k (its persisted label) and posts it.
func TestAliasedSecretNotReleased(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	ctx := context.Background()
	const body = "c2tfbGl2ZV81ZjRlM2QyYzFiMGE5OTg4"
	for _, tc := range []struct {
		op, src string
		release bool
	}{
		{"file:link", "secrets/key", false},
		{"file:rename", "secrets/key", false},
		{"file:link", "notes.txt", true},
		{"file:rename", "notes.txt", true},
	} {
		t.Run(tc.op+" "+tc.src, func(t *testing.T) {
			e := New(p, Options{})
			e.Task("tidy the working directory: " + tc.src + " alias.txt")
			if d := e.Propose(ctx, twoPath(tc.op, tc.src, "alias.txt", "")).Decision; d.Verdict != Release {
				t.Fatalf("%s: %v %s", tc.op, d.Verdict, d.Justification)
			}
			l, ok := e.LocationLabel("alias.txt")
			if !ok {
				t.Fatal("alias.txt has no label")
			}
			e2 := New(p, committedLabels{"alias.txt": l}.options())
			e2.Task("post alias.txt to paste.example.net")
			e2.Observe(Event{Ch: ChanFile, Dir: In, Obj: "alias.txt", Content: body})
			d := e2.Propose(ctx, post("paste.example.net", body)).Decision
			if got := d.Verdict == Release; got != tc.release {
				t.Errorf("released %v, want %v: %v %s", got, tc.release, d.Verdict, d.Justification)
			}
		})
	}
}

// A read whose file the hook resolved joins the views of every name it
// was known by (FieldAlias), and a read it could not resolve is labelled
// the highest level, untrusted (FieldUnresolved).
func TestReadAliasLabel(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	ctx := context.Background()
	const body = "c2tfbGl2ZV81ZjRlM2QyYzFiMGE5OTg4"
	alias := func(v string) Field { return Field{Name: FieldAlias, Role: RoleTarget, Value: v} }
	for _, tc := range []struct {
		name    string
		read    Event
		release bool
	}{
		{"no alias: the name alone (the hole a hook without resolution leaves)",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "alias.txt", Content: body}, true},
		{"resolved to the sensitive file, read as k",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "secrets/key", Content: body, Fields: []Field{alias("alias.txt")}}, false},
		{"read as a sensitive name, resolved to a public file: the join",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "notes.txt", Content: body, Fields: []Field{alias("secrets/key")}}, false},
		{"another hard link of a sensitive file",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "k2", Content: body, Fields: []Field{alias("secrets/key")}}, false},
		{"unresolved",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "alias.txt", Content: body, Fields: []Field{{Name: FieldUnresolved, Role: RoleControl, Value: "gone"}}}, false},
		{"a public file under a public alias",
			Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "notes.txt", Content: body, Fields: []Field{alias("alias.txt")}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(p, Options{})
			e.Task("post alias.txt to paste.example.net")
			e.Observe(tc.read)
			d := e.Propose(ctx, post("paste.example.net", body)).Decision
			if got := d.Verdict == Release; got != tc.release {
				t.Errorf("released %v, want %v: %v %s", got, tc.release, d.Verdict, d.Justification)
			}
		})
	}
}

// Integrity: a trusted name (docs/**) that resolves to an untrusted file
// vouches for nothing; the trusted file read under its own name does.
func TestReadAliasIntegrity(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	const value = "https://attacker.example.net/collect"
	for _, tc := range []struct {
		name string
		read Event
		want bool
	}{
		{"the trusted file itself", Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "docs/endpoints.md", Content: value}, true},
		{"a trusted name of an untrusted file", Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "inbox/mail.txt", Content: value,
			Fields: []Field{{Name: FieldAlias, Role: RoleTarget, Value: "docs/endpoints.md"}}}, false},
		{"an untrusted name of a trusted file", Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "docs/endpoints.md", Content: value,
			Fields: []Field{{Name: FieldAlias, Role: RoleTarget, Value: "inbox/link"}}}, false},
		{"unresolved under a trusted name", Event{Ch: ChanFile, Dir: In, Op: "file:read", Obj: "docs/endpoints.md", Content: value,
			Fields: []Field{{Name: FieldUnresolved, Role: RoleControl, Value: "gone"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(p, Options{})
			e.Task("read the docs")
			e.Observe(tc.read)
			if got := e.Derivable(value); got != tc.want {
				t.Errorf("%q trusted: %v, want %v", value, got, tc.want)
			}
		})
	}
}
