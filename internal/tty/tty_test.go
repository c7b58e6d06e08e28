package tty

import (
	"bytes"
	"io"
	"os"
	"testing"
)

// openPTY opens a pseudo-terminal pair and returns its terminal side.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	term, ctl, err := OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close(); ctl.Close() })
	return term
}

func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for name, out := range map[string]io.Writer{"pipe": w, "file": file, "buffer": &bytes.Buffer{}, "nil file": (*os.File)(nil)} {
		if IsTerminal(out) {
			t.Errorf("%s: taken for a terminal", name)
		}
	}
	if pts := openPTY(t); !IsTerminal(pts) {
		t.Error("a pseudo-terminal not taken for a terminal")
	}
}

func TestColour(t *testing.T) {
	pts := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, c := range []struct {
		name string
		out  *os.File
		env  func(string) string
		want bool
	}{
		{"terminal", pts, env("TERM", "xterm"), true},
		{"terminal without TERM", pts, env(), true},
		{"terminal, NO_COLOR=1", pts, env("TERM", "xterm", "NO_COLOR", "1"), false},
		{"terminal, NO_COLOR empty", pts, env("TERM", "xterm", "NO_COLOR", ""), true},
		{"dumb terminal", pts, env("TERM", "dumb"), false},
		{"pipe", w, env("TERM", "xterm"), false},
	} {
		if got := Colour(c.out, c.env); got != c.want {
			t.Errorf("%s: Colour = %v, want %v", c.name, got, c.want)
		}
	}
}
