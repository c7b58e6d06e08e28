package tcx

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/netnsx"
)

// This file is the package's syscall surface besides cilium/ebpf:
// namespaces, bpffs, clocks.

// inNetNS runs fn inside the network namespace at path ("" runs fn where
// the caller is), on a thread that never returns to the pool in the wrong
// namespace (see internal/netnsx).
func inNetNS(path string, fn func() error) error { return netnsx.Do(path, fn) }

// netlinkHandle returns a rtnetlink handle in the namespace at path ("" is
// the caller's).
func netlinkHandle(path string) (*netlink.Handle, error) {
	if path == "" {
		return netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	return netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
}

// resolveIfindex returns the index of the interface named in cfg, checking
// that it exists in cfg's namespace.
func resolveIfindex(cfg Config) (int, error) {
	h, err := netlinkHandle(cfg.NetNS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	var l netlink.Link
	if cfg.Ifname != "" {
		l, err = h.LinkByName(cfg.Ifname)
	} else {
		l, err = h.LinkByIndex(cfg.Ifindex)
	}
	if err != nil {
		return 0, fmt.Errorf("find interface %s: %w", cfg.ifaceName(), err)
	}
	if cfg.Ifindex != 0 && l.Attrs().Index != cfg.Ifindex {
		return 0, fmt.Errorf("interface %s has index %d, not %d", cfg.Ifname, l.Attrs().Index, cfg.Ifindex)
	}
	return l.Attrs().Index, nil
}

var mountMu sync.Mutex

// ensureBPFFS makes dir, which must lie on a bpf filesystem. When the
// default /sys/fs/bpf is not mounted, it mounts it.
func ensureBPFFS(dir string) error {
	mountMu.Lock()
	defer mountMu.Unlock()
	p := filepath.Clean(dir)
	for {
		if _, err := os.Stat(p); err == nil {
			break
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", p, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		const def = "/sys/fs/bpf"
		if p != def || !strings.HasPrefix(filepath.Clean(dir)+"/", def+"/") {
			return fmt.Errorf("pin dir %s is not on a bpf filesystem (mount -t bpf bpf DIR)", dir)
		}
		if err := unix.Mount("bpf", def, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs on %s: %w", def, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make pin dir: %w", err)
	}
	return nil
}

// monotonicNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// wallFromMono converts a CLOCK_MONOTONIC reading to wall time, given a
// pair of readings of both clocks taken together.
func wallFromMono(ns, monoNow uint64, wallNow time.Time) time.Time {
	return wallNow.Add(-time.Duration(int64(monoNow - ns)))
}
