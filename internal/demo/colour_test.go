package demo

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/tty"
	"github.com/carbd/carbd/pkg/daemon"
)

// The demo colours its headings only on a terminal, and not with NO_COLOR.
func TestDemoColour(t *testing.T) {
	term, ctl, err := tty.OpenPTY()
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	defer term.Close()
	env := func(noColor string) func(string) string {
		return func(k string) string {
			switch k {
			case "TERM":
				return "xterm"
			case "NO_COLOR":
				return noColor
			}
			return ""
		}
	}
	res := &Result{Workdir: t.TempDir(), Summary: &daemon.Summary{}, Status: "sandbox demo holds 1 effects",
		World: []Request{{Host: "evil.example", Method: "POST", Path: "/", Body: Secret}}}
	for _, c := range []struct {
		name    string
		out     io.Writer
		noColor string
		want    bool
	}{
		{"terminal", term, "", true},
		{"terminal with NO_COLOR", term, "1", false},
		{"pipe or file", &bytes.Buffer{}, "", false},
	} {
		st := newStyle(c.out, env(c.noColor))
		var buf bytes.Buffer
		report(&buf, st, res)
		if got := strings.Contains(buf.String(), "\033["); got != c.want {
			t.Errorf("%s: colour codes %v, want %v:\n%q", c.name, got, c.want, buf.String())
		}
		for _, want := range []string{"what the world received", "THE CERTIFICATE LEFT THE SANDBOX"} {
			if !strings.Contains(buf.String(), want) {
				t.Errorf("%s: the report lacks %q", c.name, want)
			}
		}
	}
}
