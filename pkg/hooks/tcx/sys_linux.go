package tcx

import (
	"fmt"
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
