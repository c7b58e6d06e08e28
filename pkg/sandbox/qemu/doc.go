// Package qemu launches carbd's guest VM with QEMU: the real VM backend
// on hosts without Cloud Hypervisor (and the one the tests boot here).
//
// # What it does
//
// Config.Args builds QEMU's command line as data (pure, tested against
// golden argv): q35 (virtio-pci) or microvm (virtio-mmio), KVM or TCG,
// direct kernel boot of the vmimage kernel and initramfs with the
// carbd.* kernel parameters the image's /init reads (network addressing,
// virtio-fs tag and mount point, control port), a shared memfd memory
// backend (vhost-user-fs needs it), a vhost-user-fs device on virtiofsd's
// socket, a virtio-net device on a tap, the control channel on a
// virtio-serial port named carbd.ctrl whose host end is a Unix socket
// QEMU listens on, the serial console to a file, -no-reboot.
//
// Start probes the accelerator when none is configured (ProbeAccel: KVM
// only when /dev/kvm is hardware virtualisation and runs a probe guest;
// a PVM /dev/kvm, as on carbd's development machines, does not run a
// stock kernel, so TCG there), runs QEMU, and connects to the control
// socket before the guest boots, so the guest's hello is the first
// message on VM.Ctrl. Stop sends SIGTERM, then SIGKILL after a grace
// period; QEMU also gets SIGKILL if carbd dies (fail closed).
//
// CreateTap makes the persistent tap device QEMU attaches to (carbd puts
// its TC program and netfilter rules on it); CreateTapDown makes it down,
// so the hooks are attached before Tap.Up. virtiofsd is started per
// boot with fileev.StartVirtiofsd (pkg/hooks/fileev), which also lets it
// run in a traced cgroup.
//
// With Config.QMPSocket, QEMU serves its machine protocol there:
// VM.Pause (QMP stop: the guest's vCPUs stop), VM.Resume (cont),
// VM.Status (query-status), VM.QMP for any command (QMPExecute).
//
// # Requirements
//
// Linux, root (tap devices, /dev/kvm), qemu-system-x86_64 and
// /usr/lib/qemu/virtiofsd (qemu-system-x86, qemu-system-common), the
// image built by `make vmimage`.
//
// # Tests
//
// Unprivileged: golden argv for q35/TCG and microvm/KVM, validation, the
// QMP client against a fake QMP server.
// As root: tap creation (up and down) and removal, QMP pause and resume
// of a real QEMU, the accelerator probe (on a fake
// /sys/module too), QEMU failures surfacing with QEMU's message, Stop,
// and TestBootRunTask, a real boot (slow, skipped by -short): the image
// boots with a tap, virtio-fs over a temporary directory, a per-boot
// CA overlay and the control port; the task writes a file into the export
// and fetches a page with curl from an HTTP server on the host side of the
// tap; the test checks the hello, the file on the host, the request the
// server saw, the result, and that the VM powers off. It logs the boot
// time (launch to hello).
package qemu
