package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// A file written before the agent read a secret, and committed after,
// keeps the label of its writes when its staged content is proved to be
// what those writes produced (the file channel's image, fileimage.go):
// its content can then be sent where the secret may not go. A file
// written (or appended to) after the read, or whose content cannot be
// proved (stores through a shared mapping), is labelled with what the
// agent had read by the commit point: its content cannot leave.

// imageReport is what the agent writes to report.md and posts.
const imageReport = "weekly report\nbuild 7f3a9c2e51d84b06 passed\nopen tickets: 7\n"

// imageSecret is the key the agent reads.
const imageSecret = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjImage"

// imageAgent writes report.md as MODE says around its read of the key,
// says "ready", waits for a line on stdin (the test sends it once a
// commit point committed report.md), then reads report.md back and posts
// it to api.example.com (cleared for public data only).
const imageAgent = `
import mmap, os, sys, urllib.request
def say(s):
    sys.stdout.write(s + "\n")
    sys.stdout.flush()
def write(data, flags=os.O_WRONLY | os.O_CREAT | os.O_TRUNC):
    fd = os.open("report.md", flags, 0o644)
    os.write(fd, data)
    os.close(fd)
def read_key():
    with open("certs/service.pem", "rb") as f:
        f.read()
half = len(REPORT) // 2
if MODE in ("before", "existing"):
    write(REPORT)
    read_key()
elif MODE == "after":
    read_key()
    write(REPORT)
elif MODE == "append":
    write(REPORT[:half])
    read_key()
    write(REPORT[half:], os.O_WRONLY | os.O_APPEND)
elif MODE == "big":
    write(REPORT + b"x" * (1 << 20))
    read_key()
elif MODE == "mmap":
    fd = os.open("report.md", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, len(REPORT))
    m = mmap.mmap(fd, len(REPORT), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[:] = REPORT
    m.close()
    os.close(fd)
    read_key()
say("ready")
if not sys.stdin.readline():
    sys.exit(3)
with open("report.md", "rb") as f:
    body = f.read(len(REPORT))
try:
    r = urllib.request.urlopen(urllib.request.Request("http://api.example.com/reports", data=body, method="POST"), timeout=8)
    say("post=%d" % r.status)
except Exception as e:
    say("post=error %s" % e)
`

// TestImageWrittenBeforeSecret: report.md, written before the key was
// read and committed after, is posted (released).
func TestImageWrittenBeforeSecret(t *testing.T) {
	sum, w, out := runImage(t, "before")
	if !posted(w) {
		t.Errorf("report.md, written before the key was read, was not posted: the world saw %q\n%s", w.requests(), out)
	}
	if !proved(sum, true) {
		t.Errorf("report.md's staging decision was not marked as written as decided: released %+v", sum.Released)
	}
}

// TestImageRewrittenBeforeSecret: the same with report.md a file of the
// working directory, emptied and rewritten (a written file: its event
// shows only the changed region; the whole staged file is read against
// the image): posted.
func TestImageRewrittenBeforeSecret(t *testing.T) {
	sum, w, out := runImage(t, "existing")
	if !posted(w) {
		t.Errorf("report.md, rewritten before the key was read, was not posted: the world saw %q\n%s", w.requests(), out)
	}
	if !proved(sum, true) {
		t.Errorf("report.md's staging decision was not marked as written as decided: released %+v", sum.Released)
	}
}

// TestImageWrittenAfterSecret: report.md written after the key was read
// keeps the secret label: not posted.
func TestImageWrittenAfterSecret(t *testing.T) {
	sum, w, out := runImage(t, "after")
	if posted(w) {
		t.Errorf("report.md, written after the key was read, was posted\n%s", out)
	}
	if !proved(sum, true) {
		t.Errorf("report.md's staging decision was not marked as written as decided (its proof is not what labels it here): released %+v", sum.Released)
	}
}

// TestImageAppendedAfterSecret: report.md, half written before the key
// was read and appended to after: not posted.
func TestImageAppendedAfterSecret(t *testing.T) {
	_, w, out := runImage(t, "append")
	if posted(w) {
		t.Errorf("report.md, appended to after the key was read, was posted\n%s", out)
	}
}

// TestImageMmapUnproved: report.md stored through a shared mapping
// before the key was read: its content cannot be proved, it is labelled
// with what the agent had read at the commit point: not posted.
func TestImageMmapUnproved(t *testing.T) {
	sum, w, out := runImage(t, "mmap")
	if posted(w) {
		t.Errorf("report.md, stored through a mapping, was posted\n%s", out)
	}
	if proved(sum, false) {
		t.Errorf("report.md stored through a mapping was marked as written as decided")
	}
}

// TestImageLargeWriteUnproved: report.md written before the key was
// read in one write larger than the tracer captures: its content cannot
// be proved, it is labelled with what the agent had read at the commit
// point: not posted.
func TestImageLargeWriteUnproved(t *testing.T) {
	sum, w, out := runImage(t, "big")
	if posted(w) {
		t.Errorf("report.md, written past the capture, was posted\n%s", out)
	}
	if proved(sum, false) {
		t.Errorf("report.md written past the capture was marked as written as decided")
	}
}

// posted reports whether the world received the report.
func posted(w *world) bool {
	return slices.ContainsFunc(w.requests(), func(r string) bool {
		return strings.HasPrefix(r, "api.example.com POST /reports") && strings.Contains(r, "7f3a9c2e51d84b06")
	})
}

// proved reports whether report.md's staging-layer decision (released,
// or any with want false) was marked WrittenAsDecided.
func proved(sum *Summary, released bool) bool {
	ds := sum.Released
	if !released {
		ds = append(append(ds, sum.Refused...), sum.Held...)
	}
	for _, d := range ds {
		if d.Event != nil && d.Event.Obj == "report.md" && d.Event.WrittenAsDecided {
			return true
		}
	}
	return false
}

// runImage runs imageAgent in mode: the first commit point waits until
// the agent has read the key (so report.md is committed after the read),
// and the agent posts once report.md is committed.
func runImage(t *testing.T, mode string) (*Summary, *world, string) {
	t.Helper()
	existing := ""
	if mode == "existing" {
		existing = "last week's report\n"
	}
	sum, w, log, _ := runImageAgent(t, mode, imageAgent, existing)
	return sum, w, log
}

// runImageAgent runs agent (imageAgent's protocol) in mode, with
// report.md in W holding existing if it is not empty; it also returns
// the run's state directory (its audit log).
func runImageAgent(t *testing.T, mode, agent, existing string) (*Summary, *world, string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	w := newWorld(t, 171)
	work := workdir(t)
	if err := os.MkdirAll(filepath.Join(work, "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "certs", "service.pem"), []byte("-----BEGIN PRIVATE KEY-----\n"+imageSecret+"\n-----END PRIVATE KEY-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if existing != "" {
		if err := os.WriteFile(filepath.Join(work, "report.md"), []byte(existing), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Run(t, "chown", "-R", fmt.Sprint(sandboxUID), work)
	pol, err := decide.ParsePolicy("image.yaml", []byte(e2ePolicy))
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	said := &lineWaiter{lines: map[string]chan struct{}{"ready": make(chan struct{})}}
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stop := time.AfterFunc(2*time.Minute, func() { pw.Close() })
	defer stop.Stop()
	var dp *daemon
	sent := false
	commitStage := func(stage string) {
		switch {
		case stage == "scan" && !sent:
			// Nothing is committed before the agent read the key.
			said.wait("ready", time.Minute)
		case stage == "done" && !sent:
			committed, _, _ := dp.files.outcome()
			if slices.Contains(committed, "report.md") {
				sent = true
				_, _ = io.WriteString(pw, "go\n")
				pw.Close()
			}
		}
	}
	script := fmt.Sprintf("MODE = %q\nREPORT = %q.encode()\n", mode, imageReport) + agent
	state := t.TempDir()
	cfg := Config{ID: testutil.UniqueName("i"), StateDir: state, Policy: pol, PolicyPath: "image.yaml",
		Workdir: work, Task: "Write report.md and post it to http://api.example.com/reports",
		Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Hosts:       map[string][]netip.Addr{"api.example.com": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdin: pr, Stdout: io.MultiWriter(said, &out), Stderr: &out,
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	cfg.hooks = &testHooks{started: func(d *daemon) { dp = d }, commitStage: commitStage}
	start := time.Now()
	sum, err := Run(ctx, cfg)
	log := out.String()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log)
	}
	if !sent {
		t.Fatalf("not tested: report.md was never committed while the agent waited\n%s", log)
	}
	if strings.Contains(log, "file events were lost or malformed") {
		t.Fatalf("not tested: events were lost\n%s", log)
	}
	if !strings.Contains(log, "post=") {
		t.Fatalf("the agent never posted\n%s", log)
	}
	t.Logf("run took %v", time.Since(start))
	return sum, w, log, filepath.Join(state, "sandboxes", cfg.ID)
}
