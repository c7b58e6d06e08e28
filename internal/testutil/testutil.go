// Package testutil holds carbd's test helpers: privilege and kernel
// feature gates, unique names for machine-global objects (namespaces,
// links, queue numbers, marks), and throwaway network namespaces.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
)

// RequireRoot skips the test when not running as root. In CI we are root,
// so privileged tests run there.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skipping: needs root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN); CI runs it as root")
	}
}

// RequireTool skips the test when a command is not installed; `make setup`
// installs every tool the tests use.
func RequireTool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CARBD_CI") != "" {
			tb.Fatalf("%s is not installed but CI must have it (make setup installs it)", name)
		}
		tb.Skipf("skipping: %s is not installed (run make setup)", name)
	}
	return p
}

var seq atomic.Uint32

// UniqueName returns a short name unique to this process and call, for
// machine-global objects: prefix + pid + counter, at most 15 bytes so it
// fits an interface name.
func UniqueName(prefix string) string {
	n := seq.Add(1)
	s := fmt.Sprintf("%s%x%x", prefix, os.Getpid()&0xfffff, n)
	if len(s) > 15 {
		s = s[len(s)-15:]
	}
	return s
}

// Run runs a command and fails the test with its output on error.
func Run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// NewNetNS creates a named network namespace with loopback up and removes
// it when the test ends.
func NewNetNS(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	name := UniqueName("cbt")
	Run(tb, "ip", "netns", "add", name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	Run(tb, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}
