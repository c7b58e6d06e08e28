package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/sandbox/chv"
)

// chvLauncher is the cloud-hypervisor backend, launched and driven as
// Cloud Hypervisor's code behaves (docs/vm.md): --api-socket, --kernel
// (the image's PVH vmlinux), --initramfs, --cmdline, --memory shared=on
// (for --fs), --net on the tap carbd created with its address (by name
// only: Cloud Hypervisor v37 and later leave an existing tap's address
// alone, so ip=/mask= would do nothing), --fs on virtiofsd's socket,
// --vsock (hybrid: the control channel is "CONNECT <port>" on its Unix
// socket), the serial console to a file, --event-monitor on a pipe and
// --pvpanic (a guest reset or panic ends the run: carbd's guest never
// reboots); vm.pause on a ledger stop, vm.shutdown then vmm.shutdown to
// stop.
type chvLauncher struct{}

// chvCID is the guest's vsock context id. With hybrid vsock the host
// side is a Unix socket per VM, so every VM may use the same one.
const chvCID = 3

func (chvLauncher) check(cfg *VMConfig) []error {
	if cfg.Binary == "" {
		cfg.Binary = chv.DefaultBinary
	}
	var errs []error
	if _, err := lookBinary(cfg.Binary); err != nil {
		errs = append(errs, fmt.Errorf("the cloud-hypervisor binary is missing (%s: %v): install Cloud Hypervisor's release binary (cloud-hypervisor-static from https://github.com/cloud-hypervisor/cloud-hypervisor/releases) or the distribution's cloud-hypervisor package, or give its path; on hosts without it use --backend qemu", cfg.Binary, err))
	}
	if cfg.Accel != "" {
		errs = append(errs, fmt.Errorf("accelerator %q: Cloud Hypervisor always uses KVM (or MSHV)", cfg.Accel))
	}
	return errs
}

func (chvLauncher) launch(ctx context.Context, s *vmSpec) (hypervisor, error) {
	if _, err := os.Stat(s.vmlinux); err != nil {
		return nil, fmt.Errorf("the guest image has no vmlinux (%v): Cloud Hypervisor boots the ELF kernel `make vmimage` writes next to vmlinuz", err)
	}
	p := s.nc.plan
	cc := chv.Config{
		Binary:    s.cfg.Binary,
		APISocket: filepath.Join(s.dir, "api.sock"),
		Kernel:    s.vmlinux,
		Initramfs: s.initrd,
		CPUs:      s.cfg.CPUs,
		MemoryMiB: s.cfg.MemoryMiB,
		Net: &chv.Net{Tap: s.tap, Addr: p.GuestAddr4,
			Gateway: p.HostAddr4.Addr(), DNS: p.HostAddr4.Addr(), Addr6: p.GuestAddr6, Gateway6: p.HostAddr6.Addr()},
		FS:        &chv.FS{Socket: s.vfsSock, Tag: vmFSTag, MountPoint: s.workdir},
		Vsock:     chv.Vsock{CID: chvCID, Socket: filepath.Join(s.dir, "vsock.sock"), Port: chv.DefaultCtrlPort},
		SerialLog: s.console,
		Verbose:   s.cfg.Verbose,
	}
	vm, err := chv.Start(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("%w (Cloud Hypervisor needs /dev/kvm with hardware virtualisation)%s", err, diagText(nil, s.console))
	}
	s.nc.d.log.Info("cloud-hypervisor started", "version", vm.Version, "pid", vm.PID())
	return &chvVM{vm: vm, console: s.console}, nil
}

// chvVM is a running Cloud Hypervisor.
type chvVM struct {
	vm      *chv.VM
	console string
	stopMu  sync.Mutex // one stop sequence at a time
}

func (c *chvVM) pid() int { return c.vm.PID() }

// connect dials the guest's control port through the hybrid vsock,
// retrying while the guest boots.
func (c *chvVM) connect(ctx context.Context) (*ctrl.Conn, error) {
	vc, err := c.vm.DialCtrl(ctx)
	if err != nil {
		return nil, err
	}
	return ctrl.NewConn(vc), nil
}

// pause is PUT vm.pause.
func (c *chvVM) pause(ctx context.Context) error { return c.vm.API.Pause(ctx) }

// stop is PUT vm.shutdown (the guest stops at once; the VMM stays up),
// then the VMM's own stop: PUT vmm.shutdown, SIGTERM, SIGKILL. A VM that
// is already down is not an error: vm.shutdown then answers 500 "VM is
// not running" (ErrWrongState), or nothing answers because the VMM is
// exiting; what stop reports is whether the VMM could be ended.
func (c *chvVM) stop() error {
	c.stopMu.Lock()
	defer c.stopMu.Unlock()
	select {
	case <-c.vm.Done():
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	// Its error is of no consequence: vmm.shutdown shuts the VM down
	// too (Vmm::vmm_shutdown deletes it), and SIGTERM and SIGKILL follow.
	_ = c.vm.API.Shutdown(ctx)
	cancel()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.vm.Stop(ctx)
}

func (c *chvVM) done() <-chan struct{} { return c.vm.Done() }
func (c *chvVM) exitErr() error        { return c.vm.Wait() }

// diag says first whether the guest reset or panicked (the VMM was then
// stopped), then the VMM's output and the console's tail.
func (c *chvVM) diag() string {
	d := diagText(c.vm.Output(), c.console)
	if err := c.vm.GuestEnd(); err != nil {
		d = "\nthe guest ended: " + err.Error() + d
	}
	return d
}
