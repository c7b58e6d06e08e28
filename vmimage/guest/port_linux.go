package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// sysVirtioPorts is where the kernel lists virtio-serial ports with their
// names; a variable so that tests can point it elsewhere.
var sysVirtioPorts = "/sys/class/virtio-ports"

// findVirtioPort returns the device node of the virtio-serial port called
// name: /dev/virtio-ports/NAME when udev made it, else /dev/<vportNpM>
// whose sysfs name matches.
func findVirtioPort(name string) (string, error) {
	if p := filepath.Join("/dev/virtio-ports", name); fileExists(p) {
		return p, nil
	}
	ents, err := os.ReadDir(sysVirtioPorts)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysVirtioPorts, e.Name(), "name"))
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			dev := filepath.Join("/dev", e.Name())
			if !fileExists(dev) {
				return "", fmt.Errorf("port %s is %s but %s does not exist (is devtmpfs mounted?)", name, e.Name(), dev)
			}
			return dev, nil
		}
	}
	return "", os.ErrNotExist
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// openVirtioPort waits up to wait for the port called name to appear and
// for the host to connect to it, then opens it.
func openVirtioPort(ctx context.Context, name string, wait time.Duration) (io.ReadWriteCloser, error) {
	deadline := time.Now().Add(wait)
	var dev string
	for {
		d, err := findVirtioPort(name)
		if err == nil {
			dev = d
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("virtio port %s: %w", name, err)
		}
		if err := sleepUntil(ctx, deadline, 50*time.Millisecond); err != nil {
			return nil, fmt.Errorf("virtio port %s did not appear: %w", name, err)
		}
	}
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	// virtio_console reports POLLHUP while the host side is not
	// connected; QEMU drops what the guest writes then, so wait.
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		_, err := unix.Poll(pfd, 0)
		if err != nil && !errors.Is(err, unix.EINTR) {
			unix.Close(fd)
			return nil, fmt.Errorf("poll %s: %w", dev, err)
		}
		if err == nil && pfd[0].Revents&unix.POLLHUP == 0 {
			break
		}
		if err := sleepUntil(ctx, deadline, 20*time.Millisecond); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("host did not connect to %s: %w", dev, err)
		}
	}
	return os.NewFile(uintptr(fd), dev), nil
}

var errDeadline = errors.New("deadline passed")

func sleepUntil(ctx context.Context, deadline time.Time, step time.Duration) error {
	if time.Now().After(deadline) {
		return errDeadline
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(step):
		return nil
	}
}

// acceptVsock listens on AF_VSOCK port and returns the first connection.
func acceptVsock(ctx context.Context, port uint32) (io.ReadWriteCloser, error) {
	lfd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vsock socket: %w", err)
	}
	defer unix.Close(lfd)
	if err := unix.Bind(lfd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		return nil, fmt.Errorf("vsock bind port %d: %w", port, err)
	}
	if err := unix.Listen(lfd, 1); err != nil {
		return nil, fmt.Errorf("vsock listen: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = unix.Shutdown(lfd, unix.SHUT_RDWR) })
	defer stop()
	fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("vsock accept on port %d: %w", port, err)
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("vsock:%d", port)), nil
}

// powerOff flushes the file systems (the working directory is virtio-fs:
// the host must have every write) and powers the machine off.
func powerOff(log *slog.Logger) {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Error("power off", "err", err)
	}
}
