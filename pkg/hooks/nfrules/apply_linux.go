package nfrules

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/netnsx"
)

// The xtables tools, IPv4 then IPv6.
var xtFamilies = []struct{ save, restore string }{
	{"iptables-nft-save", "iptables-nft-restore"},
	{"ip6tables-nft-save", "ip6tables-nft-restore"},
}

// Detect picks the backend for the caller's network namespace: the
// native nftables queue statement where the kernel has it, else the
// xtables NFQUEUE target through iptables-nft.
func Detect() (Backend, error) { return DetectIn("") }

// DetectIn is Detect in the namespace at nsPath. It probes with a
// throwaway table that adds a queue rule and deletes itself in the same
// transaction, so nothing is left behind either way: ENOENT means the
// kernel lacks nft_queue.
func DetectIn(nsPath string) (Backend, error) {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return 0, err
	}
	defer done()
	t := &nftables.Table{Name: fmt.Sprintf("carbd-probe-%d", os.Getpid()), Family: nftables.TableFamilyINet}
	conn.AddTable(t)
	c := conn.AddChain(&nftables.Chain{Name: "probe", Table: t})
	conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: []expr.Any{&expr.Queue{Num: 0, Total: 1}}})
	conn.DelTable(t)
	err = conn.Flush()
	switch {
	case err == nil:
		return BackendNFT, nil
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP):
		for _, f := range xtFamilies {
			for _, tool := range []string{f.save, f.restore} {
				if _, err := exec.LookPath(tool); err != nil {
					return 0, fmt.Errorf("nfrules: the kernel has no nftables queue statement and %s is missing: %w", tool, err)
				}
			}
		}
		return BackendXtables, nil
	default:
		return 0, fmt.Errorf("nfrules: probe nftables queue: %w", err)
	}
}

// Apply installs carbd's rules for cfg, or replaces them in place if
// they are there: carbd's chains are rewritten in one transaction per
// family, with no moment where the interface's traffic is not governed.
// Jumps that are missing or no longer first are (re)inserted at position
// 1. It returns the backend used. Calling it again repairs the rules
// (after a firewall reload, say).
func Apply(cfg Config) (Backend, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	b := cfg.Backend
	if b == BackendAuto {
		var err error
		if b, err = DetectIn(cfg.NetNS); err != nil {
			return 0, err
		}
	}
	p, err := Build(cfg, b)
	if err != nil {
		return 0, err
	}
	switch b {
	case BackendNFT:
		err = applyNFT(p, cfg.NetNS)
	case BackendXtables:
		err = applyXtables(p, cfg.NetNS)
	}
	if err != nil {
		return 0, err
	}
	// After the rules, whose conntrack match keeps the defragmenter
	// registered; a configuration without Untracked removes the table a
	// previous Apply made.
	if p.Untrack != nil {
		err = applyUntrack(p.Untrack, cfg.NetNS)
	} else {
		err = removeUntrack(untrackName(cfg.SandboxID), cfg.NetNS)
	}
	if err != nil {
		return 0, err
	}
	return b, nil
}

// Remove deletes exactly carbd's chains (or table) and the jumps to them
// for cfg.SandboxID, in both backends unless cfg.Backend names one. It is
// the clean stop; removing what is not there is not an error. After it,
// the interface's traffic is no longer governed by carbd: stop the guest
// first.
func Remove(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var errs []error
	if err := removeUntrack(untrackName(cfg.SandboxID), cfg.NetNS); err != nil {
		errs = append(errs, err)
	}
	if cfg.Backend != BackendXtables {
		p, _ := Build(cfg, BackendNFT)
		if err := removeNFT(p, cfg.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.Backend != BackendNFT {
		p, _ := Build(cfg, BackendXtables)
		if err := removeXtables(p, cfg.NetNS, cfg.Backend == BackendXtables); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Verify checks that carbd's rules for cfg are in place on backend b:
// chains present with the planned rules and, for xtables, the jumps first
// in FORWARD and INPUT; with Untracked, the raw table's chains too.
func Verify(cfg Config, b Backend) error {
	p, err := Build(cfg, b)
	if err != nil {
		return err
	}
	if p.Untrack != nil {
		if err := verifyUntrack(p.Untrack, cfg.NetNS); err != nil {
			return err
		}
	}
	switch b {
	case BackendXtables:
		for _, f := range xtFamilies {
			save, err := run(cfg.NetNS, "", f.save, "-t", "filter")
			if err != nil {
				return err
			}
			if _, ins := p.JumpFixes(save); len(ins) > 0 {
				return fmt.Errorf("nfrules: %s: jump to %s is not the first rule of %s", f.save, ins[0].Chain, p.BaseChains[ins[0].Hook])
			}
			for _, c := range p.Chains {
				for _, r := range c.Rules {
					want := fmt.Sprintf("-A %s %s", c.Name, strings.Join(xtRule(r), " "))
					if !strings.Contains(save, want+"\n") {
						return fmt.Errorf("nfrules: %s: missing rule %q", f.save, want)
					}
				}
			}
		}
		return nil
	case BackendNFT:
		conn, done, err := nftConn(cfg.NetNS)
		if err != nil {
			return err
		}
		defer done()
		t, err := conn.ListTableOfFamily(p.Table, nftables.TableFamilyINet)
		if err != nil {
			return fmt.Errorf("nfrules: table inet %s: %w", p.Table, err)
		}
		for _, name := range append(p.ChainNames(), p.BaseChains["forward"], p.BaseChains["input"]) {
			c, err := conn.ListChain(t, name)
			if err != nil {
				return fmt.Errorf("nfrules: chain %s: %w", name, err)
			}
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return fmt.Errorf("nfrules: rules of %s: %w", name, err)
			}
			if len(rules) == 0 {
				return fmt.Errorf("nfrules: chain %s is empty", name)
			}
		}
		return nil
	}
	return fmt.Errorf("nfrules: verify: backend %s", b)
}

// applyXtables installs the plan for IPv4 and IPv6 at once. Where none of
// carbd's chains exist (a fresh start: jumps to a missing chain cannot
// exist either), the rules go in with one iptables-nft-restore per
// family and no save: the filter table, which holds every other
// sandbox's chains, is never dumped. Where they exist, the table is read
// to put misplaced jumps back first (a repair).
func applyXtables(p *Plan, nsPath string) error {
	return eachXtFamily(func(i int) error { return applyXtablesFamily(p, nsPath, i) })
}

// eachXtFamily runs fn for IPv4 and IPv6 at once.
func eachXtFamily(fn func(i int) error) error {
	errs := make([]error, len(xtFamilies))
	var wg sync.WaitGroup
	for i := range xtFamilies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func applyXtablesFamily(p *Plan, nsPath string, i int) error {
	f := xtFamilies[i]
	var present bool
	err := inNetNS(nsPath, func() (err error) {
		present, err = xtChainsPresent(xtNFTFamilies[i], p.ChainNames())
		return err
	})
	if err == nil && !present {
		_, err = run(nsPath, p.XtablesRestore(nil, p.Jumps), f.restore, "-w", "--noflush")
		return err
	}
	save, err := run(nsPath, "", f.save, "-t", "filter")
	if err != nil {
		return err
	}
	del, ins := p.JumpFixes(save)
	_, err = run(nsPath, p.XtablesRestore(del, ins), f.restore, "-w", "--noflush")
	return err
}

// removeXtables deletes carbd's chains and the jumps to them, for IPv4
// and IPv6 at once. Without the tools, there is nothing it could have
// installed; unless strict. A family where none of carbd's chains exist
// (asked by name, see xtChainsPresent) has nothing to remove and its
// table is not read. Where they exist, the planned removal (the plan's
// jumps and chains, XtablesPlannedRemoval) is tried first, again without
// reading the table; only if the table differs from the plan (it then
// fails as a whole) is the table read and what is there removed.
func removeXtables(p *Plan, nsPath string, strict bool) error {
	return eachXtFamily(func(i int) error { return removeXtablesFamily(p, nsPath, strict, i) })
}

func removeXtablesFamily(p *Plan, nsPath string, strict bool, i int) error {
	f := xtFamilies[i]
	if _, err := exec.LookPath(f.save); err != nil {
		if strict {
			return fmt.Errorf("nfrules: %w", err)
		}
		return nil
	}
	var present bool
	err := inNetNS(nsPath, func() (err error) {
		present, err = xtChainsPresent(xtNFTFamilies[i], p.ChainNames())
		return err
	})
	if err == nil {
		if !present {
			return nil
		}
		if _, err := run(nsPath, p.XtablesPlannedRemoval(), f.restore, "-w", "--noflush"); err == nil {
			return nil
		}
	}
	save, err := run(nsPath, "", f.save, "-t", "filter")
	if err != nil {
		return err
	}
	if in := XtablesRemoval(save, p.ChainNames()); in != "" {
		if _, err := run(nsPath, in, f.restore, "-w", "--noflush"); err != nil {
			return err
		}
	}
	return nil
}

// run runs an xtables tool in the namespace at nsPath with stdin.
func run(nsPath, stdin, name string, args ...string) (string, error) {
	var out []byte
	err := inNetNS(nsPath, func() error {
		cmd := exec.Command(name, args...)
		cmd.Stdin = strings.NewReader(stdin)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		if err != nil {
			return fmt.Errorf("nfrules: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	return string(out), err
}

// inNetNS runs fn (which may fork) inside the namespace at path; "" runs it
// in place. The thread never returns to the pool in the wrong namespace
// (see internal/netnsx).
func inNetNS(path string, fn func() error) error {
	if err := netnsx.Do(path, fn); err != nil {
		return fmt.Errorf("nfrules: %w", err)
	}
	return nil
}

// nftConn opens an nftables connection in the namespace at nsPath.
func nftConn(nsPath string) (*nftables.Conn, func(), error) {
	if nsPath == "" {
		c, err := nftables.New()
		if err != nil {
			return nil, nil, fmt.Errorf("nfrules: nftables: %w", err)
		}
		return c, func() {}, nil
	}
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("nfrules: open netns %s: %w", nsPath, err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("nfrules: nftables in %s: %w", nsPath, err)
	}
	return c, func() { unix.Close(fd) }, nil
}

var nftHooks = map[string]*nftables.ChainHook{"forward": nftables.ChainHookForward, "input": nftables.ChainHookInput}

// applyNFT builds the plan's table in one netlink transaction: the table
// is flushed and refilled atomically when it exists.
func applyNFT(p *Plan, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	t := conn.AddTable(&nftables.Table{Name: p.Table, Family: nftables.TableFamilyINet})
	conn.FlushTable(t)
	accept := nftables.ChainPolicyAccept
	base := map[string]*nftables.Chain{}
	for _, hook := range []string{"forward", "input"} {
		base[hook] = conn.AddChain(&nftables.Chain{
			Name: p.BaseChains[hook], Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftHooks[hook], Priority: nftables.ChainPriorityRef(NFTPriority), Policy: &accept,
		})
	}
	chains := map[string]*nftables.Chain{}
	for _, c := range p.Chains {
		chains[c.Name] = conn.AddChain(&nftables.Chain{Name: c.Name, Table: t})
	}
	for _, j := range p.Jumps {
		conn.AddRule(&nftables.Rule{Table: t, Chain: base[j.Hook],
			Exprs: NFTExprs(Rule{Iface: j.Iface, Action: Jump, Target: j.Chain})})
	}
	for _, c := range p.Chains {
		for _, r := range c.Rules {
			conn.AddRule(&nftables.Rule{Table: t, Chain: chains[c.Name], Exprs: NFTExprs(r)})
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nfrules: install table inet %s: %w", p.Table, err)
	}
	return nil
}

func removeNFT(p *Plan, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	t, err := conn.ListTableOfFamily(p.Table, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("nfrules: look up table inet %s: %w", p.Table, err)
	}
	conn.DelTable(t)
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nfrules: delete table inet %s: %w", p.Table, err)
	}
	return nil
}

// NFTExprs compiles a rule to nftables expressions (what the nft script
// line of NFTScript means).
func NFTExprs(r Rule) []expr.Any {
	var e []expr.Any
	if r.Iface != "" {
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, r.Iface)
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name})
	}
	if r.MarkMask != 0 {
		e = append(e,
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(r.MarkMask), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.MarkValue)})
	}
	if r.Conntrack {
		e = append(e,
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)})
	}
	e = append(e, &expr.Counter{})
	switch r.Action {
	case Continue:
		e = append(e, &expr.Verdict{Kind: expr.VerdictAccept})
	case Queue:
		// No bypass flag: with no listener the kernel drops.
		e = append(e, &expr.Queue{Num: r.QueueNum, Total: 1})
	case Drop:
		e = append(e, &expr.Verdict{Kind: expr.VerdictDrop})
	case Jump:
		e = append(e, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target})
	}
	return e
}
