package staging

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
)

// TestEventShowsWhatIsCommitted: the staging layer's event of a change
// shows every part of it a decision needs: the mode as committed (named
// as the traced file:create and file:chmod events name it), the changed
// user.* attributes with their values, and the whole changed content up
// to the bound, past which it says it was cut.
func TestEventShowsWhatIsCommitted(t *testing.T) {
	old := strings.Repeat("0123456789", 100)
	e := newEnv(t, func(w string) {
		writeFile(t, filepath.Join(w, "tagged"), "same", 0o644)
		must(t, unix.Setxattr(filepath.Join(w, "tagged"), "user.kept", []byte("unchanged"), 0))
		writeFile(t, filepath.Join(w, "big"), old, 0o644)
		writeFile(t, filepath.Join(w, "both"), "same", 0o644)
		must(t, os.Mkdir(filepath.Join(w, "d"), 0o755))
	}, func(c *Config) { c.ContentMargin = 4; c.ContentLimit = 64 })
	must(t, os.MkdirAll(e.m(".git/hooks"), 0o755))
	writeFile(t, e.m(".git/hooks/post-checkout"), "#!/bin/sh\n", 0o755)
	writeFile(t, e.m("plain"), "text", 0o644)
	must(t, unix.Setxattr(e.m("plain"), "user.note", []byte("carried value"), 0))
	must(t, unix.Setxattr(e.m("tagged"), "user.added", []byte("new value"), 0))
	// A change of 100 bytes in the middle: over the bound of 64.
	writeFile(t, e.m("big"), old[:400]+strings.Repeat("x", 100)+old[500:], 0o644)
	// A chmod and an attribute at once (a chmod change), and attributes
	// on directories, old and new.
	must(t, os.Chmod(e.m("both"), 0o600))
	must(t, unix.Setxattr(e.m("both"), "user.both", []byte("with the chmod"), 0))
	must(t, unix.Setxattr(e.m("d"), "user.dir", []byte("on a directory"), 0))
	must(t, os.Mkdir(e.m("nd"), 0o700))
	must(t, unix.Setxattr(e.m("nd"), "user.new", []byte("on a new directory"), 0))
	got := map[string][]decide.Field{}
	for _, c := range e.changes() {
		ev, err := e.st.Event(c)
		if err != nil {
			t.Fatalf("Event(%v): %v", c, err)
		}
		got[c.Path] = ev.Fields
	}
	field := func(n string, r decide.Role, v string) decide.Field { return decide.Field{Name: n, Role: r, Value: v} }
	path := func(p string) decide.Field { return field("path", decide.RoleTarget, p) }
	ctl, content := decide.RoleControl, decide.RoleContent
	want := map[string][]decide.Field{
		".git/hooks/post-checkout": {path(".git/hooks/post-checkout"), field("mode", ctl, "0755"), field("data", content, "#!/bin/sh\n")},
		"plain": {path("plain"), field("mode", ctl, "0644"), field("xattr", ctl, "user.note"), field("user.note", content, "carried value"),
			field("data", content, "text")},
		// Only the attribute that changed; no content (same as W's).
		"tagged":     {path("tagged"), field("xattr", ctl, "user.added"), field("user.added", content, "new value")},
		"both":       {path("both"), field("mode", ctl, "0600"), field("xattr", ctl, "user.both"), field("user.both", content, "with the chmod")},
		"d":          {path("d"), field("xattr", ctl, "user.dir"), field("user.dir", content, "on a directory")},
		"nd":         {path("nd"), field("mode", ctl, "0700"), field("xattr", ctl, "user.new"), field("user.new", content, "on a new directory")},
		".git":       {path(".git"), field("mode", ctl, "0755")},
		".git/hooks": {path(".git/hooks"), field("mode", ctl, "0755")},
		"big": {path("big"), field("mode", ctl, "0644"), field("truncated", ctl, "64 of 108 changed bytes at offset 396"),
			field("data", content, old[396:400]+strings.Repeat("x", 60))},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("fields (-want +got):\n%s", d)
	}
}

// TestEventXattrBound: attribute values past the bound are not shown,
// and the event says so.
func TestEventXattrBound(t *testing.T) {
	e := newEnv(t, nil, func(c *Config) { c.ContentLimit = 64 })
	writeFile(t, e.m("f"), "x", 0o600)
	must(t, unix.Setxattr(e.m("f"), "user.a", []byte(strings.Repeat("a", 40)), 0))
	must(t, unix.Setxattr(e.m("f"), "user.b", []byte(strings.Repeat("b", 40)), 0))
	cs := e.changes()
	if len(cs) != 1 {
		t.Fatalf("changes %v", cs)
	}
	ev, err := e.st.Event(cs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []decide.Field{
		{Name: "path", Role: decide.RoleTarget, Value: "f"},
		{Name: "mode", Role: decide.RoleControl, Value: "0600"},
		{Name: "xattr", Role: decide.RoleControl, Value: "user.a"},
		{Name: "user.a", Role: decide.RoleContent, Value: strings.Repeat("a", 40)},
		{Name: "truncated", Role: decide.RoleControl, Value: "1 user.* attribute values (40 bytes) not shown: over the bound of 64 bytes"},
		{Name: "data", Role: decide.RoleContent, Value: "x"},
	}
	if d := cmp.Diff(want, ev.Fields); d != "" {
		t.Errorf("fields (-want +got):\n%s", d)
	}
}
