package nfrules

import (
	"fmt"
	"net/netip"
	"strings"
)

// NATConfig says which sandbox networks carbd masquerades, for a sandbox
// whose egress leaves through the host's own routes (the namespace
// sandbox; a VM's tap is routed the same way).
type NATConfig struct {
	// SandboxID names the tables (carbd-nat-<id>): 1 to 20 of
	// [A-Za-z0-9_-]. Required.
	SandboxID string
	// Iface is the host side of the guest's interface: traffic going
	// back out of it (to the guest) is not masqueraded. Required.
	Iface string
	// Subnets are the guest's networks (one per family at most).
	Subnets []netip.Prefix
	// NetNS is the namespace to program (see Config.NetNS). Empty: the
	// caller's.
	NetNS string
	// Forwarding: the plan turns net.ipv4.ip_forward and
	// net.ipv6.conf.all.forwarding on while the sandbox runs, for the
	// families it has a subnet of. See ApplyNAT for how they are put
	// back.
	Forwarding bool
	// StateDir keeps, per namespace and sysctl, the value found before
	// the first sandbox changed it and which sandboxes need it (so the
	// last one to end restores it). Required with Forwarding. Every carbd
	// of a machine must use the same one (DefaultSysctlDir): the sysctls
	// are the namespace's, not a sandbox's.
	StateDir string
	// RedirectPorts are the TCP destination ports of the guest's
	// connections redirected to RedirectTo, a port of the host's side of
	// Iface (carbd's TLS interception: the listener reads the original
	// destination with SO_ORIGINAL_DST). Both or neither.
	RedirectPorts []uint16
	RedirectTo    uint16
}

// DefaultSysctlDir is where carbd counts who needs a sysctl it changed.
const DefaultSysctlDir = "/run/carbd/sysctl"

// Sysctl is one kernel setting the plan needs while a sandbox runs.
type Sysctl struct {
	Key   string // dotted, e.g. net.ipv4.ip_forward
	Value string
}

// Path is the sysctl's file under /proc/sys.
func (s Sysctl) Path() string { return "/proc/sys/" + strings.ReplaceAll(s.Key, ".", "/") }

// NATTable is one masquerading table (nftables family ip or ip6).
type NATTable struct {
	Family string // "ip" or "ip6"
	Name   string
	Subnet netip.Prefix
	// NotIface: packets leaving through it (back to the guest) are not
	// masqueraded.
	NotIface string
	// Redirects: TCP connections arriving on NotIface to these ports go
	// to port RedirectTo of the host (a prerouting chain).
	Redirects  []uint16
	RedirectTo uint16
}

// NATPlan is the masquerading of one sandbox, as data. BuildNAT makes
// it; ApplyNAT installs it.
type NATPlan struct {
	Sysctls []Sysctl
	Tables  []NATTable
}

// BuildNAT makes the masquerading plan for cfg. It is pure.
func BuildNAT(cfg NATConfig) (*NATPlan, error) {
	if err := (Config{SandboxID: cfg.SandboxID, Iface: cfg.Iface}).Validate(); err != nil {
		return nil, err
	}
	if len(cfg.Subnets) == 0 {
		return nil, fmt.Errorf("nfrules: nat: no subnet")
	}
	if cfg.Forwarding && cfg.StateDir == "" {
		return nil, fmt.Errorf("nfrules: nat: forwarding needs a state directory")
	}
	if (len(cfg.RedirectPorts) > 0) != (cfg.RedirectTo != 0) {
		return nil, fmt.Errorf("nfrules: nat: redirect needs both ports and a target port")
	}
	for _, p := range cfg.RedirectPorts {
		if p == 0 || p == cfg.RedirectTo {
			return nil, fmt.Errorf("nfrules: nat: cannot redirect port %d to %d", p, cfg.RedirectTo)
		}
	}
	p := &NATPlan{}
	seen := map[string]bool{}
	for _, s := range cfg.Subnets {
		if !s.IsValid() {
			return nil, fmt.Errorf("nfrules: nat: invalid subnet %v", s)
		}
		s = s.Masked()
		fam, key := "ip", "net.ipv4.ip_forward"
		if s.Addr().Is6() && !s.Addr().Is4In6() {
			fam, key = "ip6", "net.ipv6.conf.all.forwarding"
		}
		if seen[fam] {
			return nil, fmt.Errorf("nfrules: nat: two %s subnets", fam)
		}
		seen[fam] = true
		if cfg.Forwarding {
			p.Sysctls = append(p.Sysctls, Sysctl{Key: key, Value: "1"})
		}
		p.Tables = append(p.Tables, NATTable{Family: fam, Name: "carbd-nat-" + cfg.SandboxID, Subnet: s, NotIface: cfg.Iface,
			Redirects: cfg.RedirectPorts, RedirectTo: cfg.RedirectTo})
	}
	return p, nil
}

// String renders the plan: the sysctls as sysctl(8) lines, then the
// tables as an nft script.
func (p *NATPlan) String() string {
	var b strings.Builder
	for _, s := range p.Sysctls {
		fmt.Fprintf(&b, "# sysctl -w %s=%s (while a sandbox needs it; the last one restores the value it found)\n", s.Key, s.Value)
	}
	b.WriteString(p.NFTScript())
	return b.String()
}

// NFTScript renders the tables as an nft script (`nft -f`); ApplyNAT
// builds the same rules through netlink.
func (p *NATPlan) NFTScript() string {
	var b strings.Builder
	for _, t := range p.Tables {
		fmt.Fprintf(&b, "table %s %s {\n", t.Family, t.Name)
		b.WriteString("\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n")
		fmt.Fprintf(&b, "\t\t%s saddr %s oifname != %q masquerade\n", t.Family, t.Subnet, t.NotIface)
		b.WriteString("\t}\n")
		if len(t.Redirects) > 0 {
			b.WriteString("\tchain prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n")
			for _, port := range t.Redirects {
				fmt.Fprintf(&b, "\t\tiifname %q tcp dport %d redirect to :%d\n", t.NotIface, port, t.RedirectTo)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}
