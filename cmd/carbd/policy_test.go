package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

var examplePolicyPath = filepath.Join("..", "..", "examples", "policy.yaml")

func runPolicyCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func writePolicyFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyCheckValid(t *testing.T) {
	code, out, errs := runPolicyCLI(t, "policy", "check", examplePolicyPath)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	pol, err := decide.LoadPolicy(examplePolicyPath)
	if err != nil {
		t.Fatal(err)
	}
	if out != pol.Summary() {
		t.Errorf("stdout is not the policy's summary:\n%s\nwant:\n%s", out, pol.Summary())
	}
	if errs != "" {
		t.Errorf("stderr not empty: %q", errs)
	}
}

func TestPolicyCheckInvalid(t *testing.T) {
	bad := writePolicyFile(t, "bad.yaml", "version: 1\nlevels: [public, internal]\nparties:\n  - name: a\n    hosts: [a.com]\n    clearance: topsecret\nrefuse:\n  - name: nothing\n")
	code, out, errs := runPolicyCLI(t, "policy", "check", examplePolicyPath, bad)
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, errs)
	}
	want := bad + `:6:16: parties[0].clearance: level "topsecret" is not declared in levels (declared: public, internal)
` + bad + `:8:5: refuse[0]: refuse rule "nothing" has no selector and would refuse every effect: give ops, paths, hosts, cidrs or values
carbd policy check: 1 of 2 files invalid
`
	if errs != want {
		t.Errorf("stderr:\n%s\nwant:\n%s", errs, want)
	}
	// The valid file is still summarised.
	if !strings.HasPrefix(out, "policy "+examplePolicyPath+"\n") {
		t.Errorf("stdout does not summarise the valid file:\n%s", out)
	}
}

func TestPolicyCheckUnreadable(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	code, out, errs := runPolicyCLI(t, "policy", "check", missing)
	if code != 1 || out != "" {
		t.Fatalf("exit %d stdout %q, want 1 and nothing", code, out)
	}
	if !strings.Contains(errs, "decide: read policy: open "+missing+": no such file or directory") {
		t.Errorf("stderr: %q", errs)
	}
}

func TestPolicyUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // on stderr
	}{
		{[]string{"policy"}, "carbd policy: a subcommand is required (check or show)\n"},
		{[]string{"policy", "lint"}, `carbd policy: unknown subcommand "lint" (want check or show)`},
		{[]string{"policy", "check"}, "carbd policy check: no policy file given\nRun 'carbd policy check --help'"},
		{[]string{"policy", "check", "-x", examplePolicyPath}, "carbd policy check: flag provided but not defined: -x"},
		{[]string{"policy", "show"}, "carbd policy show: want exactly one policy file"},
	} {
		code, out, errs := runPolicyCLI(t, tt.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tt.want) {
			t.Errorf("%q: exit %d stdout %q stderr %q; want 2 and %q", tt.args, code, out, errs, tt.want)
		}
	}
	if code, out, _ := runPolicyCLI(t, "policy", "help"); code != 0 || !strings.Contains(out, "usage: carbd policy") {
		t.Errorf("policy help: exit %d, stdout %q", code, out)
	}
}

func TestPolicyShowRoundTrips(t *testing.T) {
	code, out, errs := runPolicyCLI(t, "policy", "show", examplePolicyPath)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
	// What show prints is a policy that checks, with the same summary.
	shown := writePolicyFile(t, "shown.yaml", out)
	code, sum, errs := runPolicyCLI(t, "policy", "check", shown)
	if code != 0 {
		t.Fatalf("check of shown policy: exit %d, stderr:\n%s\npolicy:\n%s", code, errs, out)
	}
	pol, err := decide.LoadPolicy(examplePolicyPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Replace(pol.Summary(), examplePolicyPath, shown, 1); sum != want {
		t.Errorf("summary of the shown policy:\n%s\nwant:\n%s", sum, want)
	}
	bad := writePolicyFile(t, "bad.yaml", "version: 1\n")
	if code, _, errs := runPolicyCLI(t, "policy", "show", bad); code != 1 || !strings.Contains(errs, bad+":1:1: levels is required") {
		t.Errorf("show of an invalid policy: exit %d, stderr %q", code, errs)
	}
}
