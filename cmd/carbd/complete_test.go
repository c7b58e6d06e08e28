package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// The completion scripts are valid for their shells, and bash's completes
// commands, forms and flags from the commands' own definitions.
func TestCompletionScripts(t *testing.T) {
	dir := t.TempDir()
	for _, sh := range []struct{ shell, check string }{{"bash", "-n"}, {"zsh", "-n"}, {"fish", "--no-execute"}} {
		code, out, errs := cli("completion", sh.shell)
		if code != 0 || errs != "" || out == "" {
			t.Fatalf("completion %s: exit %d stderr %q", sh.shell, code, errs)
		}
		p := filepath.Join(dir, "carbd."+sh.shell)
		if err := os.WriteFile(p, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		bin := testutil.RequireTool(t, sh.shell)
		if b, err := exec.Command(bin, sh.check, p).CombinedOutput(); err != nil {
			t.Errorf("%s %s: %v\n%s", sh.shell, sh.check, err, b)
		}
	}
	bash := testutil.RequireTool(t, "bash")
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{"carbd sta", []string{"status"}},
		{"carbd policy ch", []string{"check"}},
		{"carbd run --pol", []string{"--policy"}},
		{"carbd status --js", []string{"--json"}},
		{"carbd completion f", []string{"fish"}},
	} {
		script := ". " + filepath.Join(dir, "carbd.bash") + "\nCOMP_WORDS=(" + tc.words + ")\nCOMP_CWORD=$((${#COMP_WORDS[@]}-1))\n_carbd\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
		b, err := exec.Command(bash, "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%q: %v\n%s", tc.words, err, b)
		}
		got := strings.Fields(string(b))
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("complete %q: got %q, want %q", tc.words, got, tc.want)
		}
	}
}

// The manual page documents every command and form and every flag, and
// groff reads it without a warning.
func TestManPage(t *testing.T) {
	code, out, errs := cli("man")
	if code != 0 || errs != "" {
		t.Fatalf("man: exit %d stderr %q", code, errs)
	}
	for _, inv := range invocations() {
		if !strings.Contains(out, `.SS "carbd `+roff(strings.Join(inv, " "))+`"`) {
			t.Errorf("the manual has no section for carbd %s", strings.Join(inv, " "))
		}
	}
	if !strings.Contains(out, ".B \\-\\-workdir") || !strings.Contains(out, ".B \\-o") {
		t.Error("the manual lacks run's --workdir or calib's -o")
	}
	groff := testutil.RequireTool(t, "groff")
	cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z")
	cmd.Stdin = strings.NewReader(out)
	if b, err := cmd.CombinedOutput(); err != nil || len(b) > 0 {
		t.Errorf("groff: %v\n%s", err, b)
	}
}
