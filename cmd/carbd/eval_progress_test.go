package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/tty"
)

// Progress is drawn for a person at a terminal, never into a pipe, a file
// or a buffer, and not with --quiet.
func TestEvalProgress(t *testing.T) {
	dir := evalArchive(t, 20)
	args := []string{"eval", "agentdojo", "--runs", dir, "--policies", evalPolicies, "--splits", "4", "--ledger-alpha", "0.1", "--json"}
	code, _, stderr := runCLI(args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, no := range []string{"eval:", "loading:", "\r", "\033"} {
		if strings.Contains(stderr, no) {
			t.Errorf("stderr, not a terminal, holds %q:\n%q", no, stderr)
		}
	}
	onTerminal := func(extra ...string) string {
		term, ctl, err := tty.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		defer ctl.Close()
		got := make(chan string)
		go func() {
			b, _ := io.ReadAll(ctl) // ends with EIO once the terminal side is closed
			got <- string(b)
		}()
		var stdout bytes.Buffer
		code := run(context.Background(), append(args, extra...), &stdout, term)
		term.Close()
		out := <-got
		if code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
		return out
	}
	out := onTerminal()
	// One pipeline, 4 splits and no frontier: 4 splits in all.
	for _, want := range []string{"loading: 40 runs prepared", "eval: 4/4 splits, 100 % (p: splits)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the terminal shows no %q:\n%q", want, out)
		}
	}
	if out := onTerminal("--quiet"); strings.Contains(out, "eval:") || strings.Contains(out, "loading:") {
		t.Errorf("--quiet: the terminal shows progress:\n%q", out)
	}
}
