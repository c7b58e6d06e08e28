package nfrules

import (
	"fmt"
	"net/netip"
	"strings"
)

// UntrackTable exempts one sandbox's traffic from connection tracking:
// table inet carbd-raw-<id>, with a prerouting and an output chain at raw
// priority (-300: after the defragmenter at -400, before conntrack at
// -200). What arrives on Iface (everything the guest sends, whatever its
// mark) and what goes to the guest's Networks (the replies, from the
// world or from the host) is notrack'd.
//
// Both directions, because one alone is worse than none: with only the
// guest's packets untracked, the entry its first (queued) packet made sees
// the server acknowledge bytes it never saw, and conntrack calls every
// reply INVALID (a host rule dropping INVALID then kills every released
// connection); with its first packet untracked too, the replies make
// half-entries of their own.
//
// carbd's guarantees do not rest on conntrack: the TC program decides,
// the queue rule matches every state (UNTRACKED too), and the
// defragmenter, which the queue rule's conntrack match keeps registered
// in the namespace, reassembles fragments before this table runs.
type UntrackTable struct {
	Name     string
	Iface    string
	Networks []netip.Prefix // masked
}

// NFTScript renders the table as an nft script (`nft -f`); Apply builds
// the same rules through netlink.
func (u *UntrackTable) NFTScript() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", u.Name)
	b.WriteString("\tchain prerouting {\n\t\ttype filter hook prerouting priority raw; policy accept;\n")
	fmt.Fprintf(&b, "\t\tiifname %q notrack\n", u.Iface)
	for _, n := range u.Networks {
		fmt.Fprintf(&b, "\t\t%s daddr %s notrack\n", netFamily(n), n)
	}
	b.WriteString("\t}\n")
	b.WriteString("\tchain output {\n\t\ttype filter hook output priority raw; policy accept;\n")
	for _, n := range u.Networks {
		fmt.Fprintf(&b, "\t\t%s daddr %s notrack\n", netFamily(n), n)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// netFamily is the nft family keyword of a network's addresses.
func netFamily(n netip.Prefix) string {
	if n.Addr().Is4() {
		return "ip"
	}
	return "ip6"
}
