package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
)

// config is the helper's command line.
type config struct {
	port         string
	socket       string
	fd           int
	vsockPort    uint
	workdir      string
	rundir       string
	poweroff     bool
	waitHost     time.Duration
	killGrace    time.Duration
	shutdownWait time.Duration
}

func parseFlags(args []string) (*config, error) {
	fs := flag.NewFlagSet("carbd-guest", flag.ContinueOnError)
	c := &config{}
	fs.StringVar(&c.port, "port", "", "virtio-serial port `name` of the control channel (e.g. carbd.ctrl)")
	fs.StringVar(&c.socket, "socket", "", "Unix socket `path` of the control channel")
	fs.IntVar(&c.fd, "fd", -1, "inherited, connected file descriptor of the control channel")
	fs.UintVar(&c.vsockPort, "vsock-port", 0, "AF_VSOCK `port` to listen on for the control channel")
	fs.StringVar(&c.workdir, "workdir", "", "the agent's working directory (default /work when it exists, else /)")
	fs.StringVar(&c.rundir, "rundir", "/run/carbd", "directory of the notices and result files")
	fs.BoolVar(&c.poweroff, "poweroff", false, "power the machine off at the end (the helper runs in a VM)")
	fs.DurationVar(&c.waitHost, "wait-host", 2*time.Minute, "how long to wait for the control port to appear and the host to connect")
	fs.DurationVar(&c.killGrace, "kill-grace", 5*time.Second, "SIGTERM to SIGKILL delay when the agent is stopped")
	fs.DurationVar(&c.shutdownWait, "shutdown-wait", 30*time.Second, "how long to wait for the host's shutdown after the result")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	n := 0
	for _, set := range []bool{c.port != "", c.socket != "", c.fd >= 0, c.vsockPort != 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("give exactly one of -port, -socket, -fd, -vsock-port")
	}
	if c.vsockPort > 0xffffffff {
		return nil, fmt.Errorf("-vsock-port %d out of range", c.vsockPort)
	}
	if c.workdir == "" {
		c.workdir = "/"
		if st, err := os.Stat("/work"); err == nil && st.IsDir() {
			c.workdir = "/work"
		}
	}
	return c, nil
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("prog", "carbd-guest")
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "carbd-guest:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err = run(ctx, cfg, log)
	cancel()
	if err != nil {
		log.Error("session", "err", err)
	}
	if cfg.poweroff {
		log.Info("power off")
		powerOff(log) // does not return on success
	}
	if err != nil {
		os.Exit(1)
	}
}

// run opens the control stream and runs one session over it.
func run(ctx context.Context, cfg *config, log *slog.Logger) error {
	rw, err := openControl(ctx, cfg)
	if err != nil {
		return err
	}
	conn := ctrl.NewConn(rw)
	defer conn.Close()
	s := &session{
		conn:         conn,
		log:          log,
		workdir:      cfg.workdir,
		rundir:       cfg.rundir,
		env:          os.Environ(),
		killGrace:    cfg.killGrace,
		shutdownWait: cfg.shutdownWait,
	}
	_, err = s.run(ctx)
	return err
}

// openControl opens the stream cfg names.
func openControl(ctx context.Context, cfg *config) (io.ReadWriteCloser, error) {
	switch {
	case cfg.socket != "":
		var d net.Dialer
		c, err := d.DialContext(ctx, "unix", cfg.socket)
		if err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
		return c, nil
	case cfg.fd >= 0:
		f := os.NewFile(uintptr(cfg.fd), fmt.Sprintf("fd%d", cfg.fd))
		if f == nil {
			return nil, fmt.Errorf("control fd %d is not valid", cfg.fd)
		}
		return f, nil
	case cfg.vsockPort != 0:
		return acceptVsock(ctx, uint32(cfg.vsockPort))
	default:
		return openVirtioPort(ctx, cfg.port, cfg.waitHost)
	}
}
