package daemon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/staging"
)

// The decision a staged change gets at the commit point that commits it
// sees every part of what is committed: content past the first MiB, the
// mode of a new file, and the values of its user.* attributes. Each is
// tested with a real agent (python3) writing through the overlay.

// shownKey is the credential handed to the agent (bound to
// api.example.com only: the working directory may never receive it).
const shownKey = "sk-shown-4e8b2d6f1a9c3e7b5d0f2a8c6e4b1d9f"

// shownPolicy: certs/ is secret, the credential is bound elsewhere, and
// an executable planted under .git/hooks is refused (by its mode).
const shownPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
sensitive:
  - {name: keys, level: secret, paths: ["certs/**"]}
refuse:
  - {name: no-executable-hooks, paths: [".git/hooks/**"], values: ["0755", "0775", "0777", "0750", "0700", "0711", "0555", "0500"]}
operations:
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// shownAgent writes three 5 MiB files whose only difference is at offset
// 3 MiB (the credential, the secret read from certs/service.pem, or
// nothing), a file over the content bound, an executable and a plain
// file moved into .git/hooks (the rename carries no mode), two files
// with a user.* attribute (the credential, or a plain note), and a new
// directory with the credential in an attribute.
const shownAgent = `
import os
key = os.environ["API_KEY"]
pem = open("certs/service.pem").read().split("\n")[1]
def big(name, token):
    b = bytearray(b"a" * (5 << 20))
    t = ("\n" + token + "\n").encode()
    b[3 << 20:(3 << 20) + len(t)] = t
    with open(name, "wb") as f:
        f.write(b)
big("cred.bin", key)
big("pem.bin", pem)
big("clean.bin", "")
with open("huge.bin", "wb") as f:
    f.write(b"h" * (33 << 20))
for name, hook, mode in (("tool.sh", "post-checkout", 0o755), ("plain.sh", "pre-commit", 0o644)):
    fd = os.open(name, os.O_CREAT | os.O_WRONLY, mode)
    os.write(fd, b"#!/bin/sh\necho planted\n")
    os.close(fd)
    os.rename(name, ".git/hooks/" + hook)
for name, value in (("tagged.txt", key), ("noted.txt", "just a note")):
    with open(name, "w") as f:
        f.write("note\n")
    os.setxattr(name, "user.note", value.encode())
os.mkdir("box")
os.setxattr("box", "user.note", key.encode())
`

func TestStagedDecisionSeesAll(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	if staging.DefaultContentLimit >= 33<<20 || staging.DefaultContentLimit < 5<<20 {
		t.Fatalf("the test's files are sized for a content bound between 5 and 33 MiB, not %d", staging.DefaultContentLimit)
	}
	work := secretWorkdir(t)
	if err := os.MkdirAll(filepath.Join(work, ".git", "hooks"), 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "chown", "-R", fmt.Sprint(sandboxUID), work)
	p, err := decide.ParsePolicy("shown.yaml", []byte(shownPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithCredentials([]decide.CredentialValue{{Name: "API_KEY", Value: shownKey, Hosts: []string{"api.example.com"}}}); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Config{ID: testutil.UniqueName("v"), StateDir: t.TempDir(), Policy: p, PolicyPath: "shown.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", shownAgent}, UID: sandboxUID, GID: sandboxUID,
		Env: []string{"API_KEY=" + shownKey}, HoldTimeout: 3 * time.Second, Stdout: &out, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, nil))})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, out.String())
	}
	read := func(name string) ([]byte, bool) {
		b, err := os.ReadFile(filepath.Join(work, name))
		return b, err == nil
	}

	// 1. Content past the first MiB.
	if b, ok := read("cred.bin"); ok && bytes.Contains(b, []byte(shownKey)) {
		t.Errorf("cred.bin committed with the credential at offset 3 MiB")
	}
	if !refusedFromStaging(sum.Refused, "cred.bin", decide.CodeCredential) {
		t.Errorf("cred.bin was not refused for the credential from the staging layer: refused %v", paths(sum.Refused))
	}
	if b, ok := read("clean.bin"); !ok || len(b) != 5<<20 {
		t.Errorf("clean.bin (5 MiB, nothing at stake) not committed whole: %d bytes", len(b))
	}
	if b, ok := read("pem.bin"); !ok || len(b) != 5<<20 {
		t.Errorf("pem.bin not committed whole (the working directory is cleared for the secret, and labels it): %d bytes", len(b))
	}
	// Released (the working directory is cleared for everything and
	// labels it with what the agent read), on a level found in it.
	if d, ok := stagingDecision(sum.Released, "pem.bin"); !ok || d.Reason.Level != "secret" {
		t.Errorf("pem.bin's decision from the staging layer did not see the secret at offset 3 MiB: %+v", d.Reason)
	}
	if _, ok := read("huge.bin"); ok {
		t.Errorf("huge.bin (33 MiB, over the content bound) committed on a partial view")
	}
	if !containsAll(sum.FileRefusals, `"huge.bin"`, "not decided") {
		t.Errorf("huge.bin not reported as kept staged, undecided: %q", sum.FileRefusals)
	}

	// 2. The mode of a new file.
	if _, ok := read(".git/hooks/post-checkout"); ok {
		t.Errorf("the executable moved into .git/hooks was committed")
	}
	if d, ok := stagingDecision(sum.Refused, ".git/hooks/post-checkout"); !ok || fieldValue(d.Event, "mode") != "0755" {
		t.Errorf("the executable hook was not refused from the staging layer on its mode: refused %v", paths(sum.Refused))
	}
	if b, ok := read(".git/hooks/pre-commit"); !ok || string(b) != "#!/bin/sh\necho planted\n" {
		t.Errorf("the hook without the execute bit not committed: %q", b)
	}

	// 3. The values of user.* attributes.
	if v, err := xattrOf(filepath.Join(work, "tagged.txt"), "user.note"); err == nil && strings.Contains(v, shownKey) {
		t.Errorf("tagged.txt committed with the credential in its user.note attribute")
	}
	if !refusedFromStaging(sum.Refused, "tagged.txt", decide.CodeCredential) {
		t.Errorf("tagged.txt was not refused for the credential in its attribute: refused %v", paths(sum.Refused))
	}
	if v, err := xattrOf(filepath.Join(work, "noted.txt"), "user.note"); err != nil || v != "just a note" {
		t.Errorf("noted.txt's attribute not committed: %q, %v", v, err)
	}
	if v, err := xattrOf(filepath.Join(work, "box"), "user.note"); err == nil && strings.Contains(v, shownKey) {
		t.Errorf("the new directory box committed with the credential in its user.note attribute")
	}
	if !refusedFromStaging(sum.Refused, "box", decide.CodeCredential) {
		t.Errorf("box was not refused for the credential in its attribute: refused %v", paths(sum.Refused))
	}
	if t.Failed() {
		t.Logf("log:\n%s", out.String())
	}
}

// stagingDecision returns the last decision in ds on path from the
// staging layer (no offset field: not a traced write).
func stagingDecision(ds []decide.Decision, path string) (decide.Decision, bool) {
	for i := len(ds) - 1; i >= 0; i-- {
		if d := ds[i]; d.Event != nil && d.Event.Obj == path && !fieldOf(d.Event, "offset") && d.Event.Op != "file:rename" {
			return d, true
		}
	}
	return decide.Decision{}, false
}

// refusedFromStaging reports whether ds has a decision on path from the
// staging layer with reason code.
func refusedFromStaging(ds []decide.Decision, path, code string) bool {
	for _, d := range ds {
		if d.Event != nil && d.Event.Obj == path && !fieldOf(d.Event, "offset") && d.Reason.Code == code {
			return true
		}
	}
	return false
}

func paths(ds []decide.Decision) []string {
	var out []string
	for _, d := range ds {
		if d.Event != nil {
			out = append(out, d.Event.Op+" "+d.Event.Obj+" ("+d.Reason.Code+")")
		}
	}
	return out
}

func containsAll(lines []string, subs ...string) bool {
	for _, l := range lines {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			return true
		}
	}
	return false
}

func xattrOf(path, name string) (string, error) {
	buf := make([]byte, 64<<10)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
