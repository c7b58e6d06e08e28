//go:build linux

package fileev

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/carbd/carbd/internal/proc"
)

// DefaultVirtiofsd is where Debian's qemu-system-common installs the C
// virtiofsd (QEMU 7.2).
const DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"

// VirtiofsdConfig configures one virtiofsd: one per VM boot, since it
// exits when its VM disconnects.
type VirtiofsdConfig struct {
	// Binary is the virtiofsd executable; empty means DefaultVirtiofsd.
	Binary string
	// SocketPath is the vhost-user socket the VMM connects to
	// (--socket-path). Required; a stale socket file there is removed.
	SocketPath string
	// Source is the directory exported to the guest (-o source=): M.
	// Required.
	Source string
	// Cache is -o cache=: "auto" (default), "always" or "none".
	Cache string
	// Sandbox is -o sandbox=: "namespace" (default: after the VMM
	// connects, virtiofsd forks a child in new mount, pid and net
	// namespaces that pivot_roots into Source, so its paths are relative
	// to Source: trace it with Target.View "/") or "chroot".
	Sandbox string
	// Xattr enables extended attributes (-o xattr).
	Xattr bool
	// ThreadPoolSize is --thread-pool-size (0: virtiofsd's default).
	ThreadPoolSize int
	// Cgroup, when set, is the cgroup v2 directory virtiofsd starts in
	// (clone3 CLONE_INTO_CGROUP): tracing that cgroup sees every
	// syscall of virtiofsd and of the sandbox child it forks, from the
	// first.
	Cgroup *Cgroup
	// ExtraArgs are appended as they are (e.g. "-o", "log_level=debug").
	ExtraArgs []string
	// Log receives virtiofsd's stderr (it logs there); nil discards it.
	// The last 4 KiB are kept for error messages either way.
	Log io.Writer
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL; 0
	// means 5 s.
	StopGrace time.Duration
}

// Args returns virtiofsd's command line (without the binary) for cfg.
func (cfg *VirtiofsdConfig) Args() []string {
	cache := cfg.Cache
	if cache == "" {
		cache = "auto"
	}
	args := []string{"--socket-path=" + cfg.SocketPath, "-o", "source=" + cfg.Source, "-o", "cache=" + cache}
	if cfg.Sandbox != "" {
		args = append(args, "-o", "sandbox="+cfg.Sandbox)
	}
	if cfg.Xattr {
		args = append(args, "-o", "xattr")
	}
	if cfg.ThreadPoolSize > 0 {
		args = append(args, "--thread-pool-size="+strconv.Itoa(cfg.ThreadPoolSize))
	}
	return append(args, cfg.ExtraArgs...)
}

// Validate checks the configuration.
func (cfg *VirtiofsdConfig) Validate() error {
	if cfg.SocketPath == "" || !filepath.IsAbs(cfg.SocketPath) {
		return fmt.Errorf("virtiofsd: config: socket path %q is not an absolute path", cfg.SocketPath)
	}
	if strings.ContainsAny(cfg.SocketPath, " \t\n") {
		return fmt.Errorf("virtiofsd: config: socket path %q contains white space", cfg.SocketPath)
	}
	if cfg.Source == "" || !filepath.IsAbs(cfg.Source) {
		return fmt.Errorf("virtiofsd: config: source %q is not an absolute path", cfg.Source)
	}
	if st, err := os.Stat(cfg.Source); err != nil {
		return fmt.Errorf("virtiofsd: config: source: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("virtiofsd: config: source %s is not a directory", cfg.Source)
	}
	switch cfg.Cache {
	case "", "auto", "always", "none":
	default:
		return fmt.Errorf("virtiofsd: config: cache %q (want auto, always or none)", cfg.Cache)
	}
	switch cfg.Sandbox {
	case "", "namespace", "chroot":
	default:
		return fmt.Errorf("virtiofsd: config: sandbox %q (want namespace or chroot)", cfg.Sandbox)
	}
	if cfg.ThreadPoolSize < 0 {
		return fmt.Errorf("virtiofsd: config: thread pool size %d", cfg.ThreadPoolSize)
	}
	return nil
}

// Virtiofsd is a running virtiofsd.
type Virtiofsd struct {
	cmd    *exec.Cmd
	grace  time.Duration
	socket string
	done   chan struct{}
	err    error // set before done is closed

	mu      sync.Mutex // guards stopped
	stopped bool
	tail    *proc.Tail
}

// StartVirtiofsd starts virtiofsd and returns once its socket is
// listening (checked in /proc/net/unix, which does not escape white
// space: the socket path may not contain any). ctx bounds its whole life: when ctx is done virtiofsd is
// stopped as by Stop. Without a deadline on ctx, the start-up wait is
// bounded by 10 s.
func StartVirtiofsd(ctx context.Context, cfg VirtiofsdConfig) (_ *Virtiofsd, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin := cfg.Binary
	if bin == "" {
		bin = DefaultVirtiofsd
	}
	if st, err := os.Lstat(cfg.SocketPath); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("virtiofsd: socket path %s exists and is not a socket", cfg.SocketPath)
		}
		if err := os.Remove(cfg.SocketPath); err != nil {
			return nil, fmt.Errorf("virtiofsd: remove stale socket: %w", err)
		}
	}
	v := &Virtiofsd{grace: cfg.StopGrace, socket: cfg.SocketPath, done: make(chan struct{}), tail: &proc.Tail{Max: 4096}}
	if v.grace == 0 {
		v.grace = 5 * time.Second
	}
	cmd := exec.Command(bin, cfg.Args()...)
	cmd.Stdout = v.tail
	cmd.Stderr = v.tail
	if cfg.Log != nil {
		cmd.Stdout = io.MultiWriter(cfg.Log, v.tail)
		cmd.Stderr = cmd.Stdout
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if cfg.Cgroup != nil {
		cg, err := cfg.Cgroup.Open()
		if err != nil {
			return nil, err
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("virtiofsd: start %s: %w", bin, err)
	}
	v.cmd = cmd
	go func() {
		v.err = cmd.Wait()
		close(v.done)
	}()
	defer func() {
		if err != nil {
			v.Stop()
		}
	}()
	stopOnCancel := context.AfterFunc(ctx, func() { v.Stop() })
	go func() {
		<-v.done
		stopOnCancel()
	}()

	wait := ctx
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		// The socket file appears at bind(2), before listen(2): wait
		// for the kernel to list it as listening. (A probe connection
		// would be taken for the VMM's.)
		if listening(cfg.SocketPath) {
			return v, nil
		}
		select {
		case <-v.done:
			return nil, fmt.Errorf("virtiofsd: exited before listening (%v): %s", v.err, bytes.TrimSpace(v.tail.Bytes()))
		case <-wait.Done():
			return nil, fmt.Errorf("virtiofsd: socket %s not listening: %w", cfg.SocketPath, wait.Err())
		case <-tick.C:
		}
	}
}

// listening reports whether a Unix socket bound to path is listening, per
// /proc/net/unix (flag __SO_ACCEPTCON) of this network namespace.
func listening(path string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		// Num RefCount Protocol Flags Type St Inode Path
		f := bytes.Fields(line)
		if len(f) < 8 || string(f[7]) != path {
			continue
		}
		if flags, err := strconv.ParseUint(string(f[3]), 16, 32); err == nil && flags&0x10000 != 0 {
			return true
		}
	}
	return false
}

// PID is virtiofsd's process id (the parent: with sandbox=namespace the
// work happens in a child it forks when the VMM connects).
func (v *Virtiofsd) PID() int { return v.cmd.Process.Pid }

// SocketPath is the vhost-user socket.
func (v *Virtiofsd) SocketPath() string { return v.socket }

// Done is closed when virtiofsd has exited.
func (v *Virtiofsd) Done() <-chan struct{} { return v.done }

// Wait waits for virtiofsd to exit. It returns nil when it exited with
// status 0 (its VM disconnected) or because Stop stopped it.
func (v *Virtiofsd) Wait() error {
	<-v.done
	v.mu.Lock()
	stopped := v.stopped
	v.mu.Unlock()
	if v.err == nil || stopped {
		return nil
	}
	return fmt.Errorf("virtiofsd: %w: %s", v.err, bytes.TrimSpace(v.tail.Bytes()))
}

// Stop sends SIGTERM, waits up to the grace period, then SIGKILLs, and
// returns once virtiofsd has exited. Stopping a virtiofsd that already
// exited is not an error.
func (v *Virtiofsd) Stop() error {
	v.mu.Lock()
	v.stopped = true
	v.mu.Unlock()
	return proc.Stop(v.cmd, v.done, v.grace, "virtiofsd")
}
