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

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/staging"
)

// lossSecret is what the loss test's agent writes where the policy
// refuses it.
const lossSecret = "sk-loss-7f3a9c2e4b8d1f6a0c5e9b3d7a2f8e4c"

// lossPolicy refuses a write of lossSecret to out*.txt (by value: the
// write's data field is the secret) and releases every other file
// effect.
const lossPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
sensitive:
  - {name: keys, level: secret, paths: ["certs/**"]}
refuse:
  - {name: no-key-in-out, paths: ["out*.txt"], values: ["` + lossSecret + `"]}
operations:
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// lossAgent creates out<i>.txt, floods a one-page ring with one-byte
// writes to flood.bin (the reader cannot keep up: records are lost), and
// writes the secret into out<i>.txt in the middle of the flood, so that
// its record is most likely among the lost ones; five times. keep.txt is
// written before, with nothing the policy refuses.
const lossAgent = `
import os
with open("keep.txt", "w") as f:
    f.write("fine\n")
for i in range(5):
    out = os.open("out%d.txt" % i, os.O_CREAT | os.O_WRONLY, 0o644)
    fl = os.open("flood.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    for _ in range(20000):
        os.write(fl, b"x")
    os.write(out, SECRET.encode())
    for _ in range(2000):
        os.write(fl, b"x")
    os.close(fl)
    os.close(out)
`

// TestLossDecidedFromStaging: a run whose file tracer loses records (a
// one-page ring flooded by the agent) decides the staged changes from the
// staging layer at the commit point: a file whose secret write was lost
// is refused from its content, never committed on what tracing saw of it
// (its create); what the policy allows is still committed; the run ends.
func TestLossDecidedFromStaging(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("loss.yaml", []byte(lossPolicy))
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := "SECRET = " + fmt.Sprintf("%q", lossSecret) + "\n" + lossAgent
	sum, err := Run(ctx, Config{ID: testutil.UniqueName("l"), StateDir: t.TempDir(), Policy: p, PolicyPath: "loss.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		HoldTimeout: 3 * time.Second, FileRingBytes: os.Getpagesize(), Stdout: &out, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	runEnded(t, ctx, err, out.String())
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, out.String())
	}
	log := out.String()
	if !strings.Contains(log, "file events were lost or malformed") {
		t.Fatalf("no loss: the flood did not overflow the ring (nothing tested)\n%s", log)
	}
	for i := range 5 {
		name := fmt.Sprintf("out%d.txt", i)
		b, err := os.ReadFile(filepath.Join(work, name))
		if err == nil && bytes.Contains(b, []byte(lossSecret)) {
			t.Errorf("%s committed with the secret the policy refuses there", name)
		}
	}
	if got := readString(t, filepath.Join(work, "keep.txt")); got != "fine\n" {
		t.Errorf("keep.txt is %q, want it committed after the loss", got)
	}
	if b, err := os.ReadFile(filepath.Join(work, "flood.bin")); err != nil || len(b) != 22000 {
		t.Errorf("flood.bin not committed whole: %d bytes, %v", len(b), err)
	}
	// flood.bin was written while records were lost (reads among them,
	// for all carbd knows) and decided again from the staging layer: its
	// committed label is at least the sensitive files' (certs/ is
	// secret), though the agent's traced reads never touched them.
	id, err := WorkStateID(work)
	if err != nil {
		t.Fatal(err)
	}
	st, err := staging.Open(staging.Config{WorkDir: work, StateDir: filepath.Join(DefaultWorkStateRoot, id), LayerDir: filepath.Join(t.TempDir(), "layers")})
	if err != nil {
		t.Fatal(err)
	}
	lb, ok := st.Labels().Committed("flood.bin")
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if !ok || p.LevelName(lb.Level) != "secret" {
		t.Errorf("flood.bin's committed label is %+v (%v), want level secret", lb, ok)
	}
	// How each refusal was reached: from the traced write (its record
	// kept) or from the staging layer (the decision after the loss).
	fromStaging, traced := 0, 0
	for _, d := range sum.Refused {
		if d.Event == nil || !strings.HasPrefix(d.Event.Obj, "out") {
			continue
		}
		if fieldOf(d.Event, "offset") {
			traced++
		} else {
			fromStaging++
		}
	}
	t.Logf("refusals of the secret's writes: %d from traced writes, %d from the staging layer", traced, fromStaging)
	if traced+fromStaging == 0 {
		t.Errorf("no refusal of the secret's writes: %+v\n%s", sum.Refused, log)
	}
	// The sensitive files count as read after the loss (a read among the
	// lost records is a read carbd did not see): said at info level the
	// first time, at debug level after.
	if !strings.Contains(log, `msg="the sensitive files count as read" sandbox=`) || !strings.Contains(log, `why="file events were lost (`) {
		t.Errorf("the loss did not make the sensitive files count as read\n%s", log)
	}
}

// fieldOf reports whether ev has a field named name.
func fieldOf(ev *decide.Event, name string) bool {
	for _, f := range ev.Fields {
		if f.Name == name {
			return true
		}
	}
	return false
}

// lossHeldPolicy defers a mkdir (its path is not in the task), so that
// the agent's writes after it are held in a speculative scope, and
// refuses lossSecret in held/out.txt.
const lossHeldPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - {name: no-key-in-out, paths: ["held/out.txt"], values: ["` + lossSecret + `"]}
operations:
  - {ops: ["file:mkdir"], kind: stageable, gate: [target]}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// lossHeldAgent opens a scope (the mkdir), creates held/out.txt in it,
// floods the ring with writes outside the working directory, and writes
// the secret into held/out.txt in the middle of the flood.
const lossHeldAgent = `
import os
os.mkdir("held")
out = os.open("held/out.txt", os.O_CREAT | os.O_WRONLY, 0o644)
fl = os.open("/tmp/flood.bin", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
for _ in range(20000):
    os.write(fl, b"x")
os.write(out, SECRET.encode())
for _ in range(2000):
    os.write(fl, b"x")
os.close(fl)
os.close(out)
`

// TestLossWhileHeld: events are lost while the changes they are about are
// held in a scope (the operator not asked yet, then asked). The operator
// is asked once about each held effect, never again about the same one;
// once the scope is released, the held file is decided again from the
// staging layer, so the secret written in it (its record lost, or seen
// and refused) is not committed, while the approved directory is; the
// run ends.
func TestLossWhileHeld(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("lossheld.yaml", []byte(lossHeldPolicy))
	if err != nil {
		t.Fatal(err)
	}
	op := decide.NewOperator(2 * time.Minute)
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The operator approves every question as it comes; each question's
	// summary is counted.
	asked := map[uint64]string{}
	stopOp := make(chan struct{})
	opDone := make(chan struct{})
	go func() {
		defer close(opDone)
		for {
			for _, q := range op.Pending() {
				if _, ok := asked[q.ID]; !ok {
					asked[q.ID] = q.Summary
					_ = op.Answer(q.ID, decide.Release, "test operator")
				}
			}
			select {
			case <-stopOp:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	script := "SECRET = " + fmt.Sprintf("%q", lossSecret) + "\n" + lossHeldAgent
	sum, err := Run(ctx, Config{ID: testutil.UniqueName("l"), StateDir: t.TempDir(), Policy: p, PolicyPath: "lossheld.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Oracle: op, Operator: op, HoldTimeout: 3 * time.Second, FileRingBytes: os.Getpagesize(), Stdout: &out, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	close(stopOp)
	<-opDone
	runEnded(t, ctx, err, out.String())
	log := out.String()
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, log)
	}
	if !strings.Contains(log, "file events were lost or malformed") {
		t.Fatalf("no loss: the flood did not overflow the ring (nothing tested)\n%s", log)
	}
	// The same effect asked again may differ in its control fields (the
	// mode a mkdir asked for, the mode it got): count by operation and
	// path.
	seen := map[string]int{}
	for _, s := range asked {
		f := strings.Fields(s)
		seen[strings.Join(f[:min(4, len(f))], " ")]++
	}
	for s, n := range seen {
		if n > 1 {
			t.Errorf("the operator was asked %d times about %q", n, s)
		}
	}
	if len(asked) == 0 {
		t.Errorf("the operator was never asked (no scope held the writes)\n%s", log)
	}
	t.Logf("questions: %v", asked)
	for _, d := range sum.Refused {
		if d.Event != nil && d.Event.Obj == "held/out.txt" {
			t.Logf("refused: %s (traced write: %v)", d.Event.Summary(), fieldOf(d.Event, "offset"))
		}
	}
	if st, err := os.Stat(filepath.Join(work, "held")); err != nil || !st.IsDir() {
		t.Errorf("the approved directory is not committed: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(work, "held", "out.txt")); err == nil && bytes.Contains(b, []byte(lossSecret)) {
		t.Errorf("held/out.txt committed with the secret the policy refuses there\n%s", log)
	}
}

// TestFileRingBytesValidated: a ring size the tracer would refuse is a
// configuration error, not a run with tracing off.
func TestFileRingBytesValidated(t *testing.T) {
	pg := os.Getpagesize()
	for _, tc := range []struct {
		n  int
		ok bool
	}{{0, true}, {pg, true}, {16 * pg, true}, {-pg, false}, {pg + 1, false}, {3 * pg, false}, {pg / 2, false}} {
		c := Config{FileRingBytes: tc.n}
		err := c.validate()
		bad := err != nil && strings.Contains(err.Error(), "file ring size")
		if bad == tc.ok {
			t.Errorf("FileRingBytes %d: %v, want valid %v", tc.n, err, tc.ok)
		}
	}
}
