package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
)

// The commit commits exactly the bytes that were decided: two ways the
// staged content can differ from what the decisions saw, each tested
// with a secret the policy refuses (it must not reach the working
// directory) and with a clean rewrite (it must be decided on its own
// content and committed: no false mismatch).
//
//   - Mmap: the content reaches the staging layer through a shared
//     writable mapping, with no record; the commit point decides it from
//     the staging layer and holds it, the agent writes through the mapping
//     again, and the hold is released.
//   - Race: a write whose record the commit point does not have when it
//     takes its verdicts (its system call had not returned at the second
//     Sync), whose bytes the scan already read.

// digestSecret is what the agents write where the policy refuses it.
const digestSecret = "sk-digest-5c1e9a7f3b2d8e4a6c0f1b9d7e3a5c2f"

// mmapPolicy holds every write whose content is not derivable from the
// task (gate: content), so that the mapped file's content, decided from
// the staging layer, is held; the mmap itself carries no content and is
// released. The secret in m.bin is refused.
const mmapPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - {name: no-key-in-m, paths: ["m.bin"], values: ["` + digestSecret + `"]}
operations:
  - {ops: ["file:write"], kind: stageable, gate: [content]}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// mmapAgent makes m.bin as long as FIRST (and SECOND), maps it shared
// and writable, stores FIRST through the mapping, says "mapped", waits for a line on stdin, stores SECOND
// through the still-live mapping and says "wrote-second".
const mmapAgent = `
import mmap, os, sys
def step(name):
    sys.stdout.write(name + "\n")
    sys.stdout.flush()
fd = os.open("m.bin", os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(fd, len(FIRST))
m = mmap.mmap(fd, len(FIRST), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
m[:] = FIRST
step("mapped")
if not sys.stdin.readline():
    sys.exit(3)
m[:] = SECOND
step("wrote-second")
m.close()
os.close(fd)
`

// TestMmapHeldSecret: a file written through a shared mapping is decided
// from the staging layer at a commit point and held; the agent then
// writes the secret through the mapping (no record) and the hold is
// released by the operator: the secret never reaches the working
// directory, and the new content is decided (refused) from the staging
// layer.
func TestMmapHeldSecret(t *testing.T) {
	second := digestSecret
	first := strings.Repeat("f", len(second))
	sum, work, _ := runMmapHeld(t, first, second)
	if b, err := os.ReadFile(filepath.Join(work, "m.bin")); err == nil && strings.Contains(string(b), digestSecret) {
		t.Errorf("m.bin committed with the secret written through the mapping after its decision (on the release of the earlier content)")
	}
	if !stagedDecision(sum.Refused, "m.bin", digestSecret) {
		t.Errorf("m.bin's new content was not refused from the staging layer: refused %+v", sum.Refused)
	}
}

// TestMmapHeldRewrite: the same with clean new content: it is decided
// again (asked again: the operator approved other bytes) and committed.
func TestMmapHeldRewrite(t *testing.T) {
	first := strings.Repeat("f", len(digestSecret))
	second := strings.Repeat("s", len(digestSecret))
	sum, work, asked := runMmapHeld(t, first, second)
	b, err := os.ReadFile(filepath.Join(work, "m.bin"))
	if err != nil || string(b) != second {
		t.Errorf("m.bin is %q (%v), want it committed with %q", b, err, second)
	}
	if !stagedDecision(sum.Released, "m.bin", second) {
		t.Errorf("m.bin's new content was not decided from the staging layer: released %+v", sum.Released)
	}
	if asked < 2 {
		t.Errorf("the operator was asked %d times, want twice (the first content, then the second)", asked)
	}
}

// stagedDecision reports whether ds has a decision on path from the
// staging layer (no offset field: not a traced write) whose data contains
// data.
func stagedDecision(ds []decide.Decision, path, data string) bool {
	for _, d := range ds {
		if d.Event != nil && d.Event.Obj == path && !fieldOf(d.Event, "offset") && strings.Contains(fieldValue(d.Event, "data"), data) {
			return true
		}
	}
	return false
}

// runMmapHeld runs mmapAgent: the test waits until m.bin's content is
// held (decided from the staging layer at a commit point), then lets the
// agent store second through the mapping; the operator approves every
// question, all of them at the end of the task (the held scope resolves
// then). It returns the summary, W and how many questions the operator
// was asked.
func runMmapHeld(t *testing.T, first, second string) (*Summary, string, int) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := workdir(t)
	pol, err := decide.ParsePolicy("mmap.yaml", []byte(mmapPolicy))
	if err != nil {
		t.Fatal(err)
	}
	op := decide.NewOperator(2 * time.Minute)
	pr, pw := io.Pipe()
	defer pw.Close()
	said := &lineWaiter{lines: map[string]chan struct{}{"mapped": make(chan struct{}), "wrote-second": make(chan struct{})}}
	var out syncBuffer
	var dp atomic.Pointer[daemon]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The operator approves every question once the agent wrote second
	// (before that, none is asked: the scope resolves at the end).
	var asked atomic.Int32
	var probeErr atomic.Pointer[string]
	fail := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		probeErr.CompareAndSwap(nil, &s)
		pw.Close()
	}
	stopOp := make(chan struct{})
	opDone := make(chan struct{})
	go func() {
		defer close(opDone)
		answered := map[uint64]bool{}
		for {
			for _, q := range op.Pending() {
				if !answered[q.ID] {
					answered[q.ID] = true
					asked.Add(1)
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
	// The probe: m.bin held from the staging layer, then second written.
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		if !said.wait("mapped", time.Minute) {
			fail("the agent never mapped m.bin")
			return
		}
		deadline := time.Now().Add(time.Minute)
		for {
			if d := dp.Load(); d != nil && heldFromStaging(d.engine.Held(), "m.bin") {
				break
			}
			if time.Now().After(deadline) {
				fail("m.bin was never held from the staging layer")
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, err := io.WriteString(pw, "go\n"); err != nil {
			fail("tell the agent to write: %v", err)
			return
		}
		if !said.wait("wrote-second", time.Minute) {
			fail("the agent never wrote through the mapping again")
		}
		pw.Close()
	}()
	script := fmt.Sprintf("FIRST = %q.encode()\nSECOND = %q.encode()\n", first, second) + mmapAgent
	cfg := Config{ID: testutil.UniqueName("m"), StateDir: t.TempDir(), Policy: pol, PolicyPath: "mmap.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Oracle: op, Operator: op, HoldTimeout: 3 * time.Second, Stdin: pr, Stdout: said, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cfg.hooks = &testHooks{started: func(d *daemon) { dp.Store(d) }}
	sum, err := Run(ctx, cfg)
	pw.Close()
	<-probeDone
	close(stopOp)
	<-opDone
	log := out.String()
	runEnded(t, ctx, err, log)
	if e := probeErr.Load(); e != nil {
		t.Fatalf("not tested: %s\n%s", *e, log)
	}
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, log)
	}
	return sum, work, int(asked.Load())
}

// heldFromStaging reports whether held has a decision on path taken from
// the staging layer (with content, not a traced write or mmap).
func heldFromStaging(held []decide.Decision, path string) bool {
	for _, d := range held {
		if d.Event != nil && d.Event.Obj == path && !fieldOf(d.Event, "offset") && fieldOf(d.Event, "data") {
			return true
		}
	}
	return false
}

// lineWaiter takes an agent's stdout and closes a channel for each
// expected line it prints.
type lineWaiter struct {
	mu    sync.Mutex
	lines map[string]chan struct{}
}

func (w *lineWaiter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, line := range strings.Split(string(b), "\n") {
		if ch, ok := w.lines[strings.TrimSpace(line)]; ok {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}
	return len(b), nil
}

func (w *lineWaiter) wait(line string, limit time.Duration) bool {
	select {
	case <-w.lines[line]:
		return true
	case <-time.After(limit):
		return false
	}
}

// racePolicy refuses the secret in a.txt (by value) and releases every
// other file effect.
const racePolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - {name: no-key-in-a, paths: ["a.txt"], values: ["` + digestSecret + `"]}
operations:
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// raceAgent writes b.txt, then a.txt (8 KiB: its content is read back by
// the tracer, not captured, so nothing marks it to be decided from the
// staging layer), then a.txt again with SECOND, each step when the test
// says so on stdin. (SECOND, if short, is captured: the mark its record
// sets comes late with it.)
const raceAgent = `
import os, sys
def step(name):
    sys.stdout.write(name + "\n")
    sys.stdout.flush()
def put(path, data):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
put("b.txt", b"fine\n")
step("ready")
if not sys.stdin.readline():
    sys.exit(3)
put("a.txt", b"clean\n" * 1400)
step("wrote-clean")
if not sys.stdin.readline():
    sys.exit(4)
put("a.txt", SECOND)
step("wrote-second")
`

// raceProbe drives raceAgent from the commit point's stages: a.txt's
// clean write at the end of one commit point (released at the next one's
// first Sync), its second write right before that commit point's scan,
// whose records the file channel handles only when the commit point has
// ended.
type raceProbe struct {
	second string
	stdin  *io.PipeWriter
	said   *lineWaiter
	d      atomic.Pointer[daemon]

	mu       sync.Mutex
	phase    int // 0: waiting for ready; 1: clean written; 2: second written; 3: its commit point ended
	errs     []string
	released bool // a.txt's clean write was decided and released before the scan
	late     []lateRec
	armed    atomic.Bool
}

type lateRec struct {
	rec *fileev.Record
	evs []decide.Event
}

func (p *raceProbe) errorf(format string, args ...any) {
	p.mu.Lock()
	p.errs = append(p.errs, fmt.Sprintf(format, args...))
	p.mu.Unlock()
}

func (p *raceProbe) step(want string) bool {
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		p.errorf("tell the agent to write: %v", err)
		return false
	}
	if !p.said.wait(want, time.Minute) {
		p.errorf("the agent never said %q", want)
		return false
	}
	return true
}

// lateRecord keeps, once armed, every record of a.txt (its open, write
// and close) for after the commit point.
func (p *raceProbe) lateRecord(rec *fileev.Record, evs []decide.Event) bool {
	if !p.armed.Load() || rec.Kind != fileev.KindSyscall || rec.Path != "a.txt" {
		return false
	}
	// The tracer reuses both once the handler returns: keep copies.
	r := *rec
	cp := make([]decide.Event, len(evs))
	for i, ev := range evs {
		ev.Fields = slices.Clone(ev.Fields)
		cp[i] = ev
	}
	p.mu.Lock()
	p.late = append(p.late, lateRec{&r, cp})
	p.mu.Unlock()
	return true
}

func (p *raceProbe) commitStage(stage string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case stage == "done" && p.phase == 0:
		select {
		case <-p.said.lines["ready"]:
		default:
			return
		}
		p.mu.Unlock()
		ok := p.step("wrote-clean")
		p.mu.Lock()
		if ok {
			p.phase = 1
		}
	case stage == "scan" && p.phase == 1:
		p.phase = 2
		d := p.d.Load()
		if ps := d.files.state("a.txt"); ps != nil {
			p.released = d.files.verdictOf(ps) == decide.Release
		}
		p.armed.Store(true)
		p.mu.Unlock()
		p.step("wrote-second")
		p.stdin.Close()
		p.mu.Lock()
	case stage == "done" && p.phase == 2:
		p.phase = 3
		p.armed.Store(false)
		late := p.late
		p.late = nil
		d := p.d.Load()
		p.mu.Unlock()
		// The records arrive now: as if the write had returned after
		// the commit point's second Sync.
		for _, l := range late {
			d.files.handleRecord(context.Background(), l.rec, l.evs)
		}
		p.mu.Lock()
		if len(late) == 0 {
			p.errs = append(p.errs, "no record of a.txt's second write was held back")
		}
	}
}

// TestCommitRaceSecret: a.txt, released on its traced clean write, holds
// the secret when the commit point scans it, written by a system call
// whose record comes after the commit point's second Sync (its verdicts
// are taken without it): the secret never reaches the working directory.
func TestCommitRaceSecret(t *testing.T) {
	second := digestSecret
	sum, work := runRace(t, second)
	if b, err := os.ReadFile(filepath.Join(work, "a.txt")); err == nil && strings.Contains(string(b), digestSecret) {
		t.Errorf("a.txt committed with the secret its late write put there (on the release of its earlier write)")
	}
	if !stagedDecision(sum.Refused, "a.txt", digestSecret) && !tracedWrite(sum.Refused, "a.txt", digestSecret) {
		t.Errorf("a.txt's secret was never refused: refused %+v", sum.Refused)
	}
}

// TestCommitRaceRewrite: the same race with clean content: committed,
// decided on the content the scan read.
func TestCommitRaceRewrite(t *testing.T) {
	second := strings.Repeat("second version\n", 600)
	sum, work := runRace(t, second)
	if got := readString(t, filepath.Join(work, "a.txt")); got != second {
		t.Errorf("a.txt is %d bytes %q…, want the second version committed", len(got), got[:min(len(got), 32)])
	}
	if !stagedDecision(sum.Released, "a.txt", "second version") {
		t.Errorf("a.txt's second content was not decided from the staging layer: released %+v", sum.Released)
	}
}

// runRace runs raceAgent with second as a.txt's later content and checks
// that the race was there; it returns the summary and W.
func runRace(t *testing.T, second string) (*Summary, string) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := workdir(t)
	pol, err := decide.ParsePolicy("race.yaml", []byte(racePolicy))
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	p := &raceProbe{second: second, stdin: pw, said: &lineWaiter{lines: map[string]chan struct{}{
		"ready": make(chan struct{}), "wrote-clean": make(chan struct{}), "wrote-second": make(chan struct{})}}}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	script := fmt.Sprintf("SECOND = %q.encode()\n", second) + raceAgent
	cfg := Config{ID: testutil.UniqueName("r"), StateDir: t.TempDir(), Policy: pol, PolicyPath: "race.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		HoldTimeout: 3 * time.Second, Stdin: pr, Stdout: p.said, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	late := p.lateRecord
	cfg.hooks = &testHooks{started: func(d *daemon) {
		p.d.Store(d)
		d.files.lateRecord.Store(&late)
	}, commitStage: p.commitStage}
	stop := time.AfterFunc(2*time.Minute, func() { pw.Close() })
	defer stop.Stop()
	sum, err := Run(ctx, cfg)
	log := out.String()
	runEnded(t, ctx, err, log)
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, log)
	}
	p.mu.Lock()
	errs, phase, released := p.errs, p.phase, p.released
	p.mu.Unlock()
	if len(errs) > 0 {
		t.Fatalf("the probe: %s\n%s", strings.Join(errs, "; "), log)
	}
	if phase < 3 || !released {
		t.Fatalf("not tested: phase %d, a.txt released before the scan: %v\n%s", phase, released, log)
	}
	if strings.Contains(log, "file events were lost or malformed") {
		t.Fatalf("not tested: events were lost (the staged changes were decided again from the staging layer)\n%s", log)
	}
	if got := readString(t, filepath.Join(work, "b.txt")); got != "fine\n" {
		t.Errorf("b.txt is %q, want it committed", got)
	}
	return sum, work
}

// storePolicy refuses the secret in m.bin (by value) and releases every
// other file effect.
const storePolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - {name: no-key-in-m, paths: ["m.bin"], values: ["` + digestSecret + `"]}
operations:
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// TestMmapStoreDuringCommit: m.bin, written through a shared mapping, is
// decided from the staging layer and released; while the commit point
// commits it (after its scan and verdicts, before Commit copies it), the
// agent stores the secret through the still-live mapping. Commit copies
// only the decided bytes (the digest differs: nothing of m.bin goes to
// W), and the next commit point decides the new content (refused) rather
// than committing it on the earlier release.
func TestMmapStoreDuringCommit(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := workdir(t)
	pol, err := decide.ParsePolicy("store.yaml", []byte(storePolicy))
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	said := &lineWaiter{lines: map[string]chan struct{}{"mapped": make(chan struct{}), "wrote-second": make(chan struct{})}}
	var dp atomic.Pointer[daemon]
	var stored atomic.Bool
	var mu sync.Mutex
	var errs []string
	commitStage := func(stage string) {
		if stage != "commit" || stored.Load() {
			return
		}
		select {
		case <-said.lines["mapped"]:
		default:
			return
		}
		d := dp.Load()
		ps := d.files.state("m.bin")
		if ps == nil || d.files.verdictOf(ps) != decide.Release {
			return
		}
		d.files.mu.Lock()
		staged := ps.staged
		d.files.mu.Unlock()
		if !staged {
			return
		}
		// m.bin is being committed on its decision: store the secret now.
		stored.Store(true)
		if _, err := io.WriteString(pw, "go\n"); err != nil || !said.wait("wrote-second", time.Minute) {
			mu.Lock()
			errs = append(errs, fmt.Sprintf("the agent did not store the secret: %v", err))
			mu.Unlock()
		}
		pw.Close()
	}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := time.AfterFunc(2*time.Minute, func() { pw.Close() })
	defer stop.Stop()
	first := strings.Repeat("f", len(digestSecret))
	script := fmt.Sprintf("FIRST = %q.encode()\nSECOND = %q.encode()\n", first, digestSecret) + mmapAgent
	cfg := Config{ID: testutil.UniqueName("s"), StateDir: t.TempDir(), Policy: pol, PolicyPath: "store.yaml",
		Workdir: work, Task: "Write the files", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		HoldTimeout: 3 * time.Second, Stdin: pr, Stdout: said, Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cfg.hooks = &testHooks{started: func(d *daemon) { dp.Store(d) }, commitStage: commitStage}
	sum, err := Run(ctx, cfg)
	log := out.String()
	runEnded(t, ctx, err, log)
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 || !stored.Load() {
		t.Fatalf("not tested: stored %v: %s\n%s", stored.Load(), strings.Join(errs, "; "), log)
	}
	if sum.ExitCode != 0 {
		t.Fatalf("the agent exited %d\n%s", sum.ExitCode, log)
	}
	// Commit found m.bin changed since its decision: said in the log (or,
	// as before, reported as a refusal).
	changed := strings.Contains(log, "staged change written since its decision")
	for _, r := range sum.FileRefusals {
		changed = changed || strings.Contains(r, "m.bin") && strings.Contains(r, "changed since it was scanned")
	}
	if !changed {
		t.Fatalf("not tested: Commit never found m.bin changed since its decision\n%s", log)
	}
	if b, err := os.ReadFile(filepath.Join(work, "m.bin")); err == nil && strings.Contains(string(b), digestSecret) {
		t.Errorf("m.bin committed with the secret stored through the mapping after its decision")
	}
	if !stagedDecision(sum.Refused, "m.bin", digestSecret) {
		t.Errorf("m.bin's new content was not refused from the staging layer: refused %+v", sum.Refused)
	}
	for _, r := range sum.FileRefusals {
		if strings.Contains(r, "m.bin") && strings.Contains(r, "changed since it was scanned") {
			t.Errorf("a change written since its decision is reported as refused: %q", r)
		}
	}
}
