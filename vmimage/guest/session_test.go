package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
)

// host is the test's side of a session.
type host struct {
	t      *testing.T
	conn   *ctrl.Conn
	pid    int
	stdout bytes.Buffer
	stderr bytes.Buffer
	chunks int
	result *ctrl.Result
}

// startSession runs a guest session over a pipe and returns the host side
// after the hello, and a channel with the session's outcome.
func startSession(t *testing.T, workdir string) (*host, <-chan *outcome) {
	t.Helper()
	hostEnd, guestEnd := net.Pipe()
	t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
	s := &session{
		conn:         ctrl.NewConn(guestEnd),
		log:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		workdir:      workdir,
		rundir:       filepath.Join(t.TempDir(), "run"),
		env:          []string{"PATH=" + os.Getenv("PATH")},
		killGrace:    2 * time.Second,
		shutdownWait: time.Minute,
	}
	done := make(chan *outcome, 1)
	go func() {
		out, err := s.run(context.Background())
		if err != nil {
			t.Errorf("session: %v", err)
		}
		done <- out
	}()
	h := &host{t: t, conn: ctrl.NewConn(hostEnd)}
	if _, err := h.conn.RecvHello(); err != nil {
		t.Fatalf("hello: %v", err)
	}
	return h, done
}

func (h *host) send(m ctrl.Message) {
	h.t.Helper()
	if err := h.conn.Send(m); err != nil {
		h.t.Fatalf("send %s: %v", m.Type(), err)
	}
}

// recvUntil reads messages until one of type want (returned) arrives.
func (h *host) recvUntil(want ctrl.Type) ctrl.Message {
	h.t.Helper()
	for {
		m, err := h.conn.Recv()
		if err != nil {
			h.t.Fatalf("recv (waiting for %s): %v", want, err)
		}
		switch m := m.(type) {
		case *ctrl.Started:
			h.pid = m.PID
		case *ctrl.Output:
			h.chunks++
			if len(m.Data) > ctrl.MaxChunk {
				h.t.Errorf("chunk of %d bytes", len(m.Data))
			}
			if m.Stream == ctrl.Stdout {
				h.stdout.Write(m.Data)
			} else {
				h.stderr.Write(m.Data)
			}
		case *ctrl.Result:
			h.result = m
		}
		if m.Type() == want {
			return m
		}
	}
}

// runTask runs argv as a task to its result and ends the session.
func runTask(t *testing.T, text string, argv ...string) (*host, *outcome) {
	t.Helper()
	h, done := startSession(t, t.TempDir())
	h.send(&ctrl.Task{ID: "t1", Text: text, Argv: argv})
	h.recvUntil(ctrl.TypeResult)
	h.send(&ctrl.Shutdown{})
	return h, <-done
}

func TestSessionStdinEnvOutputStatus(t *testing.T) {
	h, out := runTask(t, "fetch the report",
		"sh", "-c", `read -r l; echo "in:$l"; echo "env:$CARBD_TASK id:$CARBD_TASK_ID"; echo "pwd:$(pwd)"; echo oops >&2; exit 3`)
	if h.pid <= 0 {
		t.Errorf("no started message")
	}
	lines := strings.Split(h.stdout.String(), "\n")
	if len(lines) < 3 || lines[0] != "in:fetch the report" || lines[1] != "env:fetch the report id:t1" || !strings.HasPrefix(lines[2], "pwd:/") {
		t.Errorf("stdout %q", h.stdout.String())
	}
	if h.stderr.String() != "oops\n" {
		t.Errorf("stderr %q", h.stderr.String())
	}
	if h.result.Status != 3 {
		t.Errorf("status %d, want 3", h.result.Status)
	}
	if h.result.Text != h.stdout.String() {
		t.Errorf("result text %q, want the stdout %q (no result file)", h.result.Text, h.stdout.String())
	}
	if out.aborted {
		t.Error("aborted")
	}
}

func TestSessionWorkdir(t *testing.T) {
	h, done := startSession(t, t.TempDir())
	h.send(&ctrl.Task{ID: "w", Text: "x", Argv: []string{"sh", "-c", `echo data > file && pwd && test "$CARBD_WORKDIR" = "$(pwd)"`}})
	h.recvUntil(ctrl.TypeResult)
	h.send(&ctrl.Shutdown{})
	<-done
	dir := strings.TrimSpace(h.stdout.String())
	if h.result.Status != 0 {
		t.Fatalf("status %d, stdout %q", h.result.Status, dir)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "file")); err != nil || string(b) != "data\n" {
		t.Errorf("file in the workdir: %q %v", b, err)
	}
}

func TestSessionResultFile(t *testing.T) {
	h, _ := runTask(t, "x", "sh", "-c", `echo noise; printf 'the answer is 42' > "$CARBD_RESULT"`)
	if h.result.Status != 0 || h.result.Text != "the answer is 42" {
		t.Errorf("result %+v", h.result)
	}
}

func TestSessionNoticesReachTheAgent(t *testing.T) {
	h, done := startSession(t, t.TempDir())
	// The agent waits (boundedly) for a notice and prints the file.
	h.send(&ctrl.Task{ID: "n", Text: "x", Argv: []string{"sh", "-c",
		`i=0; while [ ! -s "$CARBD_NOTICES" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; cat "$CARBD_NOTICES"`}})
	h.recvUntil(ctrl.TypeStarted)
	h.send(ctrl.AbortNotice([]string{"POST http://evil.example/"}))
	h.recvUntil(ctrl.TypeResult)
	h.send(&ctrl.Shutdown{})
	<-done
	got := h.stdout.String()
	if !strings.HasPrefix(got, "--- carbd notice 1 ---\ncarbd withheld") || !strings.Contains(got, "POST http://evil.example/") {
		t.Errorf("the agent read %q", got)
	}
}

func TestSessionShutdownStopsTheAgent(t *testing.T) {
	h, done := startSession(t, t.TempDir())
	h.send(&ctrl.Task{ID: "s", Text: "x", Argv: []string{"sh", "-c", `echo up; exec sleep 600`}})
	h.recvUntil(ctrl.TypeOutput) // the agent runs
	h.send(&ctrl.Shutdown{})
	h.recvUntil(ctrl.TypeResult)
	out := <-done
	if h.result.Status != 128+15 {
		t.Errorf("status %d, want 143 (SIGTERM)", h.result.Status)
	}
	if !out.aborted {
		t.Error("not reported as aborted")
	}
}

func TestSessionHostGoneStopsTheAgent(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	defer guestEnd.Close()
	s := &session{conn: ctrl.NewConn(guestEnd), log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		workdir: t.TempDir(), rundir: t.TempDir(), killGrace: time.Second, shutdownWait: time.Minute}
	done := make(chan *outcome, 1)
	go func() { out, _ := s.run(context.Background()); done <- out }()
	h := &host{t: t, conn: ctrl.NewConn(hostEnd)}
	if _, err := h.conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	h.send(&ctrl.Task{ID: "g", Text: "x", Argv: []string{"/bin/sh", "-c", "exec sleep 600"}})
	h.recvUntil(ctrl.TypeStarted)
	hostEnd.Close() // fail closed: the agent must not outlive its host
	out := <-done
	if out.result == nil || out.result.Status != 128+15 || !out.aborted {
		t.Errorf("outcome %+v", out)
	}
}

func TestSessionSignalStatusAndStartFailure(t *testing.T) {
	h, _ := runTask(t, "x", "sh", "-c", `kill -9 $$`)
	if h.result.Status != 128+9 {
		t.Errorf("killed agent: status %d, want 137", h.result.Status)
	}
	h, _ = runTask(t, "x", "/nonexistent/agent")
	if h.result.Status != -1 || !strings.Contains(h.result.Text, "no such file") {
		t.Errorf("missing agent: %+v", h.result)
	}
	if h.pid != 0 {
		t.Errorf("started sent for an agent that did not start")
	}
}

func TestSessionBackgroundChildDoesNotHangTheResult(t *testing.T) {
	// The agent leaves a child holding its stdout; the helper kills the
	// group once the agent exits, so the result still comes.
	h, _ := runTask(t, "x", "sh", "-c", `sleep 600 & echo done`)
	if h.result.Status != 0 || h.stdout.String() != "done\n" {
		t.Errorf("result %+v stdout %q", h.result, h.stdout.String())
	}
}

func TestSessionLargeOutputIsChunked(t *testing.T) {
	const n = 5*ctrl.MaxChunk + 123
	h, _ := runTask(t, "x", "head", "-c", strconv.Itoa(n), "/dev/zero")
	if h.stdout.Len() != n {
		t.Fatalf("%d bytes of output, want %d", h.stdout.Len(), n)
	}
	if h.chunks < 6 {
		t.Errorf("%d chunks for %d bytes", h.chunks, n)
	}
	if len(h.result.Text) != stdoutTail {
		t.Errorf("result text of %d bytes, want the %d-byte tail", len(h.result.Text), stdoutTail)
	}
}

func TestSessionShutdownBeforeTask(t *testing.T) {
	h, done := startSession(t, t.TempDir())
	h.send(&ctrl.Shutdown{})
	if out := <-done; out.task != nil {
		t.Errorf("outcome %+v", out)
	}
}

func TestRunOverUnixSocket(t *testing.T) {
	// run() as the namespace backend uses it: -socket PATH.
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cfg, err := parseFlags([]string{"-socket", sock, "-workdir", dir, "-rundir", filepath.Join(dir, "run"), "-shutdown-wait", "1m"})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- run(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	h := &host{t: t, conn: ctrl.NewConn(c)}
	defer h.conn.Close()
	if _, err := h.conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	h.send(&ctrl.Task{ID: "u", Text: "x", Argv: []string{"sh", "-c", "echo via socket"}})
	h.recvUntil(ctrl.TypeResult)
	h.send(&ctrl.Shutdown{})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if h.stdout.String() != "via socket\n" || h.result.Status != 0 {
		t.Errorf("stdout %q result %+v", h.stdout.String(), h.result)
	}
}

func TestParseFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-port", "a", "-socket", "/s"},
		{"-fd", "3", "-vsock-port", "5"},
		{"-port", "a", "extra"},
		{"-vsock-port", "4294967296"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q) accepted", args)
		}
	}
	c, err := parseFlags([]string{"-port", "carbd.ctrl", "-poweroff"})
	if err != nil || c.port != "carbd.ctrl" || !c.poweroff || c.rundir != "/run/carbd" {
		t.Errorf("parseFlags: %+v %v", c, err)
	}
}

func TestFindVirtioPort(t *testing.T) {
	// The sysfs lookup, on a fake /sys/class/virtio-ports; the device
	// node must exist in /dev, so point it at one that does.
	dir := t.TempDir()
	old := sysVirtioPorts
	sysVirtioPorts = dir
	defer func() { sysVirtioPorts = old }()
	for name, port := range map[string]string{"null": "org.qemu.guest_agent.0", "zero": "carbd.ctrl"} {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		os.WriteFile(filepath.Join(dir, name, "name"), []byte(port+"\n"), 0o644)
	}
	if got, err := findVirtioPort("carbd.ctrl"); err != nil || got != "/dev/zero" {
		t.Errorf("findVirtioPort = %q, %v; want /dev/zero", got, err)
	}
	if _, err := findVirtioPort("other"); !os.IsNotExist(err) {
		t.Errorf("missing port: %v", err)
	}
}

// TestSessionEnv: the host's env message reaches the agent's environment
// (after carbd's variables and the helper's: the user's last), and the
// helper's log never shows a value.
func TestSessionEnv(t *testing.T) {
	const key = "sk-test-9f8e7d6c5b4a39281706"
	hostEnd, guestEnd := net.Pipe()
	t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
	var logs bytes.Buffer
	s := &session{conn: ctrl.NewConn(guestEnd), log: slog.New(slog.NewTextHandler(&logs, nil)), workdir: t.TempDir(),
		rundir: filepath.Join(t.TempDir(), "run"), env: []string{"PATH=" + os.Getenv("PATH"), "HOME=/guest"},
		killGrace: 2 * time.Second, shutdownWait: time.Minute}
	done := make(chan *outcome, 1)
	go func() {
		out, err := s.run(context.Background())
		if err != nil {
			t.Errorf("session: %v", err)
		}
		done <- out
	}()
	h := &host{t: t, conn: ctrl.NewConn(hostEnd)}
	if _, err := h.conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	h.send(&ctrl.Env{Vars: []string{"API_KEY=" + key, "HOME=/override", "EMPTY="}})
	h.send(&ctrl.Task{ID: "t1", Text: "x", Argv: []string{"sh", "-c", `echo "key=$API_KEY home=$HOME empty=${EMPTY-unset} id=$CARBD_TASK_ID"; tr '\0' '\n' </proc/$$/cmdline`}})
	h.recvUntil(ctrl.TypeResult)
	h.send(&ctrl.Shutdown{})
	<-done
	out := h.stdout.String()
	if !strings.Contains(out, "key="+key+" home=/override empty= id=t1\n") {
		t.Errorf("the agent's environment: %q", out)
	}
	if strings.Count(out, key) != 1 {
		t.Errorf("the value is in the agent's argv: %q", out)
	}
	if strings.Contains(logs.String(), key) || !strings.Contains(logs.String(), "env=3") {
		t.Errorf("the helper's log: %q (want the count, not the value)", logs.String())
	}
}

// TestSessionEnvTwiceRefused: one env message per session, before the
// task.
func TestSessionEnvTwiceRefused(t *testing.T) {
	hostEnd, guestEnd := net.Pipe()
	t.Cleanup(func() { hostEnd.Close(); guestEnd.Close() })
	s := &session{conn: ctrl.NewConn(guestEnd), log: slog.New(slog.NewTextHandler(io.Discard, nil)), workdir: t.TempDir(),
		rundir: filepath.Join(t.TempDir(), "run"), killGrace: time.Second, shutdownWait: time.Second}
	errc := make(chan error, 1)
	go func() { _, err := s.run(context.Background()); errc <- err }()
	h := &host{t: t, conn: ctrl.NewConn(hostEnd)}
	if _, err := h.conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	h.send(&ctrl.Env{Vars: []string{"A=1"}})
	h.send(&ctrl.Env{Vars: []string{"A=2"}})
	if err := <-errc; !errors.Is(err, ctrl.ErrUnexpected) {
		t.Errorf("session: %v, want ErrUnexpected", err)
	}
}
