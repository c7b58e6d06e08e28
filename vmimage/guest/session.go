package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
)

const (
	// maxResultFile is the most of $CARBD_RESULT sent as the result text:
	// escaped as JSON it stays under ctrl.MaxLine.
	maxResultFile = 128 << 10
	// stdoutTail is how much of the agent's stdout is kept as the result
	// text when it writes no result file.
	stdoutTail = 64 << 10
)

// session runs one task over conn.
type session struct {
	conn         *ctrl.Conn
	log          *slog.Logger
	workdir      string
	rundir       string
	env          []string      // the agent's base environment
	killGrace    time.Duration // SIGTERM to SIGKILL
	shutdownWait time.Duration // how long to wait for shutdown after the result
}

// outcome is what run did, for the caller and the tests.
type outcome struct {
	task   *ctrl.Task
	result *ctrl.Result
	// aborted is set when a shutdown or the end of the stream stopped the
	// agent before it finished.
	aborted bool
}

// run says hello, waits for the task, runs it and sends the result. It
// returns after the host's shutdown, the end of the stream, or
// shutdownWait after the result.
func (s *session) run(ctx context.Context) (*outcome, error) {
	if err := s.conn.Send(&ctrl.Hello{Version: ctrl.Version}); err != nil {
		return nil, err
	}
	var task *ctrl.Task
	var agentEnv []string // the host's env message, if any
	for task == nil {
		m, err := s.conn.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return &outcome{}, nil // the host went away before a task
			}
			return nil, fmt.Errorf("wait for task: %w", err)
		}
		switch m := m.(type) {
		case *ctrl.Env:
			if agentEnv != nil {
				return nil, fmt.Errorf("wait for task: %w: a second env", ctrl.ErrUnexpected)
			}
			agentEnv = m.Vars
		case *ctrl.Task:
			task = m
		case *ctrl.Shutdown:
			return &outcome{}, nil
		default:
			return nil, fmt.Errorf("wait for task: %w: %s", ctrl.ErrUnexpected, m.Type())
		}
	}
	// The environment's values are credentials: their number only.
	s.log.Info("task", "id", task.ID, "argv", task.Argv, "env", len(agentEnv))

	if err := os.MkdirAll(s.rundir, 0o755); err != nil {
		return nil, fmt.Errorf("run dir: %w", err)
	}
	noticesPath := filepath.Join(s.rundir, "notices")
	resultPath := filepath.Join(s.rundir, "result")
	notices, err := os.OpenFile(noticesPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("notices file: %w", err)
	}
	defer notices.Close()
	if err := os.Remove(resultPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("result file: %w", err)
	}

	// The reader: notices go to the file; a shutdown or the end of the
	// stream closes stop.
	stop := make(chan struct{})
	var stopOnce sync.Once
	closeStop := func() { stopOnce.Do(func() { close(stop) }) }
	go func() {
		defer closeStop()
		n := 0
		for {
			m, err := s.conn.Recv()
			if err != nil {
				var le *ctrl.LineError
				if errors.As(err, &le) {
					s.log.Warn("control line refused", "err", err)
					continue
				}
				if !errors.Is(err, io.EOF) {
					s.log.Warn("control stream", "err", err)
				}
				return
			}
			switch m := m.(type) {
			case *ctrl.Notice:
				n++
				if _, err := fmt.Fprintf(notices, "--- carbd notice %d ---\n%s\n", n, m.Text); err != nil {
					s.log.Warn("write notice", "err", err)
				}
			case *ctrl.Shutdown:
				return
			default:
				s.log.Warn("unexpected message during the task", "type", m.Type())
			}
		}
	}()

	out := &outcome{task: task}
	status, tail, err := s.runAgent(ctx, task, agentEnv, noticesPath, resultPath, stop)
	text := string(tail)
	if err != nil {
		s.log.Warn("agent", "err", err)
		status, text = -1, err.Error()
	}
	select {
	case <-stop:
		out.aborted = err == nil && status != 0
	default:
	}
	if b, rerr := readBounded(resultPath, maxResultFile); rerr == nil {
		text = string(b)
	}
	out.result = &ctrl.Result{Status: status, Text: text}
	if err := s.conn.Send(out.result); err != nil {
		return out, err
	}
	s.log.Info("result", "status", status)
	select {
	case <-stop:
	case <-time.After(s.shutdownWait):
		s.log.Warn("no shutdown from the host", "waited", s.shutdownWait)
	case <-ctx.Done():
	}
	return out, nil
}

// runAgent starts the agent, streams its output and returns its status
// and the tail of its stdout. An error means it could not be started.
// The agent's environment is the helper's, then carbd's CARBD_*
// variables, then the host's env message (the user's last, as in the
// namespace backend: a name given twice takes the later value).
func (s *session) runAgent(ctx context.Context, task *ctrl.Task, agentEnv []string, noticesPath, resultPath string, stop <-chan struct{}) (int, []byte, error) {
	cmd := exec.Command(task.Argv[0], task.Argv[1:]...)
	cmd.Dir = s.workdir
	cmd.Env = append(append([]string(nil), s.env...),
		"CARBD_TASK="+task.Text,
		"CARBD_TASK_ID="+task.ID,
		"CARBD_NOTICES="+noticesPath,
		"CARBD_RESULT="+resultPath,
		"CARBD_WORKDIR="+s.workdir,
	)
	cmd.Env = append(cmd.Env, agentEnv...)
	cmd.Stdin = strings.NewReader(task.Text)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	outR, outW, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return 0, nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	if err := s.conn.Send(&ctrl.Started{PID: pid}); err != nil {
		s.log.Warn("send started", "err", err)
	}

	tail := &tailBuf{max: stdoutTail}
	var pumps sync.WaitGroup
	pumps.Add(2)
	go s.pump(&pumps, outR, ctrl.Stdout, tail)
	go s.pump(&pumps, errR, ctrl.Stderr, nil)

	exited := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-ctx.Done():
		case <-exited:
			return
		}
		s.log.Info("stopping the agent")
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(s.killGrace):
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	}()
	_ = cmd.Wait()
	close(exited)
	// What the agent left behind in its group goes with it, so that its
	// pipes close.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	pumps.Wait()
	outR.Close()
	errR.Close()

	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	status := ws.ExitStatus()
	if ws.Signaled() {
		status = 128 + int(ws.Signal())
	}
	return status, tail.Bytes(), nil
}

// pump sends what r yields as output messages of stream.
func (s *session) pump(wg *sync.WaitGroup, r io.Reader, stream ctrl.Stream, tail *tailBuf) {
	defer wg.Done()
	buf := make([]byte, ctrl.MaxChunk)
	sendOK := true
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if tail != nil {
				tail.Write(buf[:n])
			}
			if sendOK {
				if err := s.conn.Send(&ctrl.Output{Stream: stream, Data: buf[:n]}); err != nil {
					s.log.Warn("send output", "err", err)
					sendOK = false // keep draining so the agent does not block
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// readBounded reads at most max bytes of path.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

// tailBuf keeps the last max bytes written to it.
type tailBuf struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuf) Write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
}

func (t *tailBuf) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.b)
}
