package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
)

// writeFieldFile writes 400 target fields (every 20th violated, scores
// i/400) and 3 credential fields.
func writeFieldFile(t *testing.T) (string, []byte) {
	var b bytes.Buffer
	for i := range 400 {
		v := i%20 == 19
		fmt.Fprintf(&b, `{"role":"target","score":%v,"violated":%v,"attacked":%v,"episode":"e%d"}`+"\n", float64(i)/400, v, v, i/4)
	}
	b.WriteString(`{"role":"credential","score":0.2,"violated":false,"attacked":false,"episode":"e1"}` + "\n")
	b.WriteString(`{"role":"credential","score":0.9,"violated":true,"attacked":true,"episode":"e2"}` + "\n")
	b.WriteString(`{"role":"credential","score":0.4,"violated":false,"attacked":true,"episode":"e3"}` + "\n")
	p := filepath.Join(t.TempDir(), "fields.jsonl")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b.Bytes()
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCalibFields(t *testing.T) {
	in, content := writeFieldFile(t)
	out := filepath.Join(t.TempDir(), "calib.json")
	code, stdout, stderr := runCLI("calib", "--fields", in, "--alpha", "target=0.05,credential=0.05", "--delta", "0.1", "-o", out)
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"STRATUM", "target", "pooled", "credential", "CERTIFIED", "wrote " + out} {
		if !strings.Contains(stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, stdout)
		}
	}
	a, err := calib.ReadArtifact(out)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	if len(a.Source.Files) != 1 || a.Source.Files[0].SHA256 != hex.EncodeToString(sum[:]) || a.Source.Records != 403 {
		t.Errorf("source %+v", a.Source)
	}
	// target: n=400, α=0.05: K = floor(20.05)-1 = 19; violated at 19/400,
	// 39/400, ...: the 20th is 399/400, so τ̂ = 398/400.
	if st := a.Stratum("target"); st.Threshold != 398.0/400 || st.K != 19 || st.Delta != 0.05 {
		t.Errorf("target stratum %+v", st)
	}
	// credential (n=3, floor 1/4 > 0.05) is pooled with the target fields.
	if a.RoleStratum[decide.RoleCredential] != calib.PooledStratum || a.Stratum(calib.PooledStratum).N != 403 {
		t.Errorf("role_stratum %v, pool %+v", a.RoleStratum, a.Stratum(calib.PooledStratum))
	}
	if a.Score != "ngram" || a.Options.Rule != calib.RuleCRC {
		t.Errorf("score %q rule %q", a.Score, a.Options.Rule)
	}

	// The options reach the artifact.
	code, stdout, stderr = runCLI("calib", "--fields", in, "--alpha", "target=0.05", "--episode", "--attacked-only",
		"--rule", "cp", "--score", "token", "--pool-with", "", "-o", out)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, stdout, stderr)
	}
	if a, err = calib.ReadArtifact(out); err != nil {
		t.Fatal(err)
	}
	if !a.Options.Episode || !a.Options.AttackedOnly || a.Options.Rule != calib.RuleCP || a.Score != "token" || len(a.Options.PoolWith) != 0 {
		t.Errorf("options %+v score %q", a.Options, a.Score)
	}
	if st := a.Stratum("target"); st.N != 20 || !strings.Contains(stdout, "episode-level losses") {
		t.Errorf("episode/attacked-only target stratum n=%d (want 20 episodes with attacked fields)\n%s", st.N, stdout)
	}
}

func TestCalibFieldsErrors(t *testing.T) {
	in, _ := writeFieldFile(t)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte(`{"role":"target","score":0.5,"violated":false,"attacked":false}`+"\n"+`{"role":"recipient","score":0.5,"violated":false,"attacked":false}`+"\n"), 0o644)
	dir := t.TempDir()
	out := filepath.Join(dir, "calib.json")
	other := t.TempDir()
	link := filepath.Join(other, "link.jsonl")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(in)
	cp := filepath.Join(other, "copy.jsonl")
	os.WriteFile(cp, data, 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no fields", []string{"calib", "--alpha", "target=0.1", "-o", out}, 2, "--fields, --alpha and -o are required"},
		{"no output", []string{"calib", "--fields", in, "--alpha", "target=0.1"}, 2, "--fields, --alpha and -o are required"},
		{"bad budget", []string{"calib", "--fields", in, "--alpha", "recipient=0.1", "-o", out}, 2, `unknown role "recipient"`},
		{"bad rule", []string{"calib", "--fields", in, "--alpha", "target=0.1", "--rule", "x", "-o", out}, 2, `unknown threshold rule "x"`},
		{"bad kind", []string{"calib", "--fields", in, "--alpha", "target=0.1", "--score", "x", "-o", out}, 2, `unknown similarity kind "x"`},
		{"bad pool", []string{"calib", "--fields", in, "--alpha", "target=0.1", "--pool-with", "x", "-o", out}, 2, `--pool-with: decide: unknown role "x"`},
		{"bad file", []string{"calib", "--fields", bad, "--alpha", "target=0.1", "-o", out}, 1, bad + `:2: decide: unknown role "recipient"`},
		{"missing file", []string{"calib", "--fields", filepath.Join(dir, "none"), "--alpha", "target=0.1", "-o", out}, 1, "none"},
		{"no data", []string{"calib", "--fields", in, "--alpha", "command=0.1", "-o", out}, 1, "role command has a budget but no calibration fields"},
		{"uncertified", []string{"calib", "--fields", in, "--alpha", "target=0.05,credential=0.05", "--require-certified", "-o", out}, 1, "not certifiable: target, pooled (nothing written)"},
		{"unknown form", []string{"calib", "nosuchform"}, 2, `unknown form "nosuchform"`},
		{"delta zero", []string{"calib", "--fields", in, "--alpha", "target=0.1", "--delta", "0", "-o", out}, 2, "--delta 0 outside (0,1)"},
		{"delta one", []string{"calib", "--fields", in, "--alpha", "target=0.1", "--delta", "1", "-o", out}, 2, "--delta 1 outside (0,1)"},
		{"file twice", []string{"calib", "--fields", in, "--fields", in, "--alpha", "target=0.1", "-o", out}, 2, "--fields: " + in + " is given twice"},
		{"same file", []string{"calib", "--fields", in, "--fields", link, "--alpha", "target=0.1", "-o", out}, 2, "--fields: " + in + " and " + link + " are the same file"},
		{"same content", []string{"calib", "--fields", in, "--fields", cp, "--alpha", "target=0.1", "-o", out}, 2, "--fields: " + cp + " has the same content as " + in},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q\nstdout: %s", code, stderr, tc.code, tc.want, stdout)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("a failed run left %s behind", out)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("temporary files left in the output directory: %v", entries)
	}
}

// Two different field files are read together, each recorded as a source.
func TestCalibFieldsTwoFiles(t *testing.T) {
	in, _ := writeFieldFile(t)
	second := filepath.Join(t.TempDir(), "more.jsonl")
	os.WriteFile(second, []byte(`{"role":"target","score":0.5,"violated":false,"attacked":false,"episode":"x"}`+"\n"), 0o644)
	out := filepath.Join(t.TempDir(), "calib.json")
	if code, stdout, stderr := runCLI("calib", "--fields", in, "--fields", second, "--alpha", "target=0.05", "-o", out); code != 0 {
		t.Fatalf("exit %d: %s%s", code, stdout, stderr)
	}
	a, err := calib.ReadArtifact(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Source.Files) != 2 || a.Source.Records != 404 {
		t.Errorf("source %+v, want 2 files and 404 records", a.Source)
	}
}

func TestCalibForms(t *testing.T) {
	var got []string
	registerCalibForm(&calibForm{name: "testform", synopsis: "ARGS", summary: "a test form", run: func(_ context.Context, _ *env, args []string) error {
		got = args
		return nil
	}})
	t.Cleanup(func() { unregisterCalibForm("testform") })
	if code, _, stderr := runCLI("calib", "testform", "a", "--b"); code != 0 || strings.Join(got, " ") != "a --b" {
		t.Fatalf("exit %d (%s), form got %q", code, stderr, got)
	}
	_, stdout, _ := runCLI("calib", "-h")
	if !strings.Contains(stdout, "testform") || !strings.Contains(stdout, "--fields FILE.jsonl") {
		t.Errorf("usage does not list the forms:\n%s", stdout)
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a form twice did not panic")
		}
	}()
	registerCalibForm(&calibForm{name: "testform"})
}

// TestCalibRequireCertifiedStrict: --require-certified accepts a stratum
// held at the strict rule (transfer with too few violated units blocks
// every field of the role: nothing is released on a score, so there is
// nothing to certify) and still refuses a relaxed, uncertified one.
func TestCalibRequireCertifiedStrict(t *testing.T) {
	in, _ := writeFieldFile(t)
	out := filepath.Join(t.TempDir(), "calib.json")
	code, stdout, stderr := runCLI("calib", "--fields", in, "--alpha", "target=0.01", "--rule", "transfer", "--require-certified", "-o", out)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q\nstdout: %s", code, stderr, stdout)
	}
	a, err := calib.ReadArtifact(out)
	if err != nil {
		t.Fatal(err)
	}
	st := a.Stratum("target")
	if !st.BlockAll || st.Certifiable {
		t.Fatalf("target stratum %+v: want held at the strict rule (block all, no certificate)", st)
	}
}
