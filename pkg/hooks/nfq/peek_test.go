package nfq

import (
	"errors"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

func TestPeek(t *testing.T) {
	ext6 := func(inner gopacket.SerializableLayer, payload []byte) []byte {
		// IPv6 + hop-by-hop + destination options + UDP.
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolIPv6HopByHop, SrcIP: cli6.AsSlice(), DstIP: srv6.AsSlice()}
		hop := []byte{60, 0, 1, 4, 0, 0, 0, 0} // next: destination options, PadN
		dst := []byte{17, 0, 1, 4, 0, 0, 0, 0} // next: UDP
		udp := udpPkt(t, cli6, srv6, 1234, 53, payload)[40:]
		b := serialize(t, ip, gopacket.Payload(append(append(hop, dst...), udp...)))
		return b
	}
	frag4 := udpPkt(t, cli4, srv4, 1, 2, []byte("x"))
	frag4[6] = 0x20 // MF
	for _, tc := range []struct {
		name string
		pkt  []byte
		want tcx.FlowKey
		frag bool
		err  bool
	}{
		{"tcp4", tcpPkt(t, tcpSeg{src: cli4, dst: srv4, sport: 40000, dport: 80, syn: true}),
			tcx.FlowKey{Src: cli4, Dst: srv4, SrcPort: 40000, DstPort: 80, Proto: 6}, false, false},
		{"udp6-ext", ext6(nil, []byte("q")), tcx.FlowKey{Src: cli6, Dst: srv6, SrcPort: 1234, DstPort: 53, Proto: 17}, false, false},
		{"icmp4-echo", serialize(t, &layers.IPv4{Version: 4, TTL: 1, Protocol: 1, SrcIP: cli4.AsSlice(), DstIP: srv4.AsSlice()},
			&layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 77}),
			tcx.ICMPEchoKey(cli4, srv4, 77), false, false},
		{"fragment", frag4, tcx.FlowKey{}, true, false},
		{"empty", nil, tcx.FlowKey{}, false, true},
		{"version 5", []byte{0x50, 0, 0, 20}, tcx.FlowKey{}, false, true},
		{"ipv4 length past the end", tcpPkt(t, tcpSeg{src: cli4, dst: srv4, sport: 1, dport: 2})[:30], tcx.FlowKey{}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := peek(tc.pkt)
			if tc.err {
				if !errors.Is(err, errPeek) {
					t.Fatalf("peek: %v, want errPeek", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.frag != tc.frag {
				t.Fatalf("frag %v, want %v", p.frag, tc.frag)
			}
			if !tc.frag && (!p.hasKey || p.key != tc.want) {
				t.Fatalf("key %v (has %v), want %v", p.key, p.hasKey, tc.want)
			}
		})
	}
}

// FuzzPeek checks peek against netparse's decoder: it never panics, and
// where both read a packet whole they agree on its flow, so the loop's
// early refused-flow check and worker choice match what the parser then
// sees.
func FuzzPeek(f *testing.F) {
	f.Add(tcpPkt(f, tcpSeg{src: cli4, dst: srv4, sport: 40000, dport: 80, payload: []byte("GET / HTTP/1.1\r\n\r\n")}))
	f.Add(tcpPkt(f, tcpSeg{src: cli6, dst: srv6, sport: 40000, dport: 443, syn: true}))
	f.Add(udpPkt(f, cli4, srv4, 5353, 53, []byte("query")))
	f.Add(udpPkt(f, cli6, srv6, 1, 443, []byte{0xc0, 0, 0, 0, 1}))
	f.Add([]byte{0x60, 0, 0, 0, 0, 8, 44, 64})
	dec := netparse.NewDecoder(false)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := peek(b)
		if err != nil {
			return
		}
		_ = shard(&p, 3)
		pk, derr := dec.Decode(b)
		if derr != nil || pk.IsFragment || !p.hasKey {
			return
		}
		if p.frag {
			t.Fatalf("peek says fragment, the decoder says not")
		}
		var want tcx.FlowKey
		if pk.Proto == netparse.ProtoTCP {
			want = tcpKey(pk)
		} else {
			want = datagramKey(pk)
		}
		if (pk.Proto == netparse.ProtoICMP && pk.Family == 6) || (pk.Proto == netparse.ProtoICMPv6 && pk.Family == 4) {
			want.SrcPort, want.DstPort = p.key.SrcPort, p.key.DstPort // ICMP in the other family: opaque to both
		}
		if p.key != want {
			t.Fatalf("peek key %v, decoder %v", p.key, want)
		}
		if pk.Proto == netparse.ProtoTCP && p.tcpPayload != len(pk.Payload) {
			t.Fatalf("peek payload %d, decoder %d", p.tcpPayload, len(pk.Payload))
		}
	})
}
