package tcx

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// attachTCX attaches prog first on the ingress of ifindex in the
// namespace at nsPath. Being first matters: a TCX program that passes
// (TCX_PASS) ends the chain, so a program before carbd's could let a
// packet through unmarked, and one after could redirect it past netfilter.
func attachTCX(nsPath string, ifindex int, prog *ebpf.Program) (link.Link, error) {
	var l link.Link
	err := inNetNS(nsPath, func() error {
		var err error
		l, err = link.AttachTCX(link.TCXOptions{
			Interface: ifindex,
			Program:   prog,
			Attach:    ebpf.AttachTCXIngress,
			Anchor:    link.Head(),
		})
		return err
	})
	return l, err
}

// The legacy filter: clsact ingress, priority 1 (the first), handle 1.
const (
	legacyPrio   = 1
	legacyHandle = 1
)

func legacyFilter(ifindex int, prog *ebpf.Program, name string) *netlink.BpfFilter {
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Handle:    legacyHandle,
			Protocol:  unix.ETH_P_ALL,
			Priority:  legacyPrio,
		},
		Name:         name,
		DirectAction: true,
	}
	if prog != nil {
		f.Fd = prog.FD()
	}
	return f
}

// attachLegacy adds a clsact qdisc when the interface has none and a
// direct-action cls_bpf filter at priority 1 on its ingress. It fails if
// a filter already sits at that priority and handle.
func attachLegacy(nsPath string, ifindex int, prog *ebpf.Program, name string) error {
	h, err := netlinkHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("find ifindex %d: %w", ifindex, err)
	}
	qdiscs, err := h.QdiscList(l)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list qdiscs: %w", err)
	}
	have := false
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			have = true
		}
	}
	if !have {
		q := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{
				LinkIndex: ifindex,
				Handle:    netlink.MakeHandle(0xffff, 0),
				Parent:    netlink.HANDLE_CLSACT,
			},
			QdiscType: "clsact",
		}
		if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add clsact qdisc: %w", err)
		}
	}
	if err := h.FilterAdd(legacyFilter(ifindex, prog, name)); err != nil {
		return fmt.Errorf("add cls_bpf filter: %w", err)
	}
	return nil
}

// replaceLegacy swaps the filter's program in one netlink request; the
// kernel replaces it under RCU, so no packet sees an empty ingress.
func replaceLegacy(nsPath string, ifindex int, prog *ebpf.Program, name string) error {
	h, err := netlinkHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.FilterReplace(legacyFilter(ifindex, prog, name)); err != nil {
		return fmt.Errorf("replace cls_bpf filter: %w", err)
	}
	return nil
}

// detachLegacy deletes carbd's filter. The clsact qdisc stays: other
// filters may hang off it. A vanished interface is not an error.
func detachLegacy(nsPath string, ifindex int) error {
	h, err := netlinkHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.FilterDel(legacyFilter(ifindex, nil, "")); err != nil &&
		!errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("delete cls_bpf filter: %w", err)
	}
	return nil
}

// findLegacy checks that carbd's filter is on the interface.
func findLegacy(nsPath string, ifindex int, name string) error {
	h, err := netlinkHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("find ifindex %d: %w", ifindex, err)
	}
	filters, err := h.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return fmt.Errorf("list filters: %w", err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Priority == legacyPrio && bf.Handle == legacyHandle && bf.Name == name {
			return nil
		}
	}
	return fmt.Errorf("no filter %s on ifindex %d", name, ifindex)
}
