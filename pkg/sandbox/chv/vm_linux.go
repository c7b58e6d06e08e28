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
	"github.com/carbd/carbd/pkg/sandbox/chv/internal/pvh"
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

	mu       sync.Mutex // guards the fields below
	stopped  bool
	guestEnd error   // the guest reset or panicked
	events   []Event // the last maxEvents events
	evErr    error   // the event stream's error, if it failed
}

// maxEvents is how many events a VM keeps for Events.
const maxEvents = 64

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
	if err := checkKernel(cfg.Kernel); err != nil {
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
	// The event monitor's pipe: the VMM writes to fd 3 (--event-monitor
	// fd=3), carbd reads until the VMM has exited.
	evR, evW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("chv: event monitor: %w", err)
	}
	cmd := exec.Command(cfg.Binary, args...)
	cmd.Stdout = vm.tail
	cmd.Stderr = vm.tail
	cmd.ExtraFiles = []*os.File{evW} // fd 3: EventMonitorFD
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	vm.Started = time.Now()
	err = cmd.Start()
	evW.Close()
	if err != nil {
		evR.Close()
		return nil, fmt.Errorf("chv: start %s: %w", cfg.Binary, err)
	}
	vm.cmd = cmd
	evDone := make(chan struct{})
	go func() {
		defer close(evDone)
		defer evR.Close()
		vm.watchEvents(evR)
	}()
	go func() {
		werr := cmd.Wait()
		<-evDone // every event the VMM wrote is read
		vm.mu.Lock()
		stopped, guestEnd := vm.stopped, vm.guestEnd
		vm.mu.Unlock()
		switch {
		case guestEnd != nil:
			vm.err = guestEnd
		case werr != nil && !stopped:
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
			if errors.Is(vm.err, ErrGuestEnded) {
				return nil, fmt.Errorf("chv: cloud-hypervisor stopped while starting: %w", vm.err)
			}
			return nil, fmt.Errorf("chv: cloud-hypervisor exited while starting (%v): %s", cmd.ProcessState, bytes.TrimSpace(vm.tail.Bytes()))
		case <-wait.Done():
			return nil, fmt.Errorf("chv: api socket %s: %w (last: %v)", cfg.APISocket, wait.Err(), perr)
		case <-tick.C:
		}
	}
}

// checkKernel checks that the kernel is an ELF vmlinux with a PVH entry
// note, what carbd boots Cloud Hypervisor with (v48 and later would also
// load a bzImage; carbd's image gives it the vmlinux).
func checkKernel(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("chv: kernel: %w", err)
	}
	head := make([]byte, 4)
	_, err = io.ReadFull(f, head)
	f.Close()
	if err != nil || !bytes.Equal(head, elfMagic) {
		return fmt.Errorf("chv: kernel %s is not an ELF vmlinux (carbd boots Cloud Hypervisor through the PVH entry of the image's vmlinux: use vmimage/out/vmlinux)", path)
	}
	ok, err := pvh.HasEntry(path)
	if err != nil {
		return fmt.Errorf("chv: kernel %s: %w", path, err)
	}
	if !ok {
		return fmt.Errorf("chv: kernel %s has no PVH entry note (Cloud Hypervisor would refuse it: \"Kernel lacks PVH header\"): build the guest kernel with CONFIG_PVH", path)
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
			if vm.err != nil {
				return nil, fmt.Errorf("chv: vm exited: %w", vm.err)
			}
			return nil, fmt.Errorf("chv: vm exited: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("chv: control port %d: %w (last: %v)", vm.cfg.Vsock.Port, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// ErrGuestEnded is the error of a VM whose guest reset or panicked
// (Event.GuestEnded): Start's VM stops the VMM then, as carbd's guest
// never reboots; Wait and DialCtrl return it, wrapped with the event.
var ErrGuestEnded = errors.New("chv: the guest reset or panicked")

// watchEvents reads the event monitor until the VMM closes it; the first
// event that ends the guest stops the VMM.
func (vm *VM) watchEvents(r io.Reader) {
	err := ReadEvents(r, func(e Event) {
		vm.mu.Lock()
		if len(vm.events) == maxEvents {
			vm.events = append(vm.events[:0], vm.events[1:]...)
		}
		vm.events = append(vm.events, e)
		first := e.GuestEnded() && vm.guestEnd == nil
		if first {
			vm.guestEnd = fmt.Errorf("%w: event %q at %v (a kernel panic under panic=-1, or a reboot): the VM is stopped", ErrGuestEnded, e.String(), e.Timestamp.Duration())
		}
		vm.mu.Unlock()
		if first {
			go vm.Stop(context.Background())
		}
	})
	if err != nil {
		vm.mu.Lock()
		vm.evErr = err
		vm.mu.Unlock()
		io.Copy(io.Discard, r) // never block the VMM's writes
	}
}

// GuestEnd is ErrGuestEnded (wrapped, with the event) once the guest has
// reset or panicked, else nil.
func (vm *VM) GuestEnd() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.guestEnd
}

// Events returns the last events the VMM reported, and the event
// stream's error if it was not Cloud Hypervisor's.
func (vm *VM) Events() ([]Event, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return append([]Event(nil), vm.events...), vm.evErr
}

// PID is the cloud-hypervisor process id.
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// Output is the tail of cloud-hypervisor's stdout and stderr.
func (vm *VM) Output() []byte { return vm.tail.Bytes() }

// Done is closed when the process has exited.
func (vm *VM) Done() <-chan struct{} { return vm.done }

// Wait waits for the process to exit: nil when it exited cleanly (the
// guest powered off, vmm.shutdown) or Stop ended it; ErrGuestEnded
// (wrapped) when the guest reset or panicked.
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
