package nfrules

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// UntrackIfaceExprs compiles the table's `iifname IFACE notrack` rule.
func UntrackIfaceExprs(iface string) []expr.Any {
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, iface)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
		&expr.Notrack{},
	}
}

// UntrackNetExprs compiles the table's `ip daddr NET notrack` (or ip6)
// rule, for family inet.
func UntrackNetExprs(n netip.Prefix) []expr.Any {
	proto, off, size := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4)
	if !n.Addr().Is4() {
		proto, off, size = unix.NFPROTO_IPV6, 24, 16
	}
	mask := make([]byte, size)
	for i := 0; i < n.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: size},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: n.Masked().Addr().AsSlice()},
		&expr.Notrack{},
	}
}

// applyUntrack installs the table in one netlink transaction (flushed
// and refilled when it exists).
func applyUntrack(u *UntrackTable, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	t := conn.AddTable(&nftables.Table{Name: u.Name, Family: nftables.TableFamilyINet})
	conn.FlushTable(t)
	accept := nftables.ChainPolicyAccept
	pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	out := conn.AddChain(&nftables.Chain{Name: "output", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityRaw, Policy: &accept})
	conn.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: UntrackIfaceExprs(u.Iface)})
	for _, n := range u.Networks {
		conn.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: UntrackNetExprs(n)})
	}
	for _, n := range u.Networks {
		conn.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: UntrackNetExprs(n)})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nfrules: install table inet %s: %w", u.Name, err)
	}
	return nil
}

// removeUntrack deletes the table named name; its absence is no error.
func removeUntrack(name, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	t, err := conn.ListTableOfFamily(name, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("nfrules: look up table inet %s: %w", name, err)
	}
	conn.DelTable(t)
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nfrules: delete table inet %s: %w", name, err)
	}
	return nil
}

// verifyUntrack checks that the table is there with its rules.
func verifyUntrack(u *UntrackTable, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	t, err := conn.ListTableOfFamily(u.Name, nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("nfrules: table inet %s: %w", u.Name, err)
	}
	for name, want := range map[string]int{"prerouting": 1 + len(u.Networks), "output": len(u.Networks)} {
		c, err := conn.ListChain(t, name)
		if err != nil {
			return fmt.Errorf("nfrules: chain %s of %s: %w", name, u.Name, err)
		}
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return fmt.Errorf("nfrules: rules of %s in %s: %w", name, u.Name, err)
		}
		if len(rules) != want {
			return fmt.Errorf("nfrules: chain %s of %s has %d rules, want %d", name, u.Name, len(rules), want)
		}
	}
	return nil
}
