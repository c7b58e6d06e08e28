package tcx

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Marks the program writes into skb->mark; netfilter (pkg/hooks/nfrules)
// matches them under MarkMask. The other bits of the mark are left as they
// were. They mirror bpf/include/carbd/tc.h.
const (
	MarkMask      uint32 = 0xffff0000
	MarkPass      uint32 = 0xcb010000 // decided: netfilter lets it through
	MarkQueue     uint32 = 0xcb020000 // undecided: netfilter queues it
	MarkLinkLocal uint32 = 0xcb030000 // ARP, ND, MLD: accepted by the host, never forwarded
)

// Return values of the program (TC_ACT_* and TCX_* agree on them).
const (
	actOK   = 0
	actShot = 2
)

// IP protocol numbers the fast path knows.
const (
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58
)

// FlowKey is a flow as the guest sends it: Src is the guest's address.
//
// For TCP and UDP the ports are the ports. ICMP and ICMPv6 have none, so
// DstPort holds type<<8 | code and SrcPort the echo identifier for echo
// requests and replies (0 otherwise): see ICMPEchoKey. For any other
// protocol both ports are 0. IPv4 addresses given in their IPv4-mapped
// IPv6 form are unmapped.
type FlowKey struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// ICMPEchoKey returns the key of the echo requests from src to dst with the
// given identifier (ICMP type 8 for IPv4, ICMPv6 type 128 for IPv6).
func ICMPEchoKey(src, dst netip.Addr, id uint16) FlowKey {
	k := FlowKey{Src: src.Unmap(), Dst: dst.Unmap(), SrcPort: id, Proto: ProtoICMP, DstPort: 8 << 8}
	if k.Src.Is6() {
		k.Proto, k.DstPort = ProtoICMPv6, 128<<8
	}
	return k
}

func (k FlowKey) String() string {
	return fmt.Sprintf("%s %s -> %s", protoName(k.Proto),
		netip.AddrPortFrom(k.Src, k.SrcPort), netip.AddrPortFrom(k.Dst, k.DstPort))
}

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoICMP:
		return "icmp"
	case ProtoICMPv6:
		return "icmpv6"
	}
	return fmt.Sprintf("proto-%d", p)
}

// Validate reports whether the key names one flow: both addresses valid
// and of the same family.
func (k FlowKey) Validate() error {
	s, d := k.Src.Unmap(), k.Dst.Unmap()
	switch {
	case !s.IsValid() || !d.IsValid():
		return fmt.Errorf("tcx: flow key %v: missing address", k)
	case s.Is4() != d.Is4():
		return fmt.Errorf("tcx: flow key %v: addresses of different families", k)
	case s.Zone() != "" || d.Zone() != "":
		return fmt.Errorf("tcx: flow key %v: addresses with a zone", k)
	}
	return nil
}

// RawFlowKey is struct flow_key of bpf/include/carbd/tc.h, the key of the
// flows and verdicts maps.
type RawFlowKey struct {
	Family  uint8
	Proto   uint8
	SrcPort uint16
	DstPort uint16
	Pad     uint16
	Src     [16]byte
	Dst     [16]byte
}

// Raw converts k to the layout of the BPF maps.
func (k FlowKey) Raw() (RawFlowKey, error) {
	if err := k.Validate(); err != nil {
		return RawFlowKey{}, err
	}
	r := RawFlowKey{Proto: k.Proto, SrcPort: k.SrcPort, DstPort: k.DstPort}
	s, d := k.Src.Unmap(), k.Dst.Unmap()
	if s.Is4() {
		r.Family = 4
		a, b := s.As4(), d.As4()
		copy(r.Src[:], a[:])
		copy(r.Dst[:], b[:])
	} else {
		r.Family = 6
		r.Src, r.Dst = s.As16(), d.As16()
	}
	return r, nil
}

// FlowKey converts a map key back. It fails on a family other than 4 or 6.
func (r RawFlowKey) FlowKey() (FlowKey, error) {
	k := FlowKey{Proto: r.Proto, SrcPort: r.SrcPort, DstPort: r.DstPort}
	switch r.Family {
	case 4:
		k.Src = netip.AddrFrom4([4]byte(r.Src[:4]))
		k.Dst = netip.AddrFrom4([4]byte(r.Dst[:4]))
	case 6:
		k.Src = netip.AddrFrom16(r.Src)
		k.Dst = netip.AddrFrom16(r.Dst)
	default:
		return FlowKey{}, fmt.Errorf("tcx: flow key with family %d", r.Family)
	}
	return k, nil
}

// Action is what userspace decided for a flow.
type Action uint8

const (
	Undecided Action = 0 // no verdict: every packet is queued
	Released  Action = 1 // passes on the fast path (TCP: within its byte range)
	Refused   Action = 2 // dropped in the program
)

func (a Action) String() string {
	switch a {
	case Undecided:
		return "undecided"
	case Released:
		return "released"
	case Refused:
		return "refused"
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

const (
	vfTCPRange = 1 // CARBD_VF_TCP_RANGE
	vfReadGen  = 2 // CARBD_VF_READ_GEN
)

// Verdict is a flow's entry in the verdict map.
type Verdict struct {
	Action Action
	// TCPRange: only the client bytes before SeqEnd pass; later bytes are
	// queued. False for a whole-flow release (ReleaseFlow) and for other
	// protocols.
	TCPRange bool
	SeqEnd   uint32
	// ReadGen: a release to the end of the flow decided when the read
	// generation was Gen (ReleaseFlowAt). A packet with data passes only
	// while the generation is still Gen; after the agent read again it
	// is queued.
	ReadGen bool
	Gen     uint64
}

// rawVerdict is struct verdict.
type rawVerdict struct {
	Action uint8
	Flags  uint8
	Pad    uint16
	SeqEnd uint32
	Gen    uint64
}

func (v Verdict) raw() rawVerdict {
	r := rawVerdict{Action: uint8(v.Action), SeqEnd: v.SeqEnd}
	if v.TCPRange {
		r.Flags |= vfTCPRange
	}
	if v.ReadGen {
		r.Flags |= vfReadGen
		r.Gen = v.Gen
	}
	return r
}

func (r rawVerdict) verdict() Verdict {
	v := Verdict{Action: Action(r.Action), TCPRange: r.Flags&vfTCPRange != 0, SeqEnd: r.SeqEnd}
	if r.Flags&vfReadGen != 0 {
		v.ReadGen, v.Gen = true, r.Gen
	}
	return v
}

// rawFlowStats is struct flow_stats.
type rawFlowStats struct {
	Packets uint64
	Bytes   uint64
	FirstNs uint64
	LastNs  uint64
}

// rawConfig is struct config.
type rawConfig struct {
	AliveUntilNs uint64
	Ifindex      uint32
	AttachMode   uint32
}

// rawCounter is struct counter.
type rawCounter struct {
	Packets uint64
	Bytes   uint64
}

// Flow is one entry of the flow table with its verdict.
type Flow struct {
	Key     FlowKey
	Packets uint64
	Bytes   uint64 // Ethernet header included
	// FirstSeen and LastSeen are converted from the kernel's monotonic
	// clock at the time Flows was called.
	FirstSeen, LastSeen time.Time
	Verdict             Verdict
}

// Reason is why the program passed, queued or dropped a packet; each packet
// is counted under exactly one.
type Reason uint32

// The reasons, in the order of enum counter_reason in tc.h.
const (
	PassFast         Reason = iota // a released flow on the fast path
	PassLinkLocal                  // ARP, neighbour discovery, MLD
	QueueUndecided                 // no verdict yet (or a SYN on a byte-range flow)
	QueueBeyondRange               // TCP payload past the released byte range
	QueueDNS                       // UDP to port 53
	QueueFragment                  // an IP fragment
	QueueIPOptions                 // IPv4 options or an IPv6 routing header
	QueueOpaque                    // an IP protocol the fast path does not parse
	QueueRead                      // released to its end, and the agent read since (ReleaseFlowAt)
	DropRefused                    // the flow is refused
	DropNoDaemon                   // the liveness lease expired
	DropMalformed                  // truncated or inconsistent headers
	DropVLAN                       // an 802.1Q / 802.1ad tag
	DropNonIP                      // an ethertype other than IPv4, IPv6, ARP
	NumReasons
)

var reasonNames = [NumReasons]string{
	PassFast: "pass-fast", PassLinkLocal: "pass-link-local",
	QueueUndecided: "queue-undecided", QueueBeyondRange: "queue-beyond-range",
	QueueDNS: "queue-dns", QueueFragment: "queue-fragment",
	QueueIPOptions: "queue-ip-options", QueueOpaque: "queue-opaque", QueueRead: "queue-read",
	DropRefused: "drop-refused", DropNoDaemon: "drop-no-daemon",
	DropMalformed: "drop-malformed", DropVLAN: "drop-vlan", DropNonIP: "drop-non-ip",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint32(r))
}

// Outcome is what happened to a packet.
type Outcome uint8

const (
	Passed Outcome = iota + 1
	Queued
	Dropped
)

func (o Outcome) String() string {
	switch o {
	case Passed:
		return "passed"
	case Queued:
		return "queued"
	case Dropped:
		return "dropped"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// Outcome says whether packets counted under r passed, were queued or
// were dropped.
func (r Reason) Outcome() Outcome {
	switch {
	case r <= PassLinkLocal:
		return Passed
	case r <= QueueRead:
		return Queued
	case r < NumReasons:
		return Dropped
	}
	return 0
}

// Count is a number of packets and their bytes (Ethernet header included).
type Count struct {
	Packets, Bytes uint64
}

func (c Count) add(o Count) Count { return Count{c.Packets + o.Packets, c.Bytes + o.Bytes} }

// Counters are the program's global counters summed over CPUs, indexed by
// Reason.
type Counters [NumReasons]Count

// Total sums the counters of every reason with the given outcome.
func (c Counters) Total(o Outcome) Count {
	var t Count
	for r := Reason(0); r < NumReasons; r++ {
		if r.Outcome() == o {
			t = t.add(c[r])
		}
	}
	return t
}

// Sub returns c minus an earlier reading.
func (c Counters) Sub(earlier Counters) Counters {
	var d Counters
	for i := range c {
		d[i] = Count{c[i].Packets - earlier[i].Packets, c[i].Bytes - earlier[i].Bytes}
	}
	return d
}

// Mode is how the program is attached.
type Mode uint32

const (
	ModeAuto   Mode = 0 // TCX where the kernel has it, else Legacy
	ModeTCX    Mode = 1 // a TCX link (Linux 6.6+), pinned
	ModeLegacy Mode = 2 // a clsact qdisc with a direct-action cls_bpf filter
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeTCX:
		return "tcx"
	case ModeLegacy:
		return "tc-legacy"
	}
	return fmt.Sprintf("mode(%d)", uint32(m))
}

// Sentinel errors.
var (
	// ErrExists: Attach found the sandbox's pin directory in use. Adopt it,
	// or Close the previous datapath.
	ErrExists = errors.New("tcx: sandbox already has a pinned datapath")
	// ErrNotPinned: Adopt found nothing to adopt.
	ErrNotPinned = errors.New("tcx: no pinned datapath")
	// ErrClosed: the Datapath was closed or left.
	ErrClosed = errors.New("tcx: datapath closed")
)

// validSandboxID reports whether id can name a pin directory and, in
// pkg/hooks/nfrules, netfilter chains: 1 to 20 of [A-Za-z0-9_-].
func validSandboxID(id string) error {
	if id == "" || len(id) > 20 {
		return fmt.Errorf("tcx: sandbox id %q: want 1 to 20 characters", id)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("tcx: sandbox id %q: character %q not in [A-Za-z0-9_-]", id, c)
		}
	}
	return nil
}
