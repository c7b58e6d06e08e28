package nfrules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/netnsx"
)

// ApplyNAT installs the masquerading plan of cfg and returns its undo.
//
// The tables are carbd's own (carbd-nat-<id>, families ip and ip6),
// replaced atomically when a crashed carbd left them. Forwarding sysctls
// are shared by every sandbox of the namespace, so they are reference
// counted in cfg.StateDir: the first sandbox that needs a sysctl records
// the value it found and sets it only if it differs; the last one to end
// puts back the recorded value, unless someone else changed the sysctl
// in between (then it is left as found). Holders that died without
// releasing are pruned by pid; the value the first of them found is kept
// for the next carbd to restore. The undo removes the tables and releases
// the sysctls.
func ApplyNAT(cfg NATConfig) (undo func() error, err error) {
	p, err := BuildNAT(cfg)
	if err != nil {
		return nil, err
	}
	if err := applyNATTables(p, cfg.NetNS); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = removeNATTables(p, cfg.NetNS)
		}
	}()
	release, err := holdSysctls(cfg.StateDir, cfg.NetNS, cfg.SandboxID, p.Sysctls)
	if err != nil {
		return nil, err
	}
	return func() error {
		return errors.Join(removeNATTables(p, cfg.NetNS), release())
	}, nil
}

// RemoveNAT removes the masquerading tables of cfg (after a crash); it
// does not touch the sysctls, whose holders are pruned by pid.
func RemoveNAT(cfg NATConfig) error {
	p, err := BuildNAT(NATConfig{SandboxID: cfg.SandboxID, Iface: cfg.Iface, Subnets: cfg.Subnets, NetNS: cfg.NetNS})
	if err != nil {
		return err
	}
	return removeNATTables(p, cfg.NetNS)
}

// ReleaseSysctls gives back what holder (a sandbox id whose carbd died)
// holds of the forwarding sysctls under stateDir in the caller's network
// namespace, as ApplyNAT's undo would have: the last holder out puts
// back what the first one found (carbd cleanup).
func ReleaseSysctls(stateDir, holder string) error {
	nsID, err := netnsID("")
	if err != nil {
		return err
	}
	var errs []error
	for _, key := range []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"} {
		h := sysctlHolder{dir: filepath.Join(stateDir, nsID, key), s: Sysctl{Key: key, Value: "1"}, holder: holder}
		if _, err := os.Lstat(filepath.Join(h.dir, "holders", holder)); err == nil {
			errs = append(errs, h.release())
		}
	}
	return errors.Join(errs...)
}

func natFamily(f string) nftables.TableFamily {
	if f == "ip6" {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// NATExprs compiles a table's masquerade rule (its line in NFTScript).
func NATExprs(t NATTable) []expr.Any {
	off, n := uint32(12), uint32(4)
	if t.Family == "ip6" {
		off, n = 8, 16
	}
	mask := make([]byte, n)
	for i := 0; i < t.Subnet.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, t.NotIface)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: t.Subnet.Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: name},
		&expr.Masq{},
	}
}

// RedirectExprs compiles one redirect rule of a table's prerouting chain
// (its line in NFTScript).
func RedirectExprs(t NATTable, port uint16) []expr.Any {
	name := make([]byte, unix.IFNAMSIZ)
	copy(name, t.NotIface)
	be := func(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be(port)},
		&expr.Immediate{Register: 1, Data: be(t.RedirectTo)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// applyNATTables installs every table in one netlink transaction; an
// existing table of the same name is flushed and refilled.
func applyNATTables(p *NATPlan, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	for _, nt := range p.Tables {
		t := conn.AddTable(&nftables.Table{Name: nt.Name, Family: natFamily(nt.Family)})
		conn.FlushTable(t)
		ch := conn.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: NATExprs(nt)})
		if len(nt.Redirects) > 0 {
			pre := conn.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
				Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
			for _, port := range nt.Redirects {
				conn.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: RedirectExprs(nt, port)})
			}
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nfrules: install nat tables %s: %w", p.Tables[0].Name, err)
	}
	return nil
}

func removeNATTables(p *NATPlan, nsPath string) error {
	conn, done, err := nftConn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	n := 0
	for _, nt := range p.Tables {
		t, err := conn.ListTableOfFamily(nt.Name, natFamily(nt.Family))
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return fmt.Errorf("nfrules: look up table %s %s: %w", nt.Family, nt.Name, err)
		}
		conn.DelTable(t)
		n++
	}
	if n == 0 {
		return nil
	}
	if err := conn.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nfrules: delete nat tables %s: %w", p.Tables[0].Name, err)
	}
	return nil
}

// holdSysctls takes holder's reference on each sysctl in the namespace at
// nsPath and returns the release.
func holdSysctls(stateDir, nsPath, holder string, ss []Sysctl) (func() error, error) {
	if len(ss) == 0 {
		return func() error { return nil }, nil
	}
	var release []func() error
	undo := func() error {
		var errs []error
		for i := len(release) - 1; i >= 0; i-- {
			errs = append(errs, release[i]())
		}
		return errors.Join(errs...)
	}
	nsID, err := netnsID(nsPath)
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		h := sysctlHolder{dir: filepath.Join(stateDir, nsID, s.Key), ns: nsPath, s: s, holder: holder}
		if err := h.hold(); err != nil {
			return nil, errors.Join(err, undo())
		}
		release = append(release, h.release)
	}
	return undo, nil
}

// netnsID names the namespace at nsPath (the caller's when empty) by
// device and inode.
func netnsID(nsPath string) (string, error) {
	p := nsPath
	if p == "" {
		p = "/proc/thread-self/ns/net"
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", fmt.Errorf("nfrules: netns %s: %w", p, err)
	}
	return fmt.Sprintf("netns-%d-%d", st.Dev, st.Ino), nil
}

// sysctlHolder is one sandbox's reference on one sysctl. Its directory
// holds "lock" (flock), "found" (the value before the first holder
// changed it; absent when it was already as wanted) and holders/<id>
// (the holder's pid).
type sysctlHolder struct {
	dir, ns, holder string
	s               Sysctl
}

func (h sysctlHolder) locked(fn func() error) error {
	if err := os.MkdirAll(filepath.Join(h.dir, "holders"), 0o700); err != nil {
		return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
	}
	f, err := os.OpenFile(filepath.Join(h.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("nfrules: sysctl %s: lock: %w", h.s.Key, err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return fn()
}

// live lists the holders whose process is alive, removing the others.
func (h sysctlHolder) live() ([]string, error) {
	dir := filepath.Join(h.dir, "holders")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
	}
	var ids []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil || pid <= 0 || unix.Kill(pid, 0) == unix.ESRCH {
			_ = os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		ids = append(ids, e.Name())
	}
	return ids, nil
}

func (h sysctlHolder) read() (string, error) {
	var v string
	err := netnsx.Do(h.ns, func() error {
		b, err := os.ReadFile(h.s.Path())
		v = strings.TrimSpace(string(b))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("nfrules: read sysctl %s: %w", h.s.Key, err)
	}
	return v, nil
}

func (h sysctlHolder) write(v string) error {
	err := netnsx.Do(h.ns, func() error { return os.WriteFile(h.s.Path(), []byte(v), 0o644) })
	if err != nil {
		return fmt.Errorf("nfrules: set sysctl %s=%s: %w", h.s.Key, v, err)
	}
	return nil
}

func (h sysctlHolder) hold() error {
	return h.locked(func() error {
		cur, err := h.read()
		if err != nil {
			return err
		}
		if cur == h.s.Value {
			// As wanted already: whoever holds it, and whatever a dead
			// holder found, there is nothing to record but this holder.
			// (No scan of the holders under the host-wide lock: with
			// many sandboxes starting, it serialised their starts;
			// release prunes the dead ones.)
			return os.WriteFile(filepath.Join(h.dir, "holders", h.holder), []byte(strconv.Itoa(os.Getpid())), 0o600)
		}
		ids, err := h.live()
		if err != nil {
			return err
		}
		found := filepath.Join(h.dir, "found")
		if len(ids) == 0 {
			// The first holder: what is there now is what to restore,
			// unless a carbd that died left it as carbd wants it: then
			// what that one found still is.
			_, ferr := os.Stat(found)
			if ferr != nil || cur != h.s.Value {
				if err := os.Remove(found); err != nil && !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
				}
				if cur != h.s.Value {
					if err := os.WriteFile(found, []byte(cur), 0o600); err != nil {
						return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
					}
				}
			}
		}
		if cur != h.s.Value {
			if err := h.write(h.s.Value); err != nil {
				return err
			}
		}
		return os.WriteFile(filepath.Join(h.dir, "holders", h.holder), []byte(strconv.Itoa(os.Getpid())), 0o600)
	})
}

func (h sysctlHolder) release() error {
	return h.locked(func() error {
		if err := os.Remove(filepath.Join(h.dir, "holders", h.holder)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
		}
		ids, err := h.live()
		if err != nil || len(ids) > 0 {
			return err
		}
		found := filepath.Join(h.dir, "found")
		b, err := os.ReadFile(found)
		if errors.Is(err, os.ErrNotExist) {
			return nil // it was as wanted before carbd
		}
		if err != nil {
			return fmt.Errorf("nfrules: sysctl %s: %w", h.s.Key, err)
		}
		cur, err := h.read()
		if err != nil {
			return err
		}
		if cur == h.s.Value {
			if err := h.write(string(b)); err != nil {
				return err
			}
		}
		return os.Remove(found)
	})
}
