package qemu

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func fullConfig() Config {
	return Config{
		Accel:      TCG,
		Kernel:     "/img/vmlinuz",
		Initrd:     "/img/initramfs.cpio.gz",
		CtrlSocket: "/run/carbd/vm1/ctl.sock",
		ConsoleLog: "/var/log/carbd/vm1.console",
		Net: &Net{
			Tap:     "cbtap0",
			MAC:     net.HardwareAddr{0x52, 0x54, 0x00, 0x01, 0x02, 0x03},
			Addr:    netip.MustParsePrefix("10.77.0.2/30"),
			Gateway: netip.MustParseAddr("10.77.0.1"),
			DNS:     netip.MustParseAddr("10.77.0.1"),
		},
		FS: &FS{Socket: "/run/carbd/vm1/vfs.sock"},
	}
}

func TestArgsGoldenQ35TCG(t *testing.T) {
	got, err := fullConfig().Args()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-nodefaults", "-no-user-config", "-nographic",
		"-machine", "q35,accel=tcg",
		"-smp", "1",
		"-m", "512M",
		"-object", "memory-backend-memfd,id=mem,size=512M,share=on",
		"-numa", "node,memdev=mem",
		"-kernel", "/img/vmlinuz",
		"-initrd", "/img/initramfs.cpio.gz",
		"-append", "console=ttyS0 panic=-1 quiet carbd.ip=10.77.0.2/30 carbd.gw=10.77.0.1 carbd.dns=10.77.0.1 carbd.fs=work carbd.fsdir=/work carbd.ctrl=carbd.ctrl",
		"-serial", "file:/var/log/carbd/vm1.console",
		"-monitor", "none",
		"-no-reboot",
		"-chardev", "socket,id=vfs,path=/run/carbd/vm1/vfs.sock",
		"-device", "vhost-user-fs-pci,chardev=vfs,tag=work",
		"-netdev", "tap,id=n0,ifname=cbtap0,script=no,downscript=no",
		"-device", "virtio-net-pci,romfile=,netdev=n0,mac=52:54:00:01:02:03",
		"-device", "virtio-serial-pci",
		"-chardev", "socket,id=ctl,path=/run/carbd/vm1/ctl.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=ctl,name=carbd.ctrl",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}
}

func TestArgsGoldenMicroVMKVM(t *testing.T) {
	c := Config{
		Machine:      MicroVM,
		Accel:        KVM,
		CPUs:         2,
		MemoryMiB:    1024,
		Kernel:       "/k",
		Initrd:       "/i",
		CtrlSocket:   "/c.sock",
		ConsoleLog:   "/c.log",
		Verbose:      true,
		FS:           &FS{Socket: "/v.sock", Tag: "src", MountPoint: "/home/agent/src"},
		Net:          &Net{Tap: "t0", Addr: netip.MustParsePrefix("192.168.7.2/24")},
		ExtraCmdline: []string{"carbd.ipv6=on"},
		ExtraArgs:    []string{"-d", "guest_errors"},
	}
	got, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-nodefaults", "-no-user-config", "-nographic",
		"-machine", "microvm,accel=kvm,memory-backend=mem",
		"-cpu", "host",
		"-smp", "2",
		"-m", "1024M",
		"-object", "memory-backend-memfd,id=mem,size=1024M,share=on",
		"-kernel", "/k",
		"-initrd", "/i",
		"-append", "console=ttyS0 panic=-1 carbd.ip=192.168.7.2/24 carbd.fs=src carbd.fsdir=/home/agent/src carbd.ctrl=carbd.ctrl carbd.ipv6=on",
		"-serial", "file:/c.log",
		"-monitor", "none",
		"-no-reboot",
		"-chardev", "socket,id=vfs,path=/v.sock",
		"-device", "vhost-user-fs-device,chardev=vfs,tag=src",
		"-netdev", "tap,id=n0,ifname=t0,script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0,mac=52:54:00:ca:4b:01",
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=ctl,path=/c.sock,server=on,wait=off",
		"-device", "virtserialport,chardev=ctl,name=carbd.ctrl",
		"-d", "guest_errors",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}
}

func TestArgsQMP(t *testing.T) {
	c := fullConfig()
	c.QMPSocket = "/run/carbd/vm1/qmp.sock"
	got, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	base, _ := fullConfig().Args()
	want := append(base, "-qmp", "unix:/run/carbd/vm1/qmp.sock,server=on,wait=off")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}
}

func TestArgsMinimal(t *testing.T) {
	// No network, no file system: only the control port.
	got, err := Config{Accel: TCG, Kernel: "/k", Initrd: "/i", CtrlSocket: "/c", ConsoleLog: "/l"}.Args()
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Join(got, " ")
	for _, absent := range []string{"-netdev", "vhost-user-fs", "carbd.ip", "carbd.fs"} {
		if strings.Contains(s, absent) {
			t.Errorf("%q in %s", absent, s)
		}
	}
	if !strings.Contains(s, "virtserialport,chardev=ctl,name=carbd.ctrl") {
		t.Errorf("no control port in %s", s)
	}
}

func TestValidateRejects(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"no accel":         func(c *Config) { c.Accel = "" },
		"bad accel":        func(c *Config) { c.Accel = "hvf" },
		"bad machine":      func(c *Config) { c.Machine = "pc" },
		"relative kernel":  func(c *Config) { c.Kernel = "vmlinuz" },
		"no initrd":        func(c *Config) { c.Initrd = "" },
		"no ctrl socket":   func(c *Config) { c.CtrlSocket = "" },
		"comma in socket":  func(c *Config) { c.CtrlSocket = "/a,b" },
		"no console log":   func(c *Config) { c.ConsoleLog = "" },
		"cpus":             func(c *Config) { c.CPUs = -1 },
		"memory":           func(c *Config) { c.MemoryMiB = 16 },
		"tap name":         func(c *Config) { c.Net.Tap = "a,b" },
		"long tap name":    func(c *Config) { c.Net.Tap = "abcdefghijklmnop" },
		"multicast mac":    func(c *Config) { c.Net.MAC = net.HardwareAddr{1, 0, 0, 0, 0, 1} },
		"short mac":        func(c *Config) { c.Net.MAC = net.HardwareAddr{1, 2} },
		"ipv6 guest":       func(c *Config) { c.Net.Addr = netip.MustParsePrefix("fd00::2/64") },
		"no guest address": func(c *Config) { c.Net.Addr = netip.Prefix{} },
		"ipv6 gateway":     func(c *Config) { c.Net.Gateway = netip.MustParseAddr("fd00::1") },
		"ipv4 as ip6":      func(c *Config) { c.Net.Addr6 = netip.MustParsePrefix("10.0.0.2/30") },
		"gw6 without ip6":  func(c *Config) { c.Net.Gateway6 = netip.MustParseAddr("fd00::1") },
		"ipv4 gw6": func(c *Config) {
			c.Net.Addr6, c.Net.Gateway6 = netip.MustParsePrefix("fd00::2/64"), netip.MustParseAddr("10.0.0.1")
		},
		"relative vfs sock": func(c *Config) { c.FS.Socket = "vfs.sock" },
		"tag with space":    func(c *Config) { c.FS.Tag = "a b" },
		"relative mount":    func(c *Config) { c.FS.MountPoint = "work" },
		"kernel param":      func(c *Config) { c.ExtraCmdline = []string{"a b"} },
		"relative qmp":      func(c *Config) { c.QMPSocket = "qmp.sock" },
		"comma in qmp":      func(c *Config) { c.QMPSocket = "/q,s" },
	} {
		c := fullConfig()
		n, f := *c.Net, *c.FS
		c.Net, c.FS = &n, &f
		mut(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !strings.HasPrefix(err.Error(), "qemu: config: ") {
			t.Errorf("%s: error %q lacks the prefix", name, err)
		}
		if _, err := c.Args(); err == nil {
			t.Errorf("%s: Args accepted", name)
		}
	}
}

// TestCmdlineIPv6: the guest's IPv6 address and route go to /init as
// carbd.ip6 and carbd.gw6, after the IPv4 parameters.
func TestCmdlineIPv6(t *testing.T) {
	c := fullConfig()
	n := *c.Net
	n.Addr6, n.Gateway6 = netip.MustParsePrefix("fd00:cb:0:7::2/64"), netip.MustParseAddr("fd00:cb:0:7::1")
	c.Net = &n
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.Cmdline(), " ")
	if !strings.Contains(got, " carbd.ip6=fd00:cb:0:7::2/64 carbd.gw6=fd00:cb:0:7::1 ") {
		t.Errorf("cmdline %q lacks carbd.ip6 and carbd.gw6", got)
	}
}
