package daemon

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/qemu"
	"github.com/carbd/carbd/vmimage"
)

// VMConfig configures the VM backends (qemu, cloud-hypervisor). The zero
// value works on a host with the tools installed and the image built.
type VMConfig struct {
	// Image is the guest image's directory (the build's output,
	// vmimage/out: vmlinuz, vmlinux, initramfs.cpio.gz). Empty: the
	// CARBD_VMIMAGE environment variable, else ./vmimage/out, else
	// /usr/lib/carbd/vmimage.
	Image string
	// Binary is the hypervisor (default qemu-system-x86_64 or
	// cloud-hypervisor, looked up in PATH).
	Binary string
	// Virtiofsd is the virtiofsd executable (default
	// /usr/lib/qemu/virtiofsd).
	Virtiofsd string
	// CPUs and MemoryMiB size the guest (default 1 and 512).
	CPUs, MemoryMiB int
	// Accel is QEMU's accelerator, "kvm" or "tcg"; empty probes (KVM
	// only where a stock guest really runs under it).
	Accel string
	// CA is a PEM certificate the guest trusts besides carbd's
	// interception CA (which it trusts whenever interception is on): it
	// goes into the image's CA slot, and into the bundle, through a
	// per-boot initramfs overlay.
	CA []byte
	// BootTimeout bounds launch to the guest's hello (default 5 min: TCG
	// boots slowly on a loaded host).
	BootTimeout time.Duration
	// ShutdownGrace is how long the guest has to power off after its
	// result or a clean stop before the VM is stopped (default 30 s).
	ShutdownGrace time.Duration
	// Verbose keeps every kernel message in the console log.
	Verbose bool
}

// The backend names.
const (
	BackendNetns = "netns"
	BackendQEMU  = "qemu"
	BackendCHV   = "cloud-hypervisor"
)

// EnvVMImage names the guest image's directory when VMConfig.Image is
// empty.
const EnvVMImage = "CARBD_VMIMAGE"

// DefaultVMImage is where a packaged carbd installs the guest image.
const DefaultVMImage = "/usr/lib/carbd/vmimage"

// vmFSTag is the virtio-fs tag of the working directory's export.
const vmFSTag = "work"

func init() {
	backends[BackendQEMU] = func(ctx, lctx context.Context, nc *netChannel, tcfg tcx.Config) error {
		return startVM(ctx, lctx, nc, tcfg, qemuLauncher{})
	}
	backends[BackendCHV] = func(ctx, lctx context.Context, nc *netChannel, tcfg tcx.Config) error {
		return startVM(ctx, lctx, nc, tcfg, chvLauncher{})
	}
}

// launcher starts one kind of hypervisor.
type launcher interface {
	// check reports what is missing on this host for the backend, each
	// with how to get it.
	check(cfg *VMConfig) []error
	// launch starts the VM from spec.
	launch(ctx context.Context, spec *vmSpec) (hypervisor, error)
}

// vmSpec is what every backend boots: the image, the tap, the export,
// the kernel parameters and where its files go.
type vmSpec struct {
	cfg     VMConfig
	image   vmimage.Image
	vmlinux string // ELF kernel (Cloud Hypervisor)
	initrd  string // the image's initramfs, or the per-boot one with the CA
	dir     string // sockets and the console log
	vfsSock string
	// The guest's network: the tap and the plan's addresses.
	tap     string
	nc      *netChannel
	workdir string // the mount point in the guest: W's own path
	console string // the guest's serial console log
}

// hypervisor is a running VM.
type hypervisor interface {
	// pid is the VMM's process id on the host.
	pid() int
	// connect returns the control channel once the guest can be reached
	// (QEMU: at once, its socket is connected before the guest boots;
	// Cloud Hypervisor: when the guest listens on its vsock port).
	connect(ctx context.Context) (*ctrl.Conn, error)
	// pause freezes the guest (its vCPUs and devices): QMP stop,
	// vm.pause.
	pause(ctx context.Context) error
	// stop ends the VM at once and returns when the VMM has exited.
	stop() error
	// done is closed when the VMM has exited; exitErr then says how.
	done() <-chan struct{}
	exitErr() error
	// diag returns what helps understand a failure: the VMM's output and
	// the guest console's tail.
	diag() string
}

// resolveVMConfig fills in the defaults.
func resolveVMConfig(c VMConfig) VMConfig {
	if c.Virtiofsd == "" {
		c.Virtiofsd = fileev.DefaultVirtiofsd
	}
	if c.CPUs == 0 {
		c.CPUs = 1
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 512
	}
	if c.BootTimeout == 0 {
		c.BootTimeout = 5 * time.Minute
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = 30 * time.Second
	}
	return c
}

// imageDir finds the guest image's directory.
func (c *VMConfig) imageDir() (string, error) {
	if c.Image != "" {
		return c.Image, nil
	}
	if env := os.Getenv(EnvVMImage); env != "" {
		return env, nil
	}
	tried := []string{}
	if wd, err := os.Getwd(); err == nil {
		p := filepath.Join(wd, "vmimage", "out")
		if _, err := os.Stat(filepath.Join(p, "initramfs.cpio.gz")); err == nil {
			return p, nil
		}
		tried = append(tried, p)
	}
	if _, err := os.Stat(filepath.Join(DefaultVMImage, "initramfs.cpio.gz")); err == nil {
		return DefaultVMImage, nil
	}
	tried = append(tried, DefaultVMImage)
	return "", fmt.Errorf("no guest image (looked in %s): build it with `make vmimage` in carbd's source tree (it writes vmimage/out) and point carbd at it (%s=DIR)",
		strings.Join(tried, ", "), EnvVMImage)
}

// checkCommon reports the tools every VM backend needs.
func checkCommon(cfg *VMConfig) []error {
	var errs []error
	if st, err := os.Stat(cfg.Virtiofsd); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		errs = append(errs, fmt.Errorf("virtiofsd is missing (%s): install it (Debian: apt-get install qemu-system-common; elsewhere the virtiofsd package) or set its path", cfg.Virtiofsd))
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		errs = append(errs, errors.New("/dev/net/tun is missing: the guest's tap device needs the tun module (modprobe tun)"))
	}
	return errs
}

// lookBinary finds a hypervisor executable.
func lookBinary(bin string) (string, error) {
	if strings.ContainsRune(bin, '/') {
		st, err := os.Stat(bin)
		if err != nil {
			return "", err
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%s is not an executable file", bin)
		}
		return bin, nil
	}
	return exec.LookPath(bin)
}

// startVM starts a VM backend: the tap with every hook attached before
// it comes up, tracing of the file daemon's cgroup, virtiofsd on the
// merged view in that cgroup, the per-boot initramfs, the VM, and the
// control session (hello, task, output, notices, result).
func startVM(ctx, lctx context.Context, nc *netChannel, tcfg tcx.Config, l launcher) (err error) {
	d := nc.d
	cfg := resolveVMConfig(d.cfg.VM)
	backend := d.cfg.Backend
	// What is missing, all at once, each with how to get it.
	errs := append(checkCommon(&cfg), l.check(&cfg)...)
	dir, ierr := cfg.imageDir()
	var img vmimage.Image
	if ierr != nil {
		errs = append(errs, ierr)
	} else if img, ierr = vmimage.Find(dir); ierr != nil {
		if errors.Is(ierr, vmimage.ErrNotBuilt) {
			ierr = fmt.Errorf("the guest image in %s is incomplete (%v): build it with `make vmimage`", dir, ierr)
		}
		errs = append(errs, ierr)
	}
	if err := checkPEMCerts(cfg.CA); err != nil {
		errs = append(errs, fmt.Errorf("the CA the guest is to trust (--vm-ca): %w", err))
	}
	if strings.ContainsAny(d.cfg.Workdir, " \t\n,=") {
		errs = append(errs, fmt.Errorf("the working directory %q is the guest's mount point and goes on the kernel command line: its path may not contain white space, ',' or '='", d.cfg.Workdir))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s backend: %w", backend, errors.Join(errs...))
	}

	spec := &vmSpec{cfg: cfg, image: img, vmlinux: filepath.Join(dir, "vmlinux"), nc: nc, tap: nc.plan.HostIf,
		workdir: d.cfg.Workdir, dir: filepath.Join(d.dir, "vm")}
	if err := os.RemoveAll(spec.dir); err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	if err := os.MkdirAll(spec.dir, 0o700); err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	spec.console = filepath.Join(spec.dir, "console.log")
	spec.vfsSock = filepath.Join(spec.dir, "vfs.sock")

	sb := &vmSandbox{d: d, backend: backend, cfg: cfg, log: d.log.With("backend", backend),
		notices: make(chan string, 256), done: make(chan struct{}),
		resultPath: filepath.Join(nc.agentDir, "result")}
	// Abort notices reach the agent over the control channel; set before
	// the verdict loop starts, which may notify.
	d.noticeHook = sb.notice

	// The interception of the guest's HTTPS (as for the namespace
	// backend): its CA, the guest's bundle and the proxy; the hooks below
	// bind its listener to the tap and redirect the guest's TCP 443 to it.
	if !d.cfg.Intercept.Off {
		ic, err := nc.startIntercept()
		if err != nil {
			return fmt.Errorf("%s backend: %w", backend, err)
		}
		nc.icpt = ic
		nc.closers = append(nc.closers, ic.close)
	}

	// The tap, down until the TC program, the queue rules, the verdict
	// loop, the resolver on the host address, the capture and
	// masquerading are on it.
	tap, err := qemu.CreateTapDown(spec.tap, nc.plan.HostAddr4, nc.plan.HostAddr6)
	if err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	nc.closers = append(nc.closers, tap.Delete)
	if err := nc.hooks(lctx, tcfg); err != nil {
		return err
	}
	if err := tap.Up(); err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}

	// The file daemon: traced from its first syscall (it starts in the
	// traced cgroup) and serving the merged view, which it pivots into.
	d.files.startTracing(ctx, "/")
	vcfg := fileev.VirtiofsdConfig{Binary: cfg.Virtiofsd, SocketPath: spec.vfsSock, Source: d.files.merged,
		Cgroup: d.files.cg, Log: &prefixWriter{log: sb.log, msg: "virtiofsd"}}
	vfs, err := fileev.StartVirtiofsd(lctx, vcfg)
	if err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	nc.closers = append(nc.closers, vfs.Stop)

	// The initramfs, with the CAs the guest trusts.
	spec.initrd = img.Initramfs
	files, err := guestTrust(nc.icpt, cfg.CA)
	if err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	if len(files) > 0 {
		spec.initrd = filepath.Join(spec.dir, "initrd.img")
		if err := vmimage.WithOverlay(spec.initrd, img.Initramfs, files); err != nil {
			return fmt.Errorf("%s backend: %w", backend, err)
		}
	}

	sb.launched = time.Now()
	hv, err := l.launch(ctx, spec)
	if err != nil {
		return fmt.Errorf("%s backend: %w", backend, err)
	}
	sctx, cancel := context.WithCancel(lctx)
	sb.hv, sb.cancel = hv, cancel
	d.sandbox = sb
	nc.closers = append(nc.closers, sb.close)
	go sb.session(sctx)
	return nil
}

// guestTrust returns the per-boot overlay's files that make the guest
// trust carbd's interception CA (ic, when intercepting) and extra, a PEM
// the operator gave (--vm-ca): the CA slot holds both, and with
// interception the whole bundle the netns backend binds (the host's
// roots and carbd's CA) plus extra goes to vmimage.BundlePath, which the
// guest's /init installs as its system bundle and points the clients'
// variables at.
func guestTrust(ic *interceptor, extra []byte) ([]vmimage.File, error) {
	pemCat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			if len(p) == 0 {
				continue
			}
			b = append(b, p...)
			if b[len(b)-1] != '\n' {
				b = append(b, '\n')
			}
		}
		return b
	}
	if ic == nil {
		if len(extra) == 0 {
			return nil, nil
		}
		return []vmimage.File{{Path: vmimage.CAPath, Data: extra}}, nil
	}
	bundle, err := os.ReadFile(ic.bundle)
	if err != nil {
		return nil, fmt.Errorf("the guest's CA bundle: %w", err)
	}
	return []vmimage.File{
		{Path: vmimage.CAPath, Data: pemCat(ic.ca.CertPEM, extra)},
		{Path: vmimage.BundlePath, Data: pemCat(bundle, extra)},
	}, nil
}

// checkPEMCerts reports whether b, when given, is one or more PEM
// certificates and nothing else: a block that does not parse makes
// OpenSSL refuse the whole bundle it is in (curl: "error setting
// certificate file"), so every HTTPS client in the guest would fail.
func checkPEMCerts(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	n := 0
	for rest := b; ; n++ {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			if n == 0 {
				return errors.New("no PEM certificate")
			}
			if len(bytes.TrimSpace(rest)) > 0 {
				return errors.New("not PEM certificates only: text that is not a PEM block")
			}
			return nil
		}
		if blk.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is a %s, not a CERTIFICATE", n+1, blk.Type)
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			return fmt.Errorf("certificate %d: %w", n+1, err)
		}
	}
}

// vmSandbox is a VM as the daemon's sandbox: the control session with
// the guest helper, and the VM's life.
type vmSandbox struct {
	d          *daemon
	backend    string
	cfg        VMConfig
	log        *slog.Logger
	hv         hypervisor
	launched   time.Time
	resultPath string
	notices    chan string // abort notices, sent once the task is
	cancel     context.CancelFunc

	done   chan struct{} // closed when the session is over
	status int           // set before done is closed
	err    error

	mu        sync.Mutex // guards the fields below
	conn      *ctrl.Conn
	taskSent  bool
	ended     bool // paused or stopped by the daemon
	endStatus int
}

// Exit statuses the daemon reports when the agent did not report one.
const (
	statusKilled     = 128 + int(syscall.SIGKILL) // stopped or paused (ledger stop)
	statusTerminated = 128 + int(syscall.SIGTERM) // stopped before the task started
	statusNotStarted = 127                        // the guest could not start the agent
)

// session runs the control session: hello, task, output, result.
func (s *vmSandbox) session(ctx context.Context) {
	status, err := s.converse(ctx)
	s.status, s.err = status, err
	close(s.done)
}

// endedBy reports whether the daemon ended the session, and with what
// status.
func (s *vmSandbox) endedBy() (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended, s.endStatus
}

func (s *vmSandbox) converse(ctx context.Context) (int, error) {
	bctx, cancel := context.WithTimeout(ctx, s.cfg.BootTimeout)
	defer cancel()
	conn, err := s.hv.connect(bctx)
	if err != nil {
		if ended, st := s.endedBy(); ended {
			return st, nil
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return -1, fmt.Errorf("%s: the guest did not open its control channel within %v: %w%s", s.backend, s.cfg.BootTimeout, err, s.hv.diag())
		}
		return -1, fmt.Errorf("%s: control channel: %w%s", s.backend, err, s.hv.diag())
	}
	s.mu.Lock()
	if s.ended {
		st := s.endStatus
		s.mu.Unlock()
		conn.Close()
		return st, nil
	}
	s.conn = conn
	s.mu.Unlock()

	// The hello, within the boot timeout: closing the stream ends the
	// wait.
	stopTimer := context.AfterFunc(bctx, func() { conn.Close() })
	hello, err := conn.RecvHello()
	stopTimer()
	if err != nil {
		if ended, st := s.endedBy(); ended {
			return st, nil
		}
		if bctx.Err() != nil {
			return -1, fmt.Errorf("%s: no hello from the guest within %v%s", s.backend, s.cfg.BootTimeout, s.hv.diag())
		}
		return -1, fmt.Errorf("%s: hello: %w%s", s.backend, err, s.hv.diag())
	}
	boot := time.Since(s.launched)
	s.log.Info("the guest is up", "boot", boot.Round(time.Millisecond))

	// The agent's environment (--env, --env-file) goes first, over the
	// control channel only: never on the kernel command line or in an
	// argv; the guest helper sets it in the agent's environment. A guest
	// too old for it would start the agent without its keys: refused.
	if env := s.d.cfg.Env; len(env) > 0 {
		if hello.Version < ctrl.EnvVersion {
			return -1, fmt.Errorf("%s: the guest image speaks control protocol %d, which cannot carry the agent's environment (--env): rebuild it (make vmimage)", s.backend, hello.Version)
		}
		if err := conn.Send(&ctrl.Env{Vars: env}); err != nil {
			if ended, st := s.endedBy(); ended {
				return st, nil
			}
			return -1, fmt.Errorf("%s: send the agent's environment: %w%s", s.backend, err, s.hv.diag())
		}
	}

	// The task: the principal's text (T_0) and the command carbd was
	// given, run by the guest helper in the working directory.
	task := &ctrl.Task{ID: s.d.cfg.ID, Text: s.d.cfg.Task, Argv: s.d.cfg.Argv}
	if err := conn.Send(task); err != nil {
		if ended, st := s.endedBy(); ended {
			return st, nil
		}
		return -1, fmt.Errorf("%s: send the task: %w%s", s.backend, err, s.hv.diag())
	}
	s.mu.Lock()
	s.taskSent = true
	s.mu.Unlock()
	go s.sendNotices(ctx, conn)

	for {
		m, err := conn.Recv()
		if err != nil {
			var le *ctrl.LineError
			if errors.As(err, &le) {
				s.log.Warn("control line refused", "err", err)
				continue
			}
			if ended, st := s.endedBy(); ended {
				return st, nil
			}
			return -1, fmt.Errorf("%s: the control channel ended before the agent's result (%v)%s", s.backend, err, s.hv.diag())
		}
		switch m := m.(type) {
		case *ctrl.Started:
			s.log.Debug("agent started in the guest", "pid", m.PID)
		case *ctrl.Output:
			w := s.d.cfg.Stdout
			if m.Stream == ctrl.Stderr {
				w = s.d.cfg.Stderr
			}
			if _, err := w.Write(m.Data); err != nil {
				s.log.Warn("relay the agent's output", "err", err)
			}
		case *ctrl.Result:
			return s.finish(conn, m), nil
		default:
			s.log.Warn("unexpected control message", "type", m.Type())
		}
	}
}

// finish takes the result to the principal (the agent's result file in
// the control directory, as in the namespace backend), lets the guest
// sync and power off, and returns the agent's status.
func (s *vmSandbox) finish(conn *ctrl.Conn, r *ctrl.Result) int {
	if err := os.WriteFile(s.resultPath, []byte(r.Text), 0o644); err != nil {
		s.log.Warn("result", "err", err)
	}
	status := r.Status
	if status < 0 {
		s.log.Warn("the guest could not start the agent", "reason", oneLine(r.Text, 200))
		status = statusNotStarted
	}
	// The guest syncs before it powers off: every write has then
	// reached virtiofsd, and the end-of-task commit point sees it.
	if err := conn.Send(&ctrl.Shutdown{}); err != nil {
		s.log.Warn("send shutdown", "err", err)
	}
	select {
	case <-s.hv.done():
	case <-time.After(s.cfg.ShutdownGrace):
		s.log.Warn("the guest did not power off: stopping the VM", "waited", s.cfg.ShutdownGrace)
		if err := s.hv.stop(); err != nil {
			s.log.Warn("stop the VM", "err", err)
		}
	}
	if err := s.hv.exitErr(); err != nil {
		s.log.Warn("the VMM exited with an error", "err", err)
	}
	return status
}

// notice queues an abort notice for the agent (the daemon's notify
// hook). It never blocks the verdict loop: past the queue's capacity a
// notice is only in the notices file.
func (s *vmSandbox) notice(text string) {
	if text == "" {
		return
	}
	select {
	case s.notices <- text:
	default:
		s.log.Warn("abort notice not delivered: the queue is full")
	}
}

// sendNotices forwards the queued notices once the task is sent.
func (s *vmSandbox) sendNotices(ctx context.Context, conn *ctrl.Conn) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case text := <-s.notices:
			if err := conn.Send(&ctrl.Notice{Text: text}); err != nil {
				s.log.Warn("abort notice", "err", err)
				return
			}
		}
	}
}

// end marks the session ended by the daemon with status, so the
// session returns it; it reports whether this call ended it.
func (s *vmSandbox) end(status int) (*ctrl.Conn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, false
	}
	s.ended, s.endStatus = true, status
	return s.conn, true
}

// Pid implements sandboxProc: the VMM's process.
func (s *vmSandbox) Pid() int { return s.hv.pid() }

// Wait implements sandboxProc: the agent's exit status from its result.
func (s *vmSandbox) Wait() (int, error) {
	<-s.done
	return s.status, s.err
}

// Signal implements sandboxProc. SIGTERM and SIGINT stop the agent
// cleanly: the guest helper stops it, sends its result, syncs and powers
// off. Before the task is running there is nothing to stop cleanly, and
// the VM is stopped at once.
func (s *vmSandbox) Signal(sig os.Signal) error {
	if sig != syscall.SIGTERM && sig != syscall.SIGINT {
		return fmt.Errorf("%s: signal %v is not supported (SIGTERM and SIGINT stop the task)", s.backend, sig)
	}
	s.mu.Lock()
	conn, running := s.conn, s.taskSent && !s.ended
	s.mu.Unlock()
	if running {
		s.log.Info("asking the guest to stop the agent")
		if err := conn.Send(&ctrl.Shutdown{}); err == nil {
			return nil
		}
	}
	return s.stopNow(statusTerminated)
}

// Kill implements sandboxProc: the VM stops at once (a paused VM too).
func (s *vmSandbox) Kill() error { return s.stopNow(statusKilled) }

func (s *vmSandbox) stopNow(status int) error {
	conn, _ := s.end(status)
	err := s.hv.stop()
	if conn != nil {
		conn.Close()
	}
	s.cancel()
	return err
}

// Pause implements pauser: on a ledger stop the VM is frozen where it
// is (nothing more leaves it, its state stays for inspection until the
// daemon's teardown stops it) and the session ends with statusKilled.
// If the VM cannot be paused it is stopped.
func (s *vmSandbox) Pause() error {
	conn, first := s.end(statusKilled)
	if !first {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.hv.pause(ctx)
	if err != nil {
		s.log.Error("pause the VM: stopping it", "err", err)
		if serr := s.hv.stop(); serr != nil {
			err = errors.Join(err, serr)
		}
	} else {
		s.log.Warn("the VM is paused")
	}
	if conn != nil {
		conn.Close()
	}
	s.cancel()
	return err
}

// close stops the VM if it still runs (teardown).
func (s *vmSandbox) close() error {
	err := s.Kill()
	<-s.done
	return err
}

// consoleTail returns the last n bytes of the console log, for errors.
func consoleTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ""
		}
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

// diagText formats the VMM's output and the console's tail.
func diagText(vmm []byte, console string) string {
	var b strings.Builder
	if s := strings.TrimSpace(string(vmm)); s != "" {
		fmt.Fprintf(&b, "\nhypervisor output:\n%s", s)
	}
	if tail := consoleTail(console, 2048); tail != "" {
		fmt.Fprintf(&b, "\nguest console (%s), last lines:\n%s", console, tail)
	}
	return b.String()
}

// prefixWriter logs each write of a helper's stderr at debug level.
type prefixWriter struct {
	log *slog.Logger
	msg string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line != "" {
			p.log.Debug(p.msg, "line", line)
		}
	}
	return len(b), nil
}
