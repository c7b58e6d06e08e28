package qemu

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Machine is QEMU's machine type.
type Machine string

// The machine types the launcher knows.
const (
	// Q35 is a PC with PCI Express: virtio devices are PCI devices.
	Q35 Machine = "q35"
	// MicroVM is QEMU's minimal machine: virtio devices are virtio-mmio
	// devices the kernel finds through ACPI. For KVM hosts: under TCG the
	// Debian kernel finds no clock source on it and stalls (docs/vm.md).
	MicroVM Machine = "microvm"
)

// Accel is QEMU's accelerator.
type Accel string

// The accelerators.
const (
	KVM Accel = "kvm" // hardware virtualisation through /dev/kvm
	TCG Accel = "tcg" // QEMU's binary translation: slow, works anywhere
)

// DefaultBinary is the QEMU executable Start runs when Config.Binary is
// empty.
const DefaultBinary = "qemu-system-x86_64"

// CtrlPortName is the name of the virtio-serial port that carries the
// control channel; the guest helper finds it by this name.
const CtrlPortName = "carbd.ctrl"

// Config describes one VM. Args turns it into QEMU's command line.
type Config struct {
	// Binary is the QEMU executable (default DefaultBinary).
	Binary string
	// Machine is Q35 (default) or MicroVM.
	Machine Machine
	// Accel is KVM or TCG; empty makes Start probe (ProbeAccel) and
	// use KVM only where a guest really runs under it.
	Accel Accel
	// CPUs is the number of vCPUs (default 1).
	CPUs int
	// MemoryMiB is the guest's memory (default 512). It is a shared memfd
	// backend, which vhost-user-fs needs.
	MemoryMiB int
	// Kernel and Initrd are the image to boot (see package vmimage).
	Kernel, Initrd string
	// Net attaches the guest's one network interface to a tap device.
	Net *Net
	// FS exports a directory over vhost-user-fs (a running virtiofsd).
	FS *FS
	// CtrlSocket is the Unix socket QEMU listens on for the control
	// port (a virtio-serial port named CtrlPortName); Start connects to
	// it. Required.
	CtrlSocket string
	// QMPSocket, when set, is the Unix socket QEMU serves its machine
	// protocol on (-qmp unix:PATH,server=on,wait=off): VM.Pause,
	// VM.Resume and VM.Status use it.
	QMPSocket string
	// ConsoleLog receives the guest's serial console (kernel messages,
	// the image's /init log). Required.
	ConsoleLog string
	// Verbose drops "quiet" from the kernel command line, so the console
	// log has every boot message (slower under TCG).
	Verbose bool
	// ExtraCmdline is appended to the kernel command line.
	ExtraCmdline []string
	// ExtraArgs is appended to QEMU's arguments.
	ExtraArgs []string
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL
	// (default 5 s).
	StopGrace time.Duration
}

// Net is the guest's network interface. The host decides the addressing:
// the guest's /init applies it from the kernel command line.
type Net struct {
	// Tap is the host's tap device (it must exist; see CreateTap).
	Tap string
	// MAC is the guest interface's address (default 52:54:00:ca:4b:01).
	MAC net.HardwareAddr
	// Addr is the guest's IPv4 address with its prefix (carbd.ip).
	Addr netip.Prefix
	// Gateway is the guest's default route (carbd.gw), usually the tap's
	// address on the host; invalid means none.
	Gateway netip.Addr
	// DNS is the guest's name server (carbd.dns); invalid means none.
	DNS netip.Addr
	// Addr6 and Gateway6 are the guest's IPv6 address with its prefix
	// and default route (carbd.ip6, carbd.gw6); invalid means none, and
	// the guest keeps IPv6 off.
	Addr6    netip.Prefix
	Gateway6 netip.Addr
}

// FS is a vhost-user-fs export.
type FS struct {
	// Socket is virtiofsd's vhost-user socket.
	Socket string
	// Tag is the virtio-fs tag (default "work").
	Tag string
	// MountPoint is where the guest mounts it and runs the agent
	// (default /work).
	MountPoint string
}

// DefaultMAC is the guest's MAC address when Net.MAC is empty.
var DefaultMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0xca, 0x4b, 0x01}

// withDefaults returns a copy of c with the defaults filled in.
func (c Config) withDefaults() Config {
	if c.Binary == "" {
		c.Binary = DefaultBinary
	}
	if c.Machine == "" {
		c.Machine = Q35
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 512
	}
	if c.StopGrace == 0 {
		c.StopGrace = 5 * time.Second
	}
	if c.Net != nil {
		n := *c.Net
		if len(n.MAC) == 0 {
			n.MAC = DefaultMAC
		}
		c.Net = &n
	}
	if c.FS != nil {
		f := *c.FS
		if f.Tag == "" {
			f.Tag = "work"
		}
		if f.MountPoint == "" {
			f.MountPoint = "/work"
		}
		c.FS = &f
	}
	return c
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch c.Machine {
	case Q35, MicroVM:
	default:
		return fmt.Errorf("qemu: config: machine %q (want q35 or microvm)", c.Machine)
	}
	switch c.Accel {
	case KVM, TCG:
	case "":
		return fmt.Errorf("qemu: config: accel not set (kvm or tcg; Start probes when empty)")
	default:
		return fmt.Errorf("qemu: config: accel %q (want kvm or tcg)", c.Accel)
	}
	if c.CPUs < 1 || c.CPUs > 64 {
		return fmt.Errorf("qemu: config: cpus %d (want 1 to 64)", c.CPUs)
	}
	if c.MemoryMiB < 64 {
		return fmt.Errorf("qemu: config: memory %d MiB (want at least 64)", c.MemoryMiB)
	}
	for name, p := range map[string]string{"kernel": c.Kernel, "initrd": c.Initrd, "control socket": c.CtrlSocket, "console log": c.ConsoleLog} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("qemu: config: %s %q is not an absolute path", name, p)
		}
	}
	if c.QMPSocket != "" && !filepath.IsAbs(c.QMPSocket) {
		return fmt.Errorf("qemu: config: qmp socket %q is not an absolute path", c.QMPSocket)
	}
	for name, p := range map[string]string{"control socket": c.CtrlSocket, "console log": c.ConsoleLog, "qmp socket": c.QMPSocket} {
		if strings.ContainsAny(p, ",=") {
			return fmt.Errorf("qemu: config: %s %q contains ',' or '=' (QEMU option syntax)", name, p)
		}
	}
	if n := c.Net; n != nil {
		if n.Tap == "" || len(n.Tap) > 15 || strings.ContainsAny(n.Tap, ",=/ ") {
			return fmt.Errorf("qemu: config: tap name %q", n.Tap)
		}
		if len(n.MAC) != 6 {
			return fmt.Errorf("qemu: config: mac %v is not 6 bytes", n.MAC)
		}
		if n.MAC[0]&1 != 0 {
			return fmt.Errorf("qemu: config: mac %v is a multicast address", n.MAC)
		}
		if !n.Addr.IsValid() || !n.Addr.Addr().Is4() {
			return fmt.Errorf("qemu: config: guest address %v is not an IPv4 prefix", n.Addr)
		}
		if n.Gateway.IsValid() && !n.Gateway.Is4() {
			return fmt.Errorf("qemu: config: gateway %v is not IPv4", n.Gateway)
		}
		if n.Addr6.IsValid() && (!n.Addr6.Addr().Is6() || n.Addr6.Addr().Is4In6()) {
			return fmt.Errorf("qemu: config: guest address %v is not an IPv6 prefix", n.Addr6)
		}
		if n.Gateway6.IsValid() && (!n.Gateway6.Is6() || n.Gateway6.Is4In6() || !n.Addr6.IsValid()) {
			return fmt.Errorf("qemu: config: IPv6 gateway %v is not IPv6 or comes without a guest IPv6 address", n.Gateway6)
		}
	}
	if f := c.FS; f != nil {
		if !filepath.IsAbs(f.Socket) || strings.ContainsAny(f.Socket, ",=") {
			return fmt.Errorf("qemu: config: virtiofsd socket %q is not an absolute path without ',' or '='", f.Socket)
		}
		if strings.ContainsAny(f.Tag, ",= ") || len(f.Tag) > 36 {
			return fmt.Errorf("qemu: config: fs tag %q", f.Tag)
		}
		if !filepath.IsAbs(f.MountPoint) || strings.ContainsAny(f.MountPoint, " ") {
			return fmt.Errorf("qemu: config: fs mount point %q", f.MountPoint)
		}
	}
	for _, p := range c.ExtraCmdline {
		if p == "" || strings.ContainsAny(p, " \t\n") {
			return fmt.Errorf("qemu: config: kernel parameter %q", p)
		}
	}
	return nil
}

// Cmdline returns the kernel command line: the console, then the carbd.*
// parameters the image's /init reads (see vmimage/scripts/init).
func (c Config) Cmdline() []string {
	c = c.withDefaults()
	p := []string{"console=ttyS0", "panic=-1"}
	if !c.Verbose {
		p = append(p, "quiet")
	}
	if n := c.Net; n != nil {
		p = append(p, "carbd.ip="+n.Addr.String())
		if n.Gateway.IsValid() {
			p = append(p, "carbd.gw="+n.Gateway.String())
		}
		if n.DNS.IsValid() {
			p = append(p, "carbd.dns="+n.DNS.String())
		}
		if n.Addr6.IsValid() {
			p = append(p, "carbd.ip6="+n.Addr6.String())
		}
		if n.Gateway6.IsValid() {
			p = append(p, "carbd.gw6="+n.Gateway6.String())
		}
	}
	if f := c.FS; f != nil {
		p = append(p, "carbd.fs="+f.Tag, "carbd.fsdir="+f.MountPoint)
	}
	p = append(p, "carbd.ctrl="+CtrlPortName)
	return append(p, c.ExtraCmdline...)
}

// Args returns QEMU's arguments (without the binary) for c. It is pure:
// the same Config gives the same arguments.
func (c Config) Args() ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	// The device models differ by bus: PCI on q35, virtio-mmio on microvm.
	dev := func(pci, mmio string) string {
		if c.Machine == MicroVM {
			return mmio
		}
		return pci
	}
	mem := strconv.Itoa(c.MemoryMiB) + "M"
	machine := string(c.Machine) + ",accel=" + string(c.Accel)
	if c.Machine == MicroVM {
		machine += ",memory-backend=mem" // microvm has no NUMA
	}
	a := []string{"-nodefaults", "-no-user-config", "-nographic", "-machine", machine}
	if c.Accel == KVM {
		a = append(a, "-cpu", "host")
	}
	a = append(a,
		"-smp", strconv.Itoa(c.CPUs),
		"-m", mem,
		// vhost-user-fs needs the guest memory shared with virtiofsd.
		"-object", "memory-backend-memfd,id=mem,size="+mem+",share=on",
	)
	if c.Machine != MicroVM {
		a = append(a, "-numa", "node,memdev=mem")
	}
	a = append(a,
		"-kernel", c.Kernel,
		"-initrd", c.Initrd,
		"-append", strings.Join(c.Cmdline(), " "),
		"-serial", "file:"+c.ConsoleLog,
		"-monitor", "none",
		"-no-reboot",
	)
	if f := c.FS; f != nil {
		a = append(a,
			"-chardev", "socket,id=vfs,path="+f.Socket,
			"-device", dev("vhost-user-fs-pci", "vhost-user-fs-device")+",chardev=vfs,tag="+f.Tag,
		)
	}
	if n := c.Net; n != nil {
		a = append(a,
			"-netdev", "tap,id=n0,ifname="+n.Tap+",script=no,downscript=no",
			// romfile= (PCI only): no iPXE option ROM, the kernel boots directly.
			"-device", dev("virtio-net-pci,romfile=", "virtio-net-device")+",netdev=n0,mac="+n.MAC.String(),
		)
	}
	a = append(a,
		"-device", dev("virtio-serial-pci", "virtio-serial-device"),
		"-chardev", "socket,id=ctl,path="+c.CtrlSocket+",server=on,wait=off",
		"-device", "virtserialport,chardev=ctl,name="+CtrlPortName,
	)
	if c.QMPSocket != "" {
		a = append(a, "-qmp", "unix:"+c.QMPSocket+",server=on,wait=off")
	}
	return append(a, c.ExtraArgs...), nil
}
