package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// initArg0 is argv[0] of the re-executed binary that becomes the
// sandbox's PID 1. Programs using this package call Init first in main
// (and in TestMain).
const initArg0 = "carbd-sandbox-init"

// Bind is an extra bind mount into the sandbox.
type Bind struct {
	Source, Target string
	Writable       bool
}

// Config describes one sandbox.
type Config struct {
	Plan Plan
	// Workdir is W's path: the staging merged view Merged appears there,
	// writable. Merged is the host path of the merged view; empty binds
	// Workdir itself (tests without staging).
	Workdir string
	Merged  string
	// Argv is the command to run inside; Env its environment.
	Argv []string
	Env  []string
	// UID and GID are the unprivileged host ids the sandbox's root maps
	// to; files it creates in the working directory belong to them.
	UID, GID int
	Hostname string
	// DNS is the resolver the sandbox uses (carbd's, on the host side).
	DNS   []netip.Addr
	Binds []Bind
	// Hide lists host directories the sandbox must not see at all
	// (carbd's state of the working directory, its staging layers): each
	// is covered by an empty, read-only directory. Missing ones are
	// skipped. A hidden directory must not contain Workdir or a bind.
	Hide []string
	// Cgroup, when set, is a cgroup v2 directory the sandbox is placed
	// in before its command starts (for tracing by cgroup).
	Cgroup string
	// CgroupFunc, when set, gives Cgroup late: Start calls it once the
	// sandbox's init is ready, just before moving it, so that whatever
	// makes the cgroup (a file tracer loading) runs meanwhile.
	CgroupFunc func() string
	// BeforeUp runs after the veth pair exists and before its host side
	// comes up: carbd attaches its TC program and queue rules there, so
	// the interface never carries unmediated traffic.
	BeforeUp func(host netlink.Link) error
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
}

// initConfig is what the parent hands the sandbox's init on fd 3.
type initConfig struct {
	Workdir  string   `json:"workdir"`
	Merged   string   `json:"merged"`
	Argv     []string `json:"argv"`
	Env      []string `json:"env"`
	Hostname string   `json:"hostname"`
	DNS      []string `json:"dns"`
	Binds    []Bind   `json:"binds"`
	Hide     []string `json:"hide"`
}

// Sandbox is a running sandbox.
type Sandbox struct {
	cfg  Config
	cmd  *exec.Cmd
	host netlink.Link
}

// Start creates the namespaces, the veth pair and the mounts, and starts
// the command. On error everything created so far is removed.
func Start(cfg Config) (_ *Sandbox, err error) {
	if len(cfg.Argv) == 0 {
		return nil, errors.New("netns: no command")
	}
	if cfg.UID <= 0 || cfg.GID <= 0 {
		return nil, fmt.Errorf("netns: the sandbox's root must map to an unprivileged host user, not uid %d gid %d", cfg.UID, cfg.GID)
	}
	if cfg.Workdir == "" || !filepath.IsAbs(cfg.Workdir) {
		return nil, fmt.Errorf("netns: working directory %q must be an absolute path", cfg.Workdir)
	}
	// Re-execute this very binary through the magic link: the sandbox's
	// unprivileged user may not be able to reach its path.
	const self = "/proc/self/exe"
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer cfgR.Close()
	defer cfgW.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer goR.Close()
	defer goW.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	defer readyW.Close()

	cmd := &exec.Cmd{Path: self, Args: []string{initArg0}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Stdin: cfg.Stdin, Stdout: cfg.Stdout, Stderr: cfg.Stderr, ExtraFiles: []*os.File{cfgR, goR, readyW}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: cfg.UID, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: cfg.GID, Size: 1}},
		GidMappingsEnableSetgroups: false,
		// Become the namespace's root (host uid cfg.UID): a process
		// keeping host uid 0 would be unmapped, hence powerless, inside.
		Credential: &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("netns: start sandbox init: %w", err)
	}
	s := &Sandbox{cfg: cfg, cmd: cmd}
	defer func() {
		if err != nil {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
			s.removeLink()
		}
	}()
	readyW.Close()
	if err := s.network(cmd.Process.Pid); err != nil {
		return nil, err
	}
	ic := initConfig{Workdir: cfg.Workdir, Merged: cfg.Merged, Argv: cfg.Argv, Env: cfg.Env, Hostname: cfg.Hostname, Binds: cfg.Binds, Hide: cfg.Hide}
	for _, a := range cfg.DNS {
		ic.DNS = append(ic.DNS, a.String())
	}
	if err := json.NewEncoder(cfgW).Encode(&ic); err != nil {
		return nil, fmt.Errorf("netns: hand the configuration to the sandbox: %w", err)
	}
	cfgW.Close()
	// The init sets up its mounts, says it is ready, and only then joins
	// the cgroup (so tracing sees the command, not carbd's own set-up)
	// and starts the command.
	var b [1]byte
	if _, err := io.ReadFull(readyR, b[:]); err != nil {
		return nil, errors.New("netns: the sandbox's init failed while setting up (see its error output)")
	}
	cgroup := cfg.Cgroup
	if cfg.CgroupFunc != nil {
		cgroup = cfg.CgroupFunc()
	}
	if cgroup != "" {
		if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			return nil, fmt.Errorf("netns: move sandbox into cgroup %s: %w", cgroup, err)
		}
	}
	if _, err := goW.Write([]byte{1}); err != nil {
		return nil, fmt.Errorf("netns: start the sandbox: %w", err)
	}
	return s, nil
}

// network creates the veth pair, its sandbox end (eth0) made in the
// sandbox's namespace, and configures both ends. Each step is a request
// under the kernel's one routing netlink lock (rtnl), which every
// sandbox starting or stopping on the host takes in turn: the pair is
// made with its peer in place and named (no move between namespaces,
// whose synchronize_net runs under that lock; no rename, no lookup of
// either end), so a start asks for it as few times as it can.
func (s *Sandbox) network(pid int) error {
	p := s.cfg.Plan
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.HostIf}, PeerName: "eth0", PeerNamespace: netlink.NsPid(pid)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("netns: create veth %s: %w", p.HostIf, err)
	}
	var host netlink.Link = veth // LinkAdd looked up its index
	if veth.Index == 0 {
		l, err := netlink.LinkByName(p.HostIf)
		if err != nil {
			return fmt.Errorf("netns: find %s: %w", p.HostIf, err)
		}
		host = l
	}
	s.host = host
	for _, a := range []netip.Prefix{p.HostAddr4, p.HostAddr6} {
		if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("netns: address %s on %s: %w", a, p.HostIf, err)
		}
	}
	if err := inNetNS(pid, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		g, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range []netip.Prefix{p.GuestAddr4, p.GuestAddr6} {
			if err := h.AddrAdd(g, &netlink.Addr{IPNet: prefixNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
				return fmt.Errorf("address %s: %w", a, err)
			}
		}
		if err := h.LinkSetUp(g); err != nil {
			return err
		}
		for _, gw := range []netip.Addr{p.HostAddr4.Addr(), p.HostAddr6.Addr()} {
			if err := h.RouteAdd(&netlink.Route{LinkIndex: g.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("netns: configure the sandbox's network: %w", err)
	}
	if s.cfg.BeforeUp != nil {
		if err := s.cfg.BeforeUp(host); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("netns: bring up %s: %w", p.HostIf, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func signalNotify(c chan os.Signal) {
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCHLD)
}

// inNetNS runs fn with a netlink handle in the network namespace of pid.
func inNetNS(pid int, fn func(*netlink.Handle) error) error {
	ns, err := vnetns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return fn(h)
}

// Pid is the host pid of the sandbox's init.
func (s *Sandbox) Pid() int { return s.cmd.Process.Pid }

// HostLink is the host side of the veth pair.
func (s *Sandbox) HostLink() netlink.Link { return s.host }

// Wait waits for the sandbox's command and returns its exit status.
func (s *Sandbox) Wait() (int, error) {
	err := s.cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			return 128 + int(st.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	if err != nil {
		return -1, err
	}
	return 0, nil
}

// Signal forwards a signal to the sandbox's init, which forwards it to
// the command.
func (s *Sandbox) Signal(sig os.Signal) error { return s.cmd.Process.Signal(sig) }

// Kill kills the whole sandbox: its init is PID 1 of its PID namespace, so
// every process in it dies with it.
func (s *Sandbox) Kill() error { return s.cmd.Process.Kill() }

// Close removes the veth pair (the namespaces go with their last process).
func (s *Sandbox) Close() error {
	s.removeLink()
	return nil
}

func (s *Sandbox) removeLink() {
	if l, err := netlink.LinkByName(s.cfg.Plan.HostIf); err == nil {
		_ = netlink.LinkDel(l)
	}
}

// Init turns the process into a sandbox's init when it was started as
// one, and never returns in that case. Call it first in main.
func Init() {
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	runtime.LockOSThread()
	code, err := sandboxInit()
	if err != nil {
		fmt.Fprintf(os.Stderr, "carbd sandbox: %v\n", err)
		os.Exit(125)
	}
	os.Exit(code)
}

func sandboxInit() (int, error) {
	cfgF, goF, readyF := os.NewFile(3, "config"), os.NewFile(4, "go"), os.NewFile(5, "ready")
	var ic initConfig
	if err := json.NewDecoder(cfgF).Decode(&ic); err != nil {
		return 0, fmt.Errorf("read configuration: %w", err)
	}
	cfgF.Close()
	if ic.Hostname != "" {
		if err := unix.Sethostname([]byte(ic.Hostname)); err != nil {
			return 0, fmt.Errorf("set hostname: %w", err)
		}
	}
	if err := setupMounts(&ic); err != nil {
		return 0, err
	}
	if err := os.Chdir(ic.Workdir); err != nil {
		return 0, fmt.Errorf("enter working directory: %w", err)
	}
	if _, err := readyF.Write([]byte{1}); err != nil {
		return 0, errors.New("the host went away")
	}
	readyF.Close()
	var b [1]byte
	if _, err := io.ReadFull(goF, b[:]); err != nil {
		return 0, errors.New("the host did not finish setting up the sandbox")
	}
	goF.Close()
	// Enter the working directory again now that the init is in the
	// traced cgroup: the tracer learns the working directory the command
	// inherits, so its relative paths resolve.
	if err := os.Chdir(ic.Workdir); err != nil {
		return 0, fmt.Errorf("enter working directory: %w", err)
	}
	return runAsInit(ic.Argv, ic.Env)
}

// setupMounts makes the host's filesystem read-only, gives the sandbox
// fresh scratch space, binds the working directory writable and points
// DNS at carbd's resolver.
func setupMounts(ic *initConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	// Everything inherited from the host becomes read-only.
	if err := unix.MountSetattr(-1, "/", unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("make the host filesystem read-only: %w", err)
	}
	// Hold the bind sources open: the scratch tmpfs mounts may cover
	// their host paths (a working directory under /tmp).
	src := ic.Merged
	if src == "" {
		src = ic.Workdir
	}
	workFd, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the working directory's view %s: %w", src, err)
	}
	defer unix.Close(workFd)
	bindFds := make([]int, len(ic.Binds))
	for i, bd := range ic.Binds {
		fd, err := unix.Open(bd.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open bind source %s: %w", bd.Source, err)
		}
		defer unix.Close(fd)
		bindFds[i] = fd
	}
	for _, d := range []string{"/tmp", "/var/tmp", "/run", "/dev/shm", "/root"} {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size=256m"); err != nil {
			return fmt.Errorf("scratch space at %s: %w", d, err)
		}
	}
	for _, d := range ic.Hide {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() {
			continue
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=000,size=4k"); err != nil {
			return fmt.Errorf("hide %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(ic.Workdir, 0o755); err != nil {
		return fmt.Errorf("working directory mount point: %w", err)
	}
	if err := bindRW(fdPath(workFd), ic.Workdir); err != nil {
		return fmt.Errorf("bind the working directory: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	// A sysfs of the sandbox's own network namespace, read-only.
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	for i, bd := range ic.Binds {
		if err := mountpoint(bd.Target, bindFds[i]); err != nil {
			return fmt.Errorf("bind %s: %w", bd.Target, err)
		}
		if bd.Writable {
			if err := bindRW(fdPath(bindFds[i]), bd.Target); err != nil {
				return fmt.Errorf("bind %s: %w", bd.Target, err)
			}
		} else if err := unix.Mount(fdPath(bindFds[i]), bd.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", bd.Target, err)
		}
	}
	if len(ic.DNS) > 0 {
		var sb strings.Builder
		for _, a := range ic.DNS {
			fmt.Fprintf(&sb, "nameserver %s\n", a)
		}
		if err := os.WriteFile("/run/resolv.conf", []byte(sb.String()), 0o644); err != nil {
			return err
		}
		if err := unix.Mount("/run/resolv.conf", "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind resolv.conf: %w", err)
		}
	}
	return nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// mountpoint makes sure target exists, as a directory or a file like
// the source open at fd, when it can be created (on scratch space).
func mountpoint(target string, fd int) error {
	if _, err := os.Lstat(target); err == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return os.MkdirAll(target, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	return os.WriteFile(target, nil, 0o644)
}

// bindRW bind-mounts src on dst and clears the read-only flag it may have
// inherited from the read-only host view.
func bindRW(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY})
}

// runAsInit runs the command as the child of PID 1, forwarding signals
// and reaping orphans, and returns its exit status.
func runAsInit(argv, env []string) (int, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 127, fmt.Errorf("command %q: %w", argv[0], err)
	}
	sigs := make(chan os.Signal, 8)
	signalNotify(sigs)
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return 126, err
	}
	pid := cmd.Process.Pid
	for {
		var ws unix.WaitStatus
		wpid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == nil && wpid == pid {
			if ws.Signaled() {
				return 128 + int(ws.Signal()), nil
			}
			return ws.ExitStatus(), nil
		}
		if err == nil && wpid > 0 {
			continue // an orphan was reaped
		}
		if s := <-sigs; s != syscall.SIGCHLD {
			_ = cmd.Process.Signal(s)
		}
	}
}
