package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// cli runs carbd's command line in process.
func cli(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// invocations lists every command, and every form of a command that has
// forms, as the words that name it.
func invocations() [][]string {
	var out [][]string
	for _, n := range commandNames() {
		c := commands[n]
		if len(c.forms) == 0 || c.formsOptional {
			out = append(out, []string{n})
		}
		for _, f := range c.forms {
			out = append(out, []string{n, f.name})
		}
	}
	return out
}

// The conventions every command keeps: help on stdout with status 0; a
// usage mistake on stderr, the error first and at most one hint line,
// status 2, nothing on stdout.
func TestCLIConventions(t *testing.T) {
	for _, inv := range invocations() {
		name := strings.Join(inv, " ")
		t.Run(name, func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				code, out, errs := cli(append(inv, h)...)
				if code != 0 || errs != "" || !strings.HasPrefix(out, "usage: carbd "+name) {
					t.Errorf("%s %s: exit %d, stdout %q, stderr %q; want 0 and the usage on stdout", name, h, code, clip(out), errs)
				}
			}
			code, out, errs := cli(append(inv, "--no-such-flag")...)
			lines := strings.Split(strings.TrimSpace(errs), "\n")
			if code != 2 || out != "" || len(lines) > 2 || !strings.HasPrefix(lines[0], "carbd "+name+": ") || !strings.Contains(lines[0], "no-such-flag") {
				t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want 2, the error first, one hint", name, code, clip(out), errs)
			}
		})
	}
	if code, out, _ := cli("--help"); code != 0 || !strings.HasPrefix(out, "usage: carbd COMMAND") {
		t.Errorf("--help: exit %d stdout %q", code, clip(out))
	}
	if code, out, errs := cli(); code != 2 || out != "" || !strings.Contains(errs, "a command is required") {
		t.Errorf("no command: exit %d stdout %q stderr %q", code, clip(out), errs)
	}
	if code, _, errs := cli("stauts"); code != 2 || !strings.Contains(errs, "Did you mean 'carbd status'?") {
		t.Errorf("a mistyped command: exit %d stderr %q", code, errs)
	}
	for _, v := range [][]string{{"--version"}, {"version"}} {
		if code, out, errs := cli(v...); code != 0 || errs != "" || !strings.HasPrefix(out, "carbd ") || !strings.Contains(out, "go1.") {
			t.Errorf("%v: exit %d stdout %q stderr %q", v, code, out, errs)
		}
	}
	if code, out, _ := cli("help", "status"); code != 0 || !strings.HasPrefix(out, "usage: carbd status") {
		t.Errorf("help status: exit %d stdout %q", code, clip(out))
	}
}

// Commands that take no positional argument refuse one before doing
// anything.
func TestCLIUnexpectedArguments(t *testing.T) {
	for _, inv := range [][]string{{"status"}, {"held"}, {"audit", "--pcap", "x.pcapng", "in.pcapng"}, {"demo"}, {"version"},
		{"replay", "--policy", "p", "--trace", "t"}} {
		code, out, errs := cli(append(inv, "extra")...)
		if code != 2 || out != "" || !strings.Contains(errs, `unexpected argument "extra"`) {
			t.Errorf("%v extra: exit %d stdout %q stderr %q", inv, code, clip(out), errs)
		}
	}
}

// A missing required flag is one line, not the whole usage.
func TestCLIConciseErrors(t *testing.T) {
	code, out, errs := cli("run", "--policy", "p.yaml", "--", "true")
	if code != 2 || out != "" || strings.Count(errs, "\n") > 2 || !strings.HasPrefix(errs, "carbd run: ") {
		t.Errorf("run without --workdir: exit %d stdout %q stderr %q", code, clip(out), errs)
	}
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
