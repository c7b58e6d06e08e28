package daemon

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/nfq"
)

// carbd's own resolver traffic is never asked about. The guest's kernel
// answers a datagram of carbd's resolver that reaches a closed port (a
// stub resolver that gave up on the query before its answer came) with
// an ICMP error addressed to the resolver. Such an error is no effect of
// the agent: it goes to carbd itself (the host's INPUT path, nowhere
// else), and what it carries beyond its own header is the quoted start
// of carbd's datagram. It is released by policy without the oracle
// (CodeOwnICMP) when the quoted packet is that datagram: UDP from the
// resolver's address and port 53 to the guest's address that sent the
// error, carrying a DNS response (QR set). Any other ICMP is decided as
// before.

// CodeOwnICMP is the reason code of an ICMP error about carbd's own
// resolver datagram, released without a decision of the engine.
const CodeOwnICMP = "carbd-own-icmp"

// ownICMPError reports whether the effect is an ICMP error the guest
// sends to carbd's resolver at resolver about a datagram that resolver
// sent it.
func ownICMPError(m nfq.Meta, icmpBody []byte, resolver netip.AddrPort) bool {
	k := m.Flow
	if !m.Local || k.Dst.Unmap() != resolver.Addr() {
		return false
	}
	typ := uint8(k.DstPort >> 8) // the fast path's key of an ICMP packet: type<<8 | code
	var quoted []byte
	switch {
	case k.Proto == 1 && k.Src.Unmap().Is4() && (typ == 3 || typ == 11 || typ == 12):
		quoted = icmpBody // after the 8-byte ICMP header: the quoted IPv4 header
	case k.Proto == 58 && k.Src.Is6() && typ >= 1 && typ <= 4 && len(icmpBody) >= 4:
		quoted = icmpBody[4:] // after the unused (or MTU, pointer) word
	default:
		return false
	}
	src, dst, udp, ok := quotedUDP(quoted)
	if !ok || src != resolver.Addr() || dst != k.Src.Unmap() || len(udp) < 8 {
		return false
	}
	if binary.BigEndian.Uint16(udp[0:2]) != resolver.Port() {
		return false
	}
	dns := udp[8:]
	// The quote is at least the UDP header; where it goes on, it must
	// be a DNS response.
	return len(dns) < 3 || dns[2]&0x80 != 0
}

// quotedUDP parses the packet an ICMP error quotes: an IPv4 or IPv6
// header (without extension headers) and the start of a UDP datagram.
func quotedUDP(b []byte) (src, dst netip.Addr, udp []byte, ok bool) {
	if len(b) < 1 {
		return
	}
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl || b[9] != 17 {
			return
		}
		src = netip.AddrFrom4([4]byte(b[12:16]))
		dst = netip.AddrFrom4([4]byte(b[16:20]))
		return src, dst, b[ihl:], true
	case 6:
		if len(b) < 40 || b[6] != 17 {
			return
		}
		src = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		dst = netip.AddrFrom16([16]byte(b[24:40])).Unmap()
		return src, dst, b[40:], true
	}
	return
}

// ownICMP releases an ICMP error about carbd's own resolver datagram,
// and writes its audit record, if the effect is one.
func (nc *netChannel) ownICMP(m nfq.Meta, ev *decide.Event) (nfq.Outcome, bool) {
	if m.Kind != netparse.KindICMPOther {
		return nfq.Outcome{}, false
	}
	resolver := netip.AddrPortFrom(nc.plan.HostAddr4.Addr(), 53)
	if m.Flow.Dst.Unmap().Is6() {
		resolver = netip.AddrPortFrom(nc.plan.HostAddr6.Addr(), 53)
	}
	if !ownICMPError(m, []byte(ev.Content), resolver) {
		return nfq.Outcome{}, false
	}
	d := nc.d
	if d.audit != nil {
		rec := decide.AuditRecord{Type: "decision", Time: time.Now().UTC(),
			Event:   &decide.AuditEvent{Ch: ev.Ch, Dir: ev.Dir, Op: ev.Op, Obj: ev.Obj, Fields: ev.Fields, ContentBytes: len(ev.Content), Dest: ev.Dest},
			Verdict: decide.Release, Layer: decide.LayerInternal, Reason: &decide.Reason{Code: CodeOwnICMP},
			Justification: fmt.Sprintf("an ICMP error about carbd's own resolver datagram (from %s to %s), addressed to carbd itself: released without a question", resolver, m.Flow.Src)}
		d.auditRecord(rec)
	}
	return nfq.Outcome{Verdict: nfq.Release, Reason: CodeOwnICMP}, true
}
