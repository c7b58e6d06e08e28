// Package testutil holds carbd's test helpers: privilege and kernel
// feature gates, unique names for machine-global objects (namespaces,
// links, queue numbers, marks), and throwaway network namespaces.
package testutil

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"
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

// WaitLinkReady waits until link dev in namespace ns can transmit: its
// operational state is UP and its qdisc has been activated. `ip link set
// up` returns before that: the device keeps the noop qdisc, which drops
// every frame silently, until the kernel's link watcher runs, and that
// work is rate-limited (up to a second) and needs the RTNL lock, so on a
// busy machine (a first `make test` after boot) the first frames a test
// sends can vanish. The limit is a hang guard, not a speed assertion.
func WaitLinkReady(tb testing.TB, ns, dev string) {
	tb.Helper()
	waitReady(tb, ns, dev, "UP")
}

// WaitTapReady is WaitLinkReady for a tap, whose operational state stays
// UNKNOWN (tun reports no carrier changes): it waits for the qdisc to be
// activated.
func WaitTapReady(tb testing.TB, ns, dev string) {
	tb.Helper()
	waitReady(tb, ns, dev, "UP", "UNKNOWN")
}

func waitReady(tb testing.TB, ns, dev string, states ...string) {
	tb.Helper()
	var last string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		out, err := exec.Command("ip", "-n", ns, "-j", "link", "show", "dev", dev).Output()
		if err != nil {
			tb.Fatalf("ip -n %s link show %s: %v", ns, dev, err)
		}
		var links []struct {
			Qdisc     string `json:"qdisc"`
			OperState string `json:"operstate"`
		}
		if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
			tb.Fatalf("ip -n %s link show %s: %v: %s", ns, dev, err, out)
		}
		l := links[0]
		if slices.Contains(states, l.OperState) && l.Qdisc != "" && l.Qdisc != "noop" {
			return
		}
		last = l.OperState + ", qdisc " + l.Qdisc
	}
	tb.Fatalf("link %s in %s not ready to transmit after 60s (%s)", dev, ns, last)
}

// GoTool is the go command for tests that build a binary: the one on
// PATH, else the toolchain's usual place on these machines.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}
