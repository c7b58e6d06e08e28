package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/carbd/carbd/internal/proc"
	"github.com/carbd/carbd/pkg/ctrl"
)

// VM is a running QEMU.
type VM struct {
	// Ctrl is the control channel, connected before the guest boots.
	Ctrl *ctrl.Conn
	// Accel is the accelerator in use and AccelReason why (from
	// ProbeAccel when Config.Accel was empty).
	Accel       Accel
	AccelReason string
	// Args is QEMU's command line (with the binary).
	Args []string
	// Started is when QEMU was started.
	Started time.Time

	cmd        *exec.Cmd
	grace      time.Duration
	consoleLog string
	qmp        string     // QMP socket, "" without one
	qmpMu      sync.Mutex // one QMP client at a time
	tail       *proc.Tail
	done       chan struct{}
	err        error // Wait's result; set before done is closed

	mu      sync.Mutex // guards stopped
	stopped bool
}

// Start probes the accelerator when cfg.Accel is empty, starts QEMU and
// connects to its control socket. The guest's hello is the first message
// on vm.Ctrl. ctx bounds the start only (use Stop to end the VM). QEMU
// gets SIGKILL if the calling thread's process dies, so a guest never
// outlives carbd.
func Start(ctx context.Context, cfg Config) (_ *VM, err error) {
	reason := "configured"
	if cfg.Accel == "" {
		cfg.Accel, reason = ProbeAccel()
	}
	args, err := cfg.Args()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	for _, p := range []string{cfg.Kernel, cfg.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("qemu: boot image: %w", err)
		}
	}
	for _, p := range []string{cfg.CtrlSocket, cfg.QMPSocket} {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("qemu: remove stale %s: %w", p, err)
		}
	}
	vm := &VM{
		Accel:       cfg.Accel,
		AccelReason: reason,
		Args:        append([]string{cfg.Binary}, args...),
		grace:       cfg.StopGrace,
		consoleLog:  cfg.ConsoleLog,
		qmp:         cfg.QMPSocket,
		tail:        &proc.Tail{Max: 8192},
		done:        make(chan struct{}),
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Stdin = nil
	cmd.Stdout = vm.tail
	cmd.Stderr = vm.tail
	// QEMU must not outlive carbd (fail closed), and its process group
	// is its own so a terminal's ^C reaches carbd only.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	vm.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("qemu: start %s: %w", cfg.Binary, err)
	}
	vm.cmd = cmd
	go func() {
		werr := cmd.Wait()
		vm.mu.Lock()
		stopped := vm.stopped
		vm.mu.Unlock()
		if werr != nil && !stopped {
			vm.err = fmt.Errorf("qemu: %w: %s", werr, bytes.TrimSpace(vm.tail.Bytes()))
		}
		close(vm.done)
	}()
	defer func() {
		if err != nil {
			vm.Stop()
		}
	}()

	wait := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	conn, err := dialWhenListening(wait, cfg.CtrlSocket, vm.done)
	if err != nil {
		if e := vm.exitError(); e != nil {
			return nil, e
		}
		return nil, fmt.Errorf("qemu: control socket: %w", err)
	}
	vm.Ctrl = ctrl.NewConn(conn)
	return vm, nil
}

// exitError returns why QEMU exited when it has.
func (vm *VM) exitError() error {
	select {
	case <-vm.done:
		return fmt.Errorf("qemu: exited while starting (%v): %s", vm.cmd.ProcessState, bytes.TrimSpace(vm.tail.Bytes()))
	default:
		return nil
	}
}

// dialWhenListening connects to the Unix socket path once QEMU listens on
// it.
func dialWhenListening(ctx context.Context, path string, exited <-chan struct{}) (net.Conn, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return c, nil
		}
		select {
		case <-exited:
			return nil, errors.New("qemu exited")
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w (last: %v)", path, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// PID is QEMU's process id.
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// ConsoleLog is the file the guest's serial console goes to.
func (vm *VM) ConsoleLog() string { return vm.consoleLog }

// Console returns the console log so far.
func (vm *VM) Console() ([]byte, error) { return os.ReadFile(vm.consoleLog) }

// Output is the tail of QEMU's own stdout and stderr.
func (vm *VM) Output() []byte { return vm.tail.Bytes() }

// Done is closed when QEMU has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait waits for QEMU to exit: nil when the guest powered off (or Stop
// ended it), else QEMU's exit error with its last output.
func (vm *VM) Wait() error {
	<-vm.done
	return vm.err
}

// Stop ends QEMU: SIGTERM, then SIGKILL after the grace period. It
// closes the control channel and returns once QEMU has exited. Stopping a
// VM that has exited is not an error.
func (vm *VM) Stop() error {
	vm.mu.Lock()
	vm.stopped = true
	vm.mu.Unlock()
	if vm.Ctrl != nil {
		vm.Ctrl.Close()
	}
	return proc.Stop(vm.cmd, vm.done, vm.grace, "qemu")
}

// QMP runs one command on the VM's QMP socket (see QMPExecute).
func (vm *VM) QMP(ctx context.Context, command string, args any) (json.RawMessage, error) {
	if vm.qmp == "" {
		return nil, ErrNoQMP
	}
	vm.qmpMu.Lock()
	defer vm.qmpMu.Unlock()
	return QMPExecute(ctx, vm.qmp, command, args)
}

// Pause stops the guest's vCPUs (QMP stop): the guest runs no more
// instruction and its devices send nothing until Resume. QEMU keeps
// running: Stop still ends it.
func (vm *VM) Pause(ctx context.Context) error {
	_, err := vm.QMP(ctx, "stop", nil)
	return err
}

// Resume restarts the guest's vCPUs (QMP cont).
func (vm *VM) Resume(ctx context.Context) error {
	_, err := vm.QMP(ctx, "cont", nil)
	return err
}

// Status is the run state QMP query-status reports: "running",
// "paused", "shutdown", ...
func (vm *VM) Status(ctx context.Context) (string, error) {
	b, err := vm.QMP(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.Status == "" {
		return "", fmt.Errorf("qemu: qmp query-status: answer %s", b)
	}
	return st.Status, nil
}
