package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseEnvArg(t *testing.T) {
	lookup := func(name string) (string, bool) {
		if name == "HOST_KEY" {
			return "from-the-host-1234", true
		}
		return "", false
	}
	for _, tc := range []struct {
		arg  string
		want envVar
		err  string
	}{
		{arg: "HOST_KEY", want: envVar{Name: "HOST_KEY", Value: "from-the-host-1234"}},
		{arg: "HOST_KEY@api.github.com,github.com", want: envVar{Name: "HOST_KEY", Value: "from-the-host-1234", Hosts: []string{"api.github.com", "github.com"}}},
		{arg: "K=v@lue@api.openai.com", want: envVar{Name: "K", Value: "v@lue", Hosts: []string{"api.openai.com"}, Inline: true}},
		{arg: "K=sk-123=x", want: envVar{Name: "K", Value: "sk-123=x", Inline: true}},
		{arg: "K=", want: envVar{Name: "K", Value: "", Inline: true}},
		{arg: "LANG=C.UTF-8@*", want: envVar{Name: "LANG", Value: "C.UTF-8", Hosts: []string{"*"}, Inline: true}},
		{arg: "UNSET_ONE", err: "UNSET_ONE is not set in carbd's environment"},
		{arg: "K=v@", err: "empty binding"},
		{arg: "HOST_KEY@", err: "empty binding"},
		{arg: "K=v@a,,b", err: "empty host"},
		{arg: "9K=v", err: "environment variable name"},
		{arg: "=v", err: "environment variable name"},
	} {
		got, err := parseEnvArg(tc.arg, lookup)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("--env %s: error %v, want %q", tc.arg, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("--env %s: %v", tc.arg, err)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("--env %s (-want +got):\n%s", tc.arg, d)
		}
	}
}

func TestParseEnvFile(t *testing.T) {
	got, err := parseEnvFile("agent.env", []byte("# keys\n\nOPENAI_API_KEY=sk-abc@def=1\r\nexport GH=\"ghp quoted\"\n  SINGLE='a b'  \nEMPTY=\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []envVar{{Name: "OPENAI_API_KEY", Value: "sk-abc@def=1"}, {Name: "GH", Value: "ghp quoted"}, {Name: "SINGLE", Value: "a b"}, {Name: "EMPTY"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	_, err = parseEnvFile("agent.env", []byte("OK=1\nno equals sign here\n1BAD=x\nQ=\"open\nSECRET_LOOKING=hunter2hunter2\n"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"agent.env:2: want NAME=VALUE", `agent.env:3: "1BAD" is not an environment variable name`, "agent.env:4: Q: unterminated quote"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "open") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("an error quotes a value: %q", err)
	}
	dir := t.TempDir()
	if _, err := readEnvFile(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "env file") {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("A=1\n", maxEnvFile/4+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readEnvFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("big file: %v", err)
	}
}

// FuzzParseEnvFile: the parser never panics, every variable it returns
// has a valid name, and its errors never hold a value's text beyond the
// name.
func FuzzParseEnvFile(f *testing.F) {
	f.Add([]byte("A=1\n# c\nexport B='x y'\n"))
	f.Add([]byte("=\n\"\n'a\nK=\"v\x00\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		vars, err := parseEnvFile("f", data)
		if err != nil {
			return
		}
		for _, v := range vars {
			if v.Name == "" || strings.ContainsAny(v.Name, "=\n ") || strings.IndexByte(v.Value, 0) >= 0 {
				t.Errorf("bad variable %q", v.Name)
			}
		}
	})
}

// TestScrubArgsOnlyEnvValues: scrubbing touches only the VALUE of each
// --env argument; other arguments (a working directory that contains the
// same characters), the name and binding of an --env, and the agent's argv
// after "--" keep their bytes.
func TestScrubArgsOnlyEnvValues(t *testing.T) {
	in := []string{"--workdir", "/w/3", "--env", "X=3@h3.example", "--env=Y=a@b@api.example", "-env=Z=3", "--env", "NAME", "--env", "K=@h", "--", "--env", "W=3"}
	args := make([]string, len(in))
	for i, a := range in {
		args[i] = strings.Clone(a) // writable memory, as os.Args is
	}
	scrubArgs(args)
	want := []string{"--workdir", "/w/3", "--env", "X=*@h3.example", "--env=Y=***@api.example", "-env=Z=*", "--env", "NAME", "--env", "K=@h", "--", "--env", "W=3"}
	if !slices.Equal(args, want) {
		t.Fatalf("scrubbed\n%q\nwant\n%q", args, want)
	}
}
