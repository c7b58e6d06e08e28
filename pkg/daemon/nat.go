package daemon

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// masquerade routes the sandbox's egress through the host: forwarding on,
// and a nat table of carbd's own (carbd-nat-<id>) masquerading the
// sandbox's networks on every interface but its own. It returns the undo.
func masquerade(p netns.Plan) (func() error, error) {
	for _, s := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		if b, err := os.ReadFile(s); err == nil && strings.TrimSpace(string(b)) != "1" {
			if err := os.WriteFile(s, []byte("1"), 0o644); err != nil {
				return nil, fmt.Errorf("enable forwarding (%s): %w", s, err)
			}
		}
	}
	c := &nftables.Conn{}
	name := "carbd-nat-" + p.ID
	// A crashed carbd leaves its table: remove it (its own batch, as a
	// missing table fails the deletion) rather than add a second rule.
	for _, f := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		c.DelTable(&nftables.Table{Family: f, Name: name})
		_ = c.Flush()
	}
	var tables []*nftables.Table
	for _, fam := range []struct {
		f      nftables.TableFamily
		subnet []byte
		bits   int
		off    uint32 // source address offset in the network header
		length uint32
	}{
		{nftables.TableFamilyIPv4, p.Subnet4().Addr().AsSlice(), p.Subnet4().Bits(), 12, 4},
		{nftables.TableFamilyIPv6, p.Subnet6().Addr().AsSlice(), p.Subnet6().Bits(), 8, 16},
	} {
		t := c.AddTable(&nftables.Table{Family: fam.f, Name: name})
		tables = append(tables, t)
		ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		mask := make([]byte, fam.length)
		for i := 0; i < fam.bits; i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.off, Len: fam.length},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: fam.length, Mask: mask, Xor: make([]byte, fam.length)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: fam.subnet},
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(p.HostIf)},
			&expr.Masq{},
		}})
	}
	if err := c.Flush(); err != nil {
		return nil, err
	}
	return func() error {
		c := &nftables.Conn{}
		for _, t := range tables {
			c.DelTable(t)
		}
		if err := c.Flush(); err != nil && !isNotExist(err) {
			return fmt.Errorf("remove nat table %s: %w", name, err)
		}
		return nil
	}, nil
}

func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}

func isNotExist(err error) bool { return strings.Contains(err.Error(), "no such file") }
