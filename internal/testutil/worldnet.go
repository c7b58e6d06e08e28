package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// worldNetDir holds one lock file per world subnet; the locks are flock(2)
// locks, so a test process that dies releases them.
const worldNetDir = "/run/carbd-test/worldnet"

// ClaimWorldNet takes, for the rest of the test, the host-side world subnet
// 198.18.<octet>.0/30 that a test's world namespace uses, waiting while a
// test of another package (go test runs packages in parallel) holds it: two
// host interfaces with the same connected /30 would make the host route one
// test's packets to the other's world. Each test still chooses its octet;
// the claim only turns an accidental reuse into waiting instead of a flake.
func ClaimWorldNet(tb testing.TB, octet int) {
	tb.Helper()
	if octet < 0 || octet > 255 {
		tb.Fatalf("world subnet: octet %d out of range", octet)
	}
	if err := os.MkdirAll(worldNetDir, 0o755); err != nil {
		tb.Fatalf("world subnet: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(worldNetDir, fmt.Sprintf("%d.lock", octet)), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		tb.Fatalf("world subnet: %v", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		tb.Fatalf("world subnet 198.18.%d.0/30: lock: %v", octet, err)
	}
	tb.Cleanup(func() { f.Close() })
	removeStaleWorldLinks(tb, octet)
}

// removeStaleWorldLinks deletes the host links that hold 198.18.<octet>.1,
// the host side of every world on that subnet. With the claim held no
// live test uses the subnet, so such a link was left by a test process
// that died before its cleanup (killed, or go test's timeout): kept, it
// would route the new world's traffic into a namespace nobody serves, in
// every later run on the machine.
func removeStaleWorldLinks(tb testing.TB, octet int) {
	tb.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		tb.Fatalf("world subnet: %v", err)
	}
	host := net.IPv4(198, 18, byte(octet), 1)
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue // gone meanwhile
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(host) {
				if out, err := exec.Command("ip", "link", "del", ifc.Name).CombinedOutput(); err != nil {
					tb.Fatalf("world subnet: remove the stale link %s (%s): %v: %s", ifc.Name, host, err, out)
				}
				tb.Logf("world subnet: removed the stale link %s (%s), left by an earlier run", ifc.Name, host)
				break
			}
		}
	}
}
