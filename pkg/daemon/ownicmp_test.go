package daemon

import (
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/carbd/carbd/pkg/hooks/nfq"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// quoted builds the packet an ICMP error quotes: a UDP datagram from src
// to dst carrying payload, cut to n bytes (0: whole).
func quoted(t *testing.T, src, dst netip.AddrPort, payload []byte, n int) []byte {
	t.Helper()
	udp := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	var ip gopacket.SerializableLayer
	if src.Addr().Is4() {
		l := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		_ = udp.SetNetworkLayerForChecksum(l)
		ip = l
	} else {
		l := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		_ = udp.SetNetworkLayerForChecksum(l)
		ip = l
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, udp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if n > 0 && n < len(b) {
		b = b[:n]
	}
	return b
}

// ICMP errors about carbd's own resolver datagram are recognised from
// the quoted packet; anything else an ICMP error could be is not.
func TestOwnICMPError(t *testing.T) {
	resolver4 := netip.MustParseAddrPort("10.200.0.1:53")
	resolver6 := netip.MustParseAddrPort("[fd00:cb::1]:53")
	guest4, guest6 := netip.MustParseAddr("10.200.0.2"), netip.MustParseAddr("fd00:cb::2")
	response := []byte{0x12, 0x34, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0}
	query := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	meta := func(src, dst netip.Addr, proto uint8, typ, code uint8, local bool) nfq.Meta {
		return nfq.Meta{Local: local, Flow: tcx.FlowKey{Src: src, Dst: dst, Proto: proto, DstPort: uint16(typ)<<8 | uint16(code)}}
	}
	unreach4 := meta(guest4, resolver4.Addr(), 1, 3, 3, true)
	v6 := func(b []byte) []byte { return append([]byte{0, 0, 0, 0}, b...) }
	for _, tc := range []struct {
		name     string
		m        nfq.Meta
		body     []byte
		resolver netip.AddrPort
		want     bool
	}{
		{"port unreachable about the resolver's answer", unreach4, quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, true},
		{"the quote cut after the UDP header", unreach4, quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 28), resolver4, true},
		{"time exceeded", meta(guest4, resolver4.Addr(), 1, 11, 0, true), quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, true},
		{"ICMPv6 port unreachable", meta(guest6, resolver6.Addr(), 58, 1, 4, true), v6(quoted(t, resolver6, netip.AddrPortFrom(guest6, 41000), response, 0)), resolver6, true},
		{"quotes a query, not the resolver's answer", unreach4, quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), query, 0), resolver4, false},
		{"quotes another source", unreach4, quoted(t, netip.MustParseAddrPort("10.200.0.1:5353"), netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, false},
		{"quotes a datagram to another host", unreach4, quoted(t, resolver4, netip.MustParseAddrPort("10.9.9.9:41000"), response, 0), resolver4, false},
		{"quote too short for the UDP header", unreach4, quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 24), resolver4, false},
		{"forwarded, not to carbd", meta(guest4, resolver4.Addr(), 1, 3, 3, false), quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, false},
		{"to another address", meta(guest4, netip.MustParseAddr("198.18.0.1"), 1, 3, 3, true), quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, false},
		{"an echo request", meta(guest4, resolver4.Addr(), 1, 8, 0, true), quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, false},
		{"a redirect", meta(guest4, resolver4.Addr(), 1, 5, 0, true), quoted(t, resolver4, netip.AddrPortFrom(guest4, 41000), response, 0), resolver4, false},
		{"garbage", unreach4, []byte{0x45, 1, 2}, resolver4, false},
		{"empty", unreach4, nil, resolver4, false},
	} {
		if got := ownICMPError(tc.m, tc.body, tc.resolver); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func FuzzOwnICMPError(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 200, 0, 1, 10, 200, 0, 2, 0, 53, 160, 40, 0, 8, 0, 0}, uint8(1))
	f.Add([]byte{0x60}, uint8(58))
	resolver := netip.MustParseAddrPort("10.200.0.1:53")
	f.Fuzz(func(t *testing.T, body []byte, proto uint8) {
		m := nfq.Meta{Local: true, Flow: tcx.FlowKey{Src: netip.MustParseAddr("10.200.0.2"), Dst: resolver.Addr(), Proto: proto, DstPort: 3<<8 | 3}}
		ownICMPError(m, body, resolver)
	})
}
