package qemu

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Tap is a persistent tap device that QEMU attaches to by name. carbd's
// TC program and netfilter rules go on it: guest-to-world traffic is
// ingress here.
type Tap struct {
	Name  string
	Index int
	// Addr is the host side's address (the guest's gateway), if any.
	Addr netip.Prefix
}

// CreateTap creates the tap device name (IFF_TAP, IFF_NO_PI, one queue),
// gives it addr when valid, and sets it up. Delete removes it.
func CreateTap(name string, addr netip.Prefix) (*Tap, error) {
	t, err := CreateTapDown(name, addr)
	if err != nil {
		return nil, err
	}
	if err := t.Up(); err != nil {
		_ = t.Delete()
		return nil, err
	}
	return t, nil
}

// CreateTapDown is CreateTap without setting the link up, so that
// carbd's TC program and rules are attached before it carries anything;
// Up sets it up.
//
// more are further addresses of the tap (the host's IPv6 address); IPv6
// ones are added without duplicate address detection, so they are usable
// at once.
func CreateTapDown(name string, addr netip.Prefix, more ...netip.Prefix) (_ *Tap, err error) {
	la := netlink.NewLinkAttrs()
	la.Name = name
	tap := &netlink.Tuntap{
		LinkAttrs: la,
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_DEFAULTS | netlink.TUNTAP_NO_PI,
	}
	if err := netlink.LinkAdd(tap); err != nil {
		return nil, fmt.Errorf("qemu: create tap %s: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = netlink.LinkDel(tap)
		}
	}()
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("qemu: tap %s: %w", name, err)
	}
	for _, p := range append([]netip.Prefix{addr}, more...) {
		if !p.IsValid() {
			continue
		}
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, a); err != nil {
			return nil, fmt.Errorf("qemu: address %v on tap %s: %w", p, name, err)
		}
	}
	return &Tap{Name: name, Index: link.Attrs().Index, Addr: addr}, nil
}

// Up sets the tap up.
func (t *Tap) Up() error {
	link, err := netlink.LinkByIndex(t.Index)
	if err != nil {
		return fmt.Errorf("qemu: tap %s: %w", t.Name, err)
	}
	if link.Attrs().Name != t.Name {
		return fmt.Errorf("qemu: tap %s: index %d is now %s", t.Name, t.Index, link.Attrs().Name)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("qemu: tap %s up: %w", t.Name, err)
	}
	return nil
}

// Delete removes the tap device; one already gone is not an error.
func (t *Tap) Delete() error {
	link, err := netlink.LinkByName(t.Name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("qemu: tap %s: %w", t.Name, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return fmt.Errorf("qemu: delete tap %s: %w", t.Name, err)
	}
	return nil
}
