package daemon

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/sandbox/qemu"
)

// qemuLauncher is the qemu backend: q35 (KVM where a stock guest runs
// under it, else TCG), the tap as a virtio-net device, the export as
// vhost-user-fs with a shared memfd, the control channel on a
// virtio-serial port, QMP for pausing.
type qemuLauncher struct{}

func (qemuLauncher) check(cfg *VMConfig) []error {
	if cfg.Binary == "" {
		cfg.Binary = qemu.DefaultBinary
	}
	if _, err := lookBinary(cfg.Binary); err != nil {
		return []error{fmt.Errorf("QEMU is missing (%s: %v): install it (Debian: apt-get install qemu-system-x86) or give its path", cfg.Binary, err)}
	}
	switch cfg.Accel {
	case "", string(qemu.KVM), string(qemu.TCG):
		return nil
	}
	return []error{fmt.Errorf("accelerator %q (want kvm, tcg, or empty to probe)", cfg.Accel)}
}

func (qemuLauncher) launch(ctx context.Context, s *vmSpec) (hypervisor, error) {
	p := s.nc.plan
	qc := qemu.Config{
		Binary:    s.cfg.Binary,
		Accel:     qemu.Accel(s.cfg.Accel),
		CPUs:      s.cfg.CPUs,
		MemoryMiB: s.cfg.MemoryMiB,
		Kernel:    s.image.Kernel,
		Initrd:    s.initrd,
		Net: &qemu.Net{Tap: s.tap, Addr: p.GuestAddr4, Gateway: p.HostAddr4.Addr(),
			DNS: p.HostAddr4.Addr(), Addr6: p.GuestAddr6, Gateway6: p.HostAddr6.Addr()},
		FS:         &qemu.FS{Socket: s.vfsSock, Tag: vmFSTag, MountPoint: s.workdir},
		CtrlSocket: filepath.Join(s.dir, "ctl.sock"),
		QMPSocket:  filepath.Join(s.dir, "qmp.sock"),
		ConsoleLog: s.console,
		Verbose:    s.cfg.Verbose,
	}
	vm, err := qemu.Start(ctx, qc)
	if err != nil {
		return nil, fmt.Errorf("%w%s", err, diagText(nil, s.console))
	}
	s.nc.d.log.Info("qemu started", "accel", vm.Accel, "why", vm.AccelReason, "pid", vm.PID())
	return &qemuVM{vm: vm, console: s.console}, nil
}

// qemuVM is a running QEMU.
type qemuVM struct {
	vm      *qemu.VM
	console string
}

func (q *qemuVM) pid() int { return q.vm.PID() }

// connect returns the control channel: QEMU's socket was connected
// before the guest booted, so the hello is its first message.
func (q *qemuVM) connect(context.Context) (*ctrl.Conn, error) { return q.vm.Ctrl, nil }

// pause is QMP stop: the vCPUs stop, so the guest neither runs nor
// sends; QEMU stays up until stop.
func (q *qemuVM) pause(ctx context.Context) error { return q.vm.Pause(ctx) }

// stop is SIGTERM to QEMU (it exits at once, as a power cut), SIGKILL
// after the grace period.
func (q *qemuVM) stop() error           { return q.vm.Stop() }
func (q *qemuVM) done() <-chan struct{} { return q.vm.Done() }
func (q *qemuVM) exitErr() error        { return q.vm.Wait() }
func (q *qemuVM) diag() string          { return diagText(q.vm.Output(), q.console) }
