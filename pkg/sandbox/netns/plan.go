// Package netns is carbd's embedded default sandbox: the agent's command
// runs in new user, PID, mount, network, UTS and IPC namespaces. Inside it
// may be root; outside it is an unprivileged user. The host's filesystem
// is visible read-only, with empty tmpfs scratch space that is discarded
// at exit, so the working directory (bind-mounted from the staging merged
// view at its own path) is the only shared state it can change. Its only
// network path is a veth pair whose host side carries carbd's TC program
// and queue rules; egress is routed and masqueraded through the host, and
// DNS goes to a resolver carbd controls.
//
// # Requirements
//
// Linux, root on the host (veth, routes, netfilter), user namespaces.
// The plan (names, addresses) is pure and tests anywhere.
//
// # Testing
//
// Privileged tests start real sandboxes and check the isolation from
// inside (read-only host, writable working directory, PID 1, network
// only through the veth) with real tools.
package netns

import (
	"fmt"
	"net/netip"
	"regexp"
)

// MaxIndex bounds the sandbox index: each sandbox gets a /30 in
// 10.200.0.0/16 (16384 of them) and a /64 in fd00:cb::/48.
const MaxIndex = 1<<14 - 1

// Plan is the data that keeps several sandboxes on one host from
// colliding: interface names, addresses, and the NFQUEUE number.
type Plan struct {
	ID         string       // sandbox id: [a-z0-9-]{1,11}
	Index      int          // 0..MaxIndex, unique per live sandbox on the host
	HostIf     string       // host side of the veth pair ("cbh-<id>")
	GuestIf    string       // the sandbox's side (the netns backend makes it eth0 in the sandbox's namespace)
	HostAddr4  netip.Prefix // 10.200.x.y+1/30
	GuestAddr4 netip.Prefix // 10.200.x.y+2/30
	HostAddr6  netip.Prefix // fd00:cb:0:<index>::1/64
	GuestAddr6 netip.Prefix // fd00:cb:0:<index>::2/64
	Queue      uint16       // NFQUEUE number: QueueBase + Index
}

// QueueBase is the first NFQUEUE number carbd uses.
const QueueBase = 0xc000 // 49152: QueueBase+MaxIndex is 65535

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,10}$`)

// CheckID says whether id can name a sandbox: the host-wide names derived
// from it (interfaces, cgroup, netfilter chains, pins, state directories)
// must be valid and stay inside their directories.
func CheckID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("sandbox id %q must be 1-11 characters of a-z, 0-9 and '-', starting with a letter or digit", id)
	}
	return nil
}

// NewPlan returns the plan of sandbox id at index.
func NewPlan(id string, index int) (Plan, error) {
	if err := CheckID(id); err != nil {
		return Plan{}, fmt.Errorf("netns: %w", err)
	}
	if index < 0 || index > MaxIndex {
		return Plan{}, fmt.Errorf("netns: sandbox index %d out of range 0..%d", index, MaxIndex)
	}
	base := uint32(10)<<24 | uint32(200)<<16 | uint32(index)<<2
	a4 := func(n uint32) netip.Addr {
		v := base + n
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	a6 := func(n byte) netip.Addr {
		var b [16]byte
		b[0], b[1], b[2], b[3] = 0xfd, 0x00, 0x00, 0xcb
		b[6], b[7] = byte(index>>8), byte(index)
		b[15] = n
		return netip.AddrFrom16(b)
	}
	return Plan{
		ID:         id,
		Index:      index,
		HostIf:     "cbh-" + id,
		GuestIf:    "cbg-" + id,
		HostAddr4:  netip.PrefixFrom(a4(1), 30),
		GuestAddr4: netip.PrefixFrom(a4(2), 30),
		HostAddr6:  netip.PrefixFrom(a6(1), 64),
		GuestAddr6: netip.PrefixFrom(a6(2), 64),
		Queue:      uint16(QueueBase + index),
	}, nil
}

// Subnet4 and Subnet6 are the sandbox's networks, for masquerading.
func (p Plan) Subnet4() netip.Prefix { return p.GuestAddr4.Masked() }
func (p Plan) Subnet6() netip.Prefix { return p.GuestAddr6.Masked() }
