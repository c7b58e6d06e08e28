//go:build linux

package fileev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

func requireVirtiofsd(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat(DefaultVirtiofsd); err != nil {
		if os.Getenv("CARBD_CI") != "" {
			t.Fatalf("%s missing but CI must have it (qemu-system-common)", DefaultVirtiofsd)
		}
		t.Skipf("skipping: %s is not installed (run make setup)", DefaultVirtiofsd)
	}
}

func TestVirtiofsdStartStop(t *testing.T) {
	requireVirtiofsd(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "vfs.sock")
	v, err := StartVirtiofsd(context.Background(), VirtiofsdConfig{SocketPath: sock, Source: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Stop() })
	st, err := os.Lstat(sock)
	if err != nil || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %s: %v %v", sock, st, err)
	}
	if err := syscall.Kill(v.PID(), 0); err != nil {
		t.Fatalf("virtiofsd not running: %v", err)
	}
	if err := v.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-v.Done():
	default:
		t.Fatal("Stop returned before virtiofsd exited")
	}
	if err := v.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	if err := syscall.Kill(v.PID(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("virtiofsd pid %d still exists after Stop: %v", v.PID(), err)
	}
	if err := v.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestVirtiofsdStopsWithContext(t *testing.T) {
	requireVirtiofsd(t)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	v, err := StartVirtiofsd(ctx, VirtiofsdConfig{SocketPath: filepath.Join(dir, "s"), Source: dir})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-v.Done() // bounded by StopGrace: SIGTERM, then SIGKILL
	if err := v.Wait(); err != nil {
		t.Errorf("Wait: %v", err)
	}
}

func TestVirtiofsdConfigErrors(t *testing.T) {
	dir := t.TempDir()
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o644)
	for _, tc := range []struct {
		cfg  VirtiofsdConfig
		want string
	}{
		{VirtiofsdConfig{Source: dir}, "socket path"},
		{VirtiofsdConfig{SocketPath: "rel.sock", Source: dir}, "socket path"},
		{VirtiofsdConfig{SocketPath: "/s", Source: "rel"}, "source"},
		{VirtiofsdConfig{SocketPath: "/s", Source: notDir}, "not a directory"},
		{VirtiofsdConfig{SocketPath: "/s", Source: dir, Cache: "sometimes"}, "cache"},
		{VirtiofsdConfig{SocketPath: "/s", Source: dir, Sandbox: "none"}, "sandbox"},
	} {
		if _, err := StartVirtiofsd(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StartVirtiofsd(%+v) = %v, want an error with %q", tc.cfg, err, tc.want)
		}
	}
	// A path that exists and is not a socket is not removed.
	if _, err := StartVirtiofsd(context.Background(), VirtiofsdConfig{SocketPath: notDir, Source: dir}); err == nil ||
		!strings.Contains(err.Error(), "not a socket") {
		t.Errorf("StartVirtiofsd on a regular file = %v", err)
	}
	if _, err := os.Stat(notDir); err != nil {
		t.Errorf("regular file removed: %v", err)
	}
	// A binary that does not listen fails with its output.
	if _, err := StartVirtiofsd(context.Background(), VirtiofsdConfig{Binary: "/bin/false", SocketPath: filepath.Join(dir, "s"), Source: dir}); err == nil ||
		!strings.Contains(err.Error(), "exited before listening") {
		t.Errorf("StartVirtiofsd(/bin/false) = %v", err)
	}
	want := []string{"--socket-path=/s", "-o", "source=/src", "-o", "cache=none", "-o", "sandbox=chroot", "-o", "xattr", "--thread-pool-size=4"}
	got := (&VirtiofsdConfig{SocketPath: "/s", Source: "/src", Cache: "none", Sandbox: "chroot", Xattr: true, ThreadPoolSize: 4}).Args()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("Args = %q, want %q", got, want)
	}
}
