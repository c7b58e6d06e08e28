package chv

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultBinary is the Cloud Hypervisor executable Start runs when
// Config.Binary is empty.
const DefaultBinary = "cloud-hypervisor"

// DefaultCtrlPort is the guest's AF_VSOCK port for the control channel.
const DefaultCtrlPort = 1024

// Config describes one Cloud Hypervisor VM booted from the command line
// (direct kernel boot); Args turns it into that command line.
type Config struct {
	// Binary is the cloud-hypervisor executable (default DefaultBinary).
	Binary string
	// APISocket is the REST API's Unix socket (--api-socket path=).
	// Required.
	APISocket string
	// Kernel is a vmlinux ELF with a PVH entry point (the image build
	// writes vmimage/out/vmlinux): Cloud Hypervisor does not boot a
	// bzImage. Initramfs is the image's initramfs.
	Kernel, Initramfs string
	// CPUs is the number of boot vCPUs (default 1).
	CPUs int
	// MemoryMiB is the guest memory (default 512); it is always shared
	// (shared=on), which --fs needs.
	MemoryMiB int
	// Net attaches the guest to a tap device.
	Net *Net
	// FS exports a directory through virtiofsd's vhost-user socket.
	FS *FS
	// Vsock is the virtio-vsock device that carries the control channel.
	// Required.
	Vsock Vsock
	// SerialLog receives the guest's serial console (--serial file=);
	// the virtio console is off. Required.
	SerialLog string
	// Verbose drops "quiet" from the kernel command line.
	Verbose bool
	// ExtraCmdline is appended to the kernel command line.
	ExtraCmdline []string
	// ExtraArgs is appended to the arguments.
	ExtraArgs []string
	// StopGrace is how long Stop waits for the VMM to exit after each
	// step (vmm.shutdown, SIGTERM) before the next (default 5 s).
	StopGrace time.Duration
}

// Net is the guest's network interface on a tap device.
type Net struct {
	// Tap is the tap device's name (--net tap=). carbd creates it
	// beforehand, with its host address and its hooks, so Cloud
	// Hypervisor opens it by name. No ip=/mask= is given: from v37 Cloud
	// Hypervisor leaves an existing tap's address alone (open_tap in
	// net_util/src/open_tap.rs: "Tap ... already exists. IP
	// configuration will not be overwritten."), so they would do
	// nothing; up to v36 it set them even on an existing tap (a default
	// 192.168.249.1/24 without ip=), which is why carbd needs v37 or
	// later.
	Tap string
	// MAC is the guest's MAC address (default 52:54:00:ca:4b:01).
	MAC net.HardwareAddr
	// Addr, Gateway and DNS are the guest's addressing, given to the
	// image's /init on the kernel command line (carbd.ip, carbd.gw,
	// carbd.dns).
	Addr    netip.Prefix
	Gateway netip.Addr
	DNS     netip.Addr
	// Addr6 and Gateway6 are the guest's IPv6 address with its prefix
	// and default route (carbd.ip6, carbd.gw6); invalid means none, and
	// the guest keeps IPv6 off.
	Addr6    netip.Prefix
	Gateway6 netip.Addr
}

// FS is a virtio-fs export (--fs tag=,socket=).
type FS struct {
	Socket     string // virtiofsd's vhost-user socket
	Tag        string // default "work"
	MountPoint string // where the guest mounts it (default /work)
}

// Vsock is the virtio-vsock device (--vsock cid=,socket=): Socket is the
// host end of the hybrid vsock (see DialVsock); Port is the guest port
// the control helper listens on (default DefaultCtrlPort).
type Vsock struct {
	CID    uint32 // guest context id, at least 3
	Socket string
	Port   uint32
}

// DefaultMAC is the guest's MAC address when Net.MAC is empty.
var DefaultMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0xca, 0x4b, 0x01}

func (c Config) withDefaults() Config {
	if c.Binary == "" {
		c.Binary = DefaultBinary
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
	if c.Vsock.Port == 0 {
		c.Vsock.Port = DefaultCtrlPort
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

// optPath checks a path that goes into a key=value option list.
func optPath(what, p string) error {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, ", =\n") {
		return fmt.Errorf("chv: config: %s %q is not an absolute path without ',', '=' or spaces", what, p)
	}
	return nil
}

// Validate checks the configuration after defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	for what, p := range map[string]string{"api socket": c.APISocket, "vsock socket": c.Vsock.Socket, "serial log": c.SerialLog} {
		if err := optPath(what, p); err != nil {
			return err
		}
	}
	for what, p := range map[string]string{"kernel": c.Kernel, "initramfs": c.Initramfs} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("chv: config: %s %q is not an absolute path", what, p)
		}
	}
	if c.CPUs < 1 || c.CPUs > 254 {
		return fmt.Errorf("chv: config: cpus %d (want 1 to 254)", c.CPUs)
	}
	if c.MemoryMiB < 64 {
		return fmt.Errorf("chv: config: memory %d MiB (want at least 64)", c.MemoryMiB)
	}
	if c.Vsock.CID < 3 || c.Vsock.CID == 0xffffffff {
		return fmt.Errorf("chv: config: vsock cid %d (0-2 are reserved)", c.Vsock.CID)
	}
	if n := c.Net; n != nil {
		if n.Tap == "" || len(n.Tap) > 15 || strings.ContainsAny(n.Tap, ",=/ ") {
			return fmt.Errorf("chv: config: tap name %q", n.Tap)
		}
		if len(n.MAC) != 6 || n.MAC[0]&1 != 0 {
			return fmt.Errorf("chv: config: mac %v is not a unicast MAC address", n.MAC)
		}
		if !n.Addr.IsValid() || !n.Addr.Addr().Is4() {
			return fmt.Errorf("chv: config: guest address %v is not an IPv4 prefix", n.Addr)
		}
		if n.Gateway.IsValid() && !n.Gateway.Is4() {
			return fmt.Errorf("chv: config: gateway %v is not IPv4", n.Gateway)
		}
		if n.Addr6.IsValid() && (!n.Addr6.Addr().Is6() || n.Addr6.Addr().Is4In6()) {
			return fmt.Errorf("chv: config: guest address %v is not an IPv6 prefix", n.Addr6)
		}
		if n.Gateway6.IsValid() && (!n.Gateway6.Is6() || n.Gateway6.Is4In6() || !n.Addr6.IsValid()) {
			return fmt.Errorf("chv: config: IPv6 gateway %v is not IPv6 or comes without a guest IPv6 address", n.Gateway6)
		}
	}
	if f := c.FS; f != nil {
		if err := optPath("virtiofsd socket", f.Socket); err != nil {
			return err
		}
		if f.Tag == "" || strings.ContainsAny(f.Tag, ",= ") || len(f.Tag) > 36 {
			return fmt.Errorf("chv: config: fs tag %q", f.Tag)
		}
		if !filepath.IsAbs(f.MountPoint) || strings.ContainsAny(f.MountPoint, " ") {
			return fmt.Errorf("chv: config: fs mount point %q", f.MountPoint)
		}
	}
	for _, p := range c.ExtraCmdline {
		if p == "" || strings.ContainsAny(p, " \t\n") {
			return fmt.Errorf("chv: config: kernel parameter %q", p)
		}
	}
	return nil
}

// Cmdline returns the kernel command line: the serial console, then the
// carbd.* parameters of the image's /init, with the control channel on
// AF_VSOCK (carbd.vsock).
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
	p = append(p, "carbd.vsock="+strconv.FormatUint(uint64(c.Vsock.Port), 10))
	return append(p, c.ExtraCmdline...)
}

// Args returns cloud-hypervisor's arguments (without the binary), in the
// option syntax of its documentation (docs/api.md, fs.md, vsock.md and
// `cloud-hypervisor --help`). It is pure.
func (c Config) Args() ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	a := []string{
		"--api-socket", "path=" + c.APISocket,
		"--kernel", c.Kernel,
		"--initramfs", c.Initramfs,
		"--cmdline", strings.Join(c.Cmdline(), " "),
		"--cpus", "boot=" + strconv.Itoa(c.CPUs),
		// --fs needs the guest memory shared with virtiofsd (fs.md).
		"--memory", "size=" + strconv.Itoa(c.MemoryMiB) + "M,shared=on",
	}
	if n := c.Net; n != nil {
		a = append(a, "--net", "tap="+n.Tap+",mac="+n.MAC.String())
	}
	if f := c.FS; f != nil {
		a = append(a, "--fs", "tag="+f.Tag+",socket="+f.Socket)
	}
	a = append(a,
		"--vsock", "cid="+strconv.FormatUint(uint64(c.Vsock.CID), 10)+",socket="+c.Vsock.Socket,
		"--serial", "file="+c.SerialLog,
		"--console", "off",
		// The events (Start reads them from a pipe): a guest reset or
		// panic ends the VM (see Event.GuestEnded).
		"--event-monitor", "fd="+strconv.Itoa(EventMonitorFD),
		// A panicking guest with a pvpanic driver says so ("guest panic")
		// before panic=-1 resets it.
		"--pvpanic",
	)
	return append(a, c.ExtraArgs...), nil
}
