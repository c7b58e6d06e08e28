package nfrules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Backend is the netfilter interface the rules go through.
type Backend uint8

const (
	// BackendAuto: Detect picks one.
	BackendAuto Backend = iota
	// BackendNFT: a native nftables table with the queue statement
	// (CONFIG_NFT_QUEUE), through netlink.
	BackendNFT
	// BackendXtables: iptables-nft / ip6tables-nft with the xtables NFQUEUE
	// target, for kernels without the nftables queue statement.
	BackendXtables
)

func (b Backend) String() string {
	switch b {
	case BackendAuto:
		return "auto"
	case BackendNFT:
		return "nftables"
	case BackendXtables:
		return "xtables-nft"
	}
	return fmt.Sprintf("backend(%d)", uint8(b))
}

// Marks are the skb->mark values carbd's TC program sets (pkg/hooks/tcx),
// compared under Mask.
type Marks struct {
	Mask      uint32
	Pass      uint32 // decided: continue to the host's own rules
	Queue     uint32 // undecided: to the NFQUEUE
	LinkLocal uint32 // ARP, ND, MLD: accepted for the host, never forwarded
}

// DefaultMarks are the marks of pkg/hooks/tcx (tcx.MarkMask, tcx.MarkPass,
// tcx.MarkQueue, tcx.MarkLinkLocal; a test keeps them equal).
var DefaultMarks = Marks{Mask: 0xffff0000, Pass: 0xcb010000, Queue: 0xcb020000, LinkLocal: 0xcb030000}

// Config says which interface's traffic carbd's rules govern.
type Config struct {
	// SandboxID names carbd's chains (CARBD-<id>-F, CARBD-<id>-I) or
	// table (carbd-<id>): 1 to 20 of [A-Za-z0-9_-]. Required.
	SandboxID string
	// Iface is the host side of the guest's interface. Required.
	Iface string
	// QueueNum is the NFQUEUE the verdict loop listens on.
	QueueNum uint16
	// Marks: zero means DefaultMarks.
	Marks Marks
	// NetNS is the path of the network namespace to install the rules in
	// (/run/netns/NAME, /proc/PID/ns/net). Empty: the caller's.
	NetNS string
	// Backend: BackendAuto (zero) runs Detect in NetNS.
	Backend Backend
	// Untracked, when it lists the guest's networks, exempts the
	// sandbox's traffic from connection tracking (an nftables table at
	// raw priority, see UntrackTable): what arrives on Iface and what goes
	// to these networks. The defragmenter still runs before it, so the
	// queue still sees whole datagrams, and carbd's rules decide untracked
	// packets as before; released flows then pay no conntrack. Leave it
	// empty (tracked) whenever anything on the host needs conntrack for
	// the sandbox's traffic: masquerading (BuildNAT, as carbd run does),
	// a REDIRECT (interception), or a stateful host rule (ct state) on the
	// guest's flows.
	Untracked []netip.Prefix
}

func (c Config) marks() Marks {
	if c.Marks == (Marks{}) {
		return DefaultMarks
	}
	return c.Marks
}

// Validate checks the configuration without touching the system.
func (c Config) Validate() error {
	if c.SandboxID == "" || len(c.SandboxID) > 20 {
		return fmt.Errorf("nfrules: sandbox id %q: want 1 to 20 characters", c.SandboxID)
	}
	for _, r := range c.SandboxID {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("nfrules: sandbox id %q: character %q not in [A-Za-z0-9_-]", c.SandboxID, r)
		}
	}
	if c.Iface == "" || len(c.Iface) > 15 || strings.ContainsAny(c.Iface, " /\t\n\"'") {
		return fmt.Errorf("nfrules: interface name %q: want 1 to 15 characters, no spaces, quotes or slashes", c.Iface)
	}
	m := c.marks()
	if m.Mask == 0 {
		return errors.New("nfrules: marks: zero mask")
	}
	seen := map[uint32]string{}
	for _, v := range []struct {
		name string
		v    uint32
	}{{"pass", m.Pass}, {"queue", m.Queue}, {"link-local", m.LinkLocal}} {
		switch {
		case v.v&^m.Mask != 0:
			return fmt.Errorf("nfrules: marks: %s %#x has bits outside the mask %#x", v.name, v.v, m.Mask)
		case v.v == 0:
			return fmt.Errorf("nfrules: marks: %s is zero, which an unmarked packet also has", v.name)
		case seen[v.v] != "":
			return fmt.Errorf("nfrules: marks: %s and %s are both %#x", seen[v.v], v.name, v.v)
		}
		seen[v.v] = v.name
	}
	if c.Backend > BackendXtables {
		return fmt.Errorf("nfrules: unknown backend %d", c.Backend)
	}
	for _, p := range c.Untracked {
		if !p.IsValid() || p.Addr().Is4In6() {
			return fmt.Errorf("nfrules: untracked network %v: want an IPv4 or IPv6 prefix", p)
		}
	}
	return nil
}

// Action is what a rule does with a packet it matches.
type Action uint8

const (
	// Continue ends carbd's verdict on the packet and hands it on to the
	// host's own rules (xtables RETURN from carbd's chain; nft accept in
	// carbd's own table, which other tables still see). carbd never lets
	// through what the host's firewall would drop.
	Continue Action = iota + 1
	Queue           // NFQUEUE, without bypass: no listener means drop
	Drop
	Jump
)

// Rule is one rule of carbd's, the same for IPv4 and IPv6.
type Rule struct {
	Iface     string // match the input interface ("" any)
	MarkValue uint32 // with MarkMask != 0: match mark & MarkMask == MarkValue
	MarkMask  uint32
	// Conntrack matches every conntrack state. It never filters; it makes
	// netfilter track the namespace's traffic, and tracking brings the
	// defragmenter: fragments reach the queue reassembled.
	Conntrack bool
	Action    Action
	QueueNum  uint16 // Queue
	Target    string // Jump
}

// Chain is one of carbd's chains and the hook it is reached from.
type Chain struct {
	Name  string
	Hook  string // "forward" or "input"
	Rules []Rule
}

// Plan is the whole rule set of one sandbox interface, as data. Build
// makes it; Apply installs it.
type Plan struct {
	Backend Backend
	// Table is the nftables table (family inet) for BackendNFT, "filter"
	// for BackendXtables.
	Table string
	// BaseChains are, for BackendNFT, carbd's own base chains by hook;
	// for BackendXtables, the built-in chains the jumps go into.
	BaseChains map[string]string
	// Jumps send the interface's traffic from each hook to its chain.
	Jumps  []JumpRule
	Chains []Chain
	// Untrack is the table exempting the sandbox's traffic from
	// conntrack (Config.Untracked); nil: tracked. It is an nftables table
	// on either backend (raw priority needs no queue statement).
	Untrack *UntrackTable
}

// JumpRule sends traffic arriving on Iface at Hook into Chain.
type JumpRule struct {
	Hook, Iface, Chain string
}

// NFTPriority is the priority of carbd's nftables base chains: before
// the usual filter chains (0), so the host's accept cannot pre-empt it
// and its queue verdict runs first.
const NFTPriority = -10

// Build makes the plan for cfg on backend b (not BackendAuto). It is pure.
//
// Forward and input get one chain each; for every packet from the
// interface, in order: pass mark -> continue to the host's rules;
// (input only) link-local mark -> continue; queue mark -> NFQUEUE;
// anything else -> drop. So with no TC program attached nothing from the
// interface gets through, and with no queue listener undecided traffic
// is dropped.
func Build(cfg Config, b Backend) (*Plan, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := cfg.marks()
	p := &Plan{Backend: b}
	var fwd, in string
	switch b {
	case BackendXtables:
		p.Table = "filter"
		p.BaseChains = map[string]string{"forward": "FORWARD", "input": "INPUT"}
		fwd, in = "CARBD-"+cfg.SandboxID+"-F", "CARBD-"+cfg.SandboxID+"-I"
	case BackendNFT:
		p.Table = "carbd-" + cfg.SandboxID
		p.BaseChains = map[string]string{"forward": "forward", "input": "input"}
		fwd, in = "guest-forward", "guest-input"
	default:
		return nil, fmt.Errorf("nfrules: build: backend %s", b)
	}
	mark := func(v uint32, a Action) Rule { return Rule{MarkValue: v, MarkMask: m.Mask, Action: a} }
	queue := Rule{MarkValue: m.Queue, MarkMask: m.Mask, Conntrack: true, Action: Queue, QueueNum: cfg.QueueNum}
	p.Jumps = []JumpRule{
		{Hook: "forward", Iface: cfg.Iface, Chain: fwd},
		{Hook: "input", Iface: cfg.Iface, Chain: in},
	}
	p.Chains = []Chain{
		{Name: fwd, Hook: "forward", Rules: []Rule{mark(m.Pass, Continue), queue, {Action: Drop}}},
		{Name: in, Hook: "input", Rules: []Rule{mark(m.Pass, Continue), mark(m.LinkLocal, Continue), queue, {Action: Drop}}},
	}
	if len(cfg.Untracked) > 0 {
		p.Untrack = &UntrackTable{Name: untrackName(cfg.SandboxID), Iface: cfg.Iface}
		for _, n := range cfg.Untracked {
			p.Untrack.Networks = append(p.Untrack.Networks, n.Masked())
		}
	}
	return p, nil
}

func untrackName(id string) string { return "carbd-raw-" + id }

// String renders the plan in its backend's own syntax: an
// iptables-restore input (for a namespace without carbd's rules yet) or
// an nft script.
func (p *Plan) String() string {
	if p.Backend == BackendNFT {
		return p.NFTScript()
	}
	return p.XtablesRestore(nil, p.Jumps)
}

// ChainNames lists carbd's chains.
func (p *Plan) ChainNames() []string {
	names := make([]string, len(p.Chains))
	for i, c := range p.Chains {
		names[i] = c.Name
	}
	return names
}

// XtablesRestore renders the plan as input for `iptables-nft-restore
// --noflush` (the same for ip6tables-nft-restore). Declaring carbd's
// chains flushes them, so applying it again replaces their rules in one
// transaction. del are jumps to delete first (misplaced ones), ins the
// jumps to insert at position 1 of the built-in chains.
func (p *Plan) XtablesRestore(del, ins []JumpRule) string {
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, c := range p.Chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c.Name)
	}
	for _, j := range del {
		fmt.Fprintf(&b, "-D%s\n", p.JumpLine(j)[2:])
	}
	for _, j := range ins {
		fmt.Fprintf(&b, "-I %s 1 -i %s -j %s\n", p.BaseChains[j.Hook], j.Iface, j.Chain)
	}
	for _, c := range p.Chains {
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "-A %s %s\n", c.Name, strings.Join(xtRule(r), " "))
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// JumpLine is a jump as iptables-save prints it.
func (p *Plan) JumpLine(j JumpRule) string {
	return fmt.Sprintf("-A %s -i %s -j %s", p.BaseChains[j.Hook], j.Iface, j.Chain)
}

func xtRule(r Rule) []string {
	var a []string
	if r.Iface != "" {
		a = append(a, "-i", r.Iface)
	}
	if r.MarkMask != 0 {
		a = append(a, "-m", "mark", "--mark", fmt.Sprintf("%#x/%#x", r.MarkValue, r.MarkMask))
	}
	if r.Conntrack {
		// In the order iptables-save prints them, so Verify can compare.
		a = append(a, "-m", "conntrack", "--ctstate", "INVALID,NEW,RELATED,ESTABLISHED,UNTRACKED")
	}
	switch r.Action {
	case Continue:
		a = append(a, "-j", "RETURN")
	case Queue:
		a = append(a, "-j", "NFQUEUE", "--queue-num", fmt.Sprint(r.QueueNum))
	case Drop:
		a = append(a, "-j", "DROP")
	case Jump:
		a = append(a, "-j", r.Target)
	}
	return a
}

// NFTScript renders the plan as an nft script (`nft -f`). Apply builds
// the same rules through netlink; the script is for reading, diffing and
// doing by hand.
func (p *Plan) NFTScript() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", p.Table)
	for _, hook := range []string{"forward", "input"} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s priority %d; policy accept;\n", p.BaseChains[hook], hook, NFTPriority)
		for _, j := range p.Jumps {
			if j.Hook == hook {
				fmt.Fprintf(&b, "\t\tiifname %q counter jump %s\n", j.Iface, j.Chain)
			}
		}
		b.WriteString("\t}\n")
	}
	for _, c := range p.Chains {
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", nftRuleText(r))
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func nftRuleText(r Rule) string {
	var a []string
	if r.Iface != "" {
		a = append(a, fmt.Sprintf("iifname %q", r.Iface))
	}
	if r.MarkMask != 0 {
		a = append(a, fmt.Sprintf("meta mark & %#08x == %#08x", r.MarkMask, r.MarkValue))
	}
	if r.Conntrack {
		a = append(a, "ct state != 0")
	}
	a = append(a, "counter")
	switch r.Action {
	case Continue:
		a = append(a, "accept")
	case Queue:
		a = append(a, fmt.Sprintf("queue num %d", r.QueueNum))
	case Drop:
		a = append(a, "drop")
	case Jump:
		a = append(a, "jump "+r.Target)
	}
	return strings.Join(a, " ")
}

// XtablesPlannedRemoval is the restore input that deletes exactly what
// a fresh XtablesRestore installed: the plan's jumps, then its chains.
// It reads nothing, so it fails as a whole (one transaction, nothing
// changed) where the table differs from the plan: a jump missing, or a
// second one still referring to a chain (which then cannot be deleted).
// Remove then reads the table and removes what is there (XtablesRemoval).
func (p *Plan) XtablesPlannedRemoval() string {
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, j := range p.Jumps {
		fmt.Fprintf(&b, "-D%s\n", p.JumpLine(j)[2:])
	}
	for _, c := range p.Chains {
		fmt.Fprintf(&b, "-F %s\n", c.Name)
	}
	for _, c := range p.Chains {
		fmt.Fprintf(&b, "-X %s\n", c.Name)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// XtablesRemoval turns the output of `iptables-nft-save -t filter` into
// the restore input that deletes exactly carbd's chains and every rule
// jumping to them, in whichever chain, and nothing else. It returns ""
// when none are there.
func XtablesRemoval(save string, chains []string) string {
	ours := map[string]bool{}
	for _, c := range chains {
		ours[c] = true
	}
	var dels, flushes []string
	declared := map[string]bool{}
	inFilter := false
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			inFilter = line == "*filter"
			continue
		case !inFilter:
			continue
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if ours[name] {
				declared[name] = true
			}
		case strings.HasPrefix(line, "-A "):
			f := strings.Fields(line)
			if ours[f[1]] {
				continue // goes with the flush
			}
			for i := 2; i+1 < len(f); i++ {
				if (f[i] == "-j" || f[i] == "-g") && ours[f[i+1]] {
					dels = append(dels, "-D"+line[2:])
					break
				}
			}
		}
	}
	for _, c := range chains {
		if declared[c] {
			flushes = append(flushes, "-F "+c)
		}
	}
	if len(dels) == 0 && len(flushes) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, l := range dels {
		b.WriteString(l + "\n")
	}
	for _, l := range flushes {
		b.WriteString(l + "\n")
	}
	for _, c := range chains {
		if declared[c] {
			b.WriteString("-X " + c + "\n")
		}
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// JumpFixes compares the plan's jumps with `iptables-nft-save -t
// filter` output. A jump must be the first rule of its built-in chain:
// a rule before it could accept the guest's traffic before carbd sees
// it. It returns the jumps to delete (present but not first) and to
// insert at position 1 (not first, or absent).
func (p *Plan) JumpFixes(save string) (del, ins []JumpRule) {
	first := map[string]string{} // built-in chain -> its first rule
	present := map[string]bool{}
	inFilter := false
	for _, line := range strings.Split(save, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "*"):
			inFilter = line == "*filter"
		case inFilter && strings.HasPrefix(line, "-A "):
			present[line] = true
			chain := strings.Fields(line)[1]
			if _, ok := first[chain]; !ok {
				first[chain] = line
			}
		}
	}
	for _, j := range p.Jumps {
		line := p.JumpLine(j)
		if first[p.BaseChains[j.Hook]] == line {
			continue
		}
		if present[line] {
			del = append(del, j)
		}
		ins = append(ins, j)
	}
	return del, ins
}
