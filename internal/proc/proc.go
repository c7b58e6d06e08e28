// Package proc holds what carbd's launchers of helper processes (QEMU,
// Cloud Hypervisor, virtiofsd) share: a graceful stop and a bounded tail of
// their output for error messages.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Stop asks the process to exit (SIGTERM), waits up to grace for done to
// close (the caller's Wait goroutine closes it), then kills it and waits.
// name prefixes errors ("qemu: stop: ...").
func Stop(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration, name string) error {
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: stop: %w", name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(grace):
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: kill: %w", name, err)
	}
	<-done
	return nil
}

// Tail keeps the last Max bytes written to it. It is safe for concurrent
// use.
type Tail struct {
	Max int

	mu sync.Mutex // guards b
	b  []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.Max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.Max:]...)
	}
	return len(p), nil
}

// Bytes returns a copy of what is kept.
func (t *Tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.b...)
}
