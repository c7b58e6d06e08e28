package chv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/carbd/carbd/internal/proc"
)

// VM is a running cloud-hypervisor process.
type VM struct {
	// API is the REST API client.
	API *Client
	// Version is what vmm.ping answered.
	Version string
	// Args is the command line (with the binary).
	Args []string
	// Started is when the process was started.
	Started time.Time

	cfg  Config
	cmd  *exec.Cmd
	tail *proc.Tail
	done chan struct{}
	err  error // set before done is closed

	mu      sync.Mutex // guards stopped
	stopped bool
}

var elfMagic = []byte{0x7f, 'E', 'L', 'F'}

// Start runs cloud-hypervisor with cfg and returns once its API answers
// vmm.ping. The kernel must be an ELF vmlinux (PVH). The process gets
// SIGKILL if carbd dies, so a guest never outlives it. ctx bounds the
// start only.
func Start(ctx context.Context, cfg Config) (_ *VM, err error) {
	args, err := cfg.Args()
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := checkELF(cfg.Kernel); err != nil {
		return nil, err
	}
	if _, err := os.Stat(cfg.Initramfs); err != nil {
		return nil, fmt.Errorf("chv: initramfs: %w", err)
	}
	for _, p := range []string{cfg.APISocket, cfg.Vsock.Socket} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("chv: remove stale %s: %w", p, err)
		}
	}
	vm := &VM{
		API:  NewClient(cfg.APISocket),
		Args: append([]string{cfg.Binary}, args...),
		cfg:  cfg,
		tail: &proc.Tail{Max: 8192},
		done: make(chan struct{}),
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Stdout = vm.tail
	cmd.Stderr = vm.tail
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	vm.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chv: start %s: %w", cfg.Binary, err)
	}
	vm.cmd = cmd
	go func() {
		werr := cmd.Wait()
		vm.mu.Lock()
		stopped := vm.stopped
		vm.mu.Unlock()
		if werr != nil && !stopped {
			vm.err = fmt.Errorf("chv: cloud-hypervisor: %w: %s", werr, bytes.TrimSpace(vm.tail.Bytes()))
		}
		close(vm.done)
	}()
	defer func() {
		if err != nil {
			vm.Kill()
		}
	}()

	wait := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		p, perr := vm.API.Ping(wait)
		if perr == nil {
			vm.Version = p.Version
			return vm, nil
		}
		select {
		case <-vm.done:
			return nil, fmt.Errorf("chv: cloud-hypervisor exited while starting (%v): %s", cmd.ProcessState, bytes.TrimSpace(vm.tail.Bytes()))
		case <-wait.Done():
			return nil, fmt.Errorf("chv: api socket %s: %w (last: %v)", cfg.APISocket, wait.Err(), perr)
		case <-tick.C:
		}
	}
}

func checkELF(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("chv: kernel: %w", err)
	}
	defer f.Close()
	head := make([]byte, 4)
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, elfMagic) {
		return fmt.Errorf("chv: kernel %s is not an ELF vmlinux (Cloud Hypervisor boots a PVH vmlinux, not a bzImage: use vmimage/out/vmlinux)", path)
	}
	return nil
}

// DialCtrl connects to the guest's control port through the hybrid
// vsock socket, retrying while nothing listens on it yet (the guest is
// booting), until ctx is done.
func (vm *VM) DialCtrl(ctx context.Context) (*VsockConn, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := DialVsock(ctx, vm.cfg.Vsock.Socket, vm.cfg.Vsock.Port)
		if err == nil {
			return c, nil
		}
		select {
		case <-vm.done:
			return nil, fmt.Errorf("chv: vm exited: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("chv: control port %d: %w (last: %v)", vm.cfg.Vsock.Port, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// PID is the cloud-hypervisor process id.
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// Output is the tail of cloud-hypervisor's stdout and stderr.
func (vm *VM) Output() []byte { return vm.tail.Bytes() }

// Done is closed when the process has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait waits for the process to exit: nil when it exited cleanly (the
// guest powered off, vmm.shutdown) or Stop ended it.
func (vm *VM) Wait() error {
	<-vm.done
	return vm.err
}

// Stop ends the VMM: PUT vmm.shutdown, then SIGTERM, then SIGKILL, each
// after the grace period, and returns once it has exited.
func (vm *VM) Stop(ctx context.Context) error {
	vm.mu.Lock()
	vm.stopped = true
	vm.mu.Unlock()
	defer vm.API.Close()
	select {
	case <-vm.done:
		return nil
	default:
	}
	actx, cancel := context.WithTimeout(ctx, vm.cfg.StopGrace)
	err := vm.API.ShutdownVMM(actx)
	cancel()
	if err == nil && vm.waitFor(vm.cfg.StopGrace) {
		return nil
	}
	if err := vm.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("chv: stop: %w", err)
	}
	if vm.waitFor(vm.cfg.StopGrace) {
		return nil
	}
	return vm.Kill()
}

// Kill sends SIGKILL and waits for the process to exit.
func (vm *VM) Kill() error {
	vm.mu.Lock()
	vm.stopped = true
	vm.mu.Unlock()
	if err := vm.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("chv: kill: %w", err)
	}
	<-vm.done
	return nil
}

func (vm *VM) waitFor(d time.Duration) bool {
	select {
	case <-vm.done:
		return true
	case <-time.After(d):
		return false
	}
}
