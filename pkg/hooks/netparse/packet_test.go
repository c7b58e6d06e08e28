package netparse

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/google/gopacket/layers"
)

func TestDecodeRefusals(t *testing.T) {
	src, dst := ap("10.0.0.2:5000"), ap("10.0.0.9:80")
	s6, d6 := ap("[fd00::2]:5000"), ap("[fd00::9]:80")
	good := tcpPkt(t, src, dst, 1, FlagACK, []byte("hello"))
	withOpts := func(opts []byte) []byte {
		// Rebuild the IPv4 header with options (length fixed, checksum
		// recomputed by gopacket).
		l4 := tcpL4(t, src, dst, 1, FlagACK, []byte("hello"))
		ip := netLayer(src.Addr(), dst.Addr(), layers.IPProtocolTCP).(*layers.IPv4)
		for len(opts) > 0 {
			switch opts[0] {
			case 0, 1:
				ip.Options = append(ip.Options, layers.IPv4Option{OptionType: opts[0], OptionLength: 1})
				opts = opts[1:]
			default:
				n := int(opts[1])
				ip.Options = append(ip.Options, layers.IPv4Option{OptionType: opts[0], OptionLength: opts[1], OptionData: opts[2:n]})
				opts = opts[n:]
			}
		}
		return serialize(t, ip, gopacketPayload(l4))
	}
	badIPCsum := append([]byte(nil), good...)
	badIPCsum[10] ^= 0xff
	badTCPCsum := append([]byte(nil), good...)
	badTCPCsum[len(badTCPCsum)-1] ^= 0xff
	tcp6 := tcpL4(t, s6, d6, 1, FlagACK, []byte("hi"))
	tests := []struct {
		name   string
		pkt    []byte
		action Action
		err    error
	}{
		{"empty", nil, Refuse, ErrTruncated},
		{"not ip", []byte{0x50, 0, 0, 0}, Refuse, ErrNotIP},
		{"ipv4 header cut", good[:15], Refuse, ErrTruncated},
		{"ipv4 payload cut", good[:len(good)-2], Refuse, ErrTruncated},
		{"tcp header cut", func() []byte {
			// A consistent IPv4 header around 10 bytes of TCP header.
			return ipPkt(t, src.Addr(), dst.Addr(), layers.IPProtocolTCP, tcpL4(t, src, dst, 1, FlagACK, nil)[:10])
		}(), Refuse, ErrTruncated},
		{"ipv4 header checksum", badIPCsum, Drop, ErrChecksum},
		{"tcp checksum", badTCPCsum, Drop, ErrChecksum},
		{"ipv4 record route option", withOpts([]byte{7, 7, 4, 0, 0, 0, 0, 1}), Refuse, ErrIPv4Option},
		{"ipv4 loose source route", withOpts([]byte{131, 7, 4, 1, 2, 3, 4, 0}), Refuse, ErrIPv4Option},
		{"ipv6 routing header with segments left", ip6Raw(s6.Addr(), d6.Addr(), protoRouting,
			append(ext6(ProtoTCP, append([]byte{4, 1}, make([]byte, 4+16)...)), tcp6...)), Refuse, ErrRouting},
		{"ipv6 type 0 routing header", ip6Raw(s6.Addr(), d6.Addr(), protoRouting,
			append(ext6(ProtoTCP, []byte{0, 0}), tcp6...)), Refuse, ErrRouting},
		{"ipv6 padN with data", ip6Raw(s6.Addr(), d6.Addr(), protoDestOpts,
			append(ext6(ProtoTCP, []byte{1, 4, 'l', 'e', 'a', 'k'}), tcp6...)), Refuse, ErrIPv6Option},
		{"ipv6 unknown option", ip6Raw(s6.Addr(), d6.Addr(), protoHopByHop,
			append(ext6(ProtoTCP, []byte{0x3e, 2, 0, 0, 1, 0}), tcp6...)), Refuse, ErrIPv6Option},
		{"ipv6 hop-by-hop not first", ip6Raw(s6.Addr(), d6.Addr(), protoDestOpts,
			append(ext6(protoHopByHop, nil), append(ext6(ProtoTCP, nil), tcp6...)...)), Refuse, ErrExtChain},
		{"ipv6 payload cut", ip6Raw(s6.Addr(), d6.Addr(), ProtoTCP, tcp6)[:50], Refuse, ErrTruncated},
		{"ipv6 jumbo length 0", func() []byte {
			b := ip6Raw(s6.Addr(), d6.Addr(), ProtoTCP, tcp6)
			b[4], b[5] = 0, 0
			return b
		}(), Refuse, ErrMalformed},
		{"udp length mismatch", func() []byte {
			l4 := udpL4(t, src, ap("10.0.0.9:9"), []byte("abcdef"))
			binary.BigEndian.PutUint16(l4[4:6], 10)
			return ipPkt(t, src.Addr(), dst.Addr(), layers.IPProtocolUDP, l4)
		}(), Refuse, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newParser(t, Config{})
			r := p.Feed(tc.pkt, Meta{Time: t0})
			if r.Action != tc.action || !errors.Is(r.Err, tc.err) {
				t.Fatalf("got %v %v, want %v %v", r.Action, r.Err, tc.action, tc.err)
			}
		})
	}
}

func TestDecodeAccepts(t *testing.T) {
	s6, d6 := ap("[fd00::2]:5000"), ap("[fd00::9]:8080")
	tcp6 := tcpL4(t, s6, d6, 41, FlagACK|FlagPSH, []byte("GET / HTTP/1.1\r\n"))
	tests := []struct {
		name  string
		pkt   []byte
		proto uint8
		sport uint16
		data  string
	}{
		{"ipv4 with nop options", func() []byte {
			src, dst := ap("10.0.0.2:5000"), ap("10.0.0.9:80")
			ip := netLayer(src.Addr(), dst.Addr(), layers.IPProtocolTCP).(*layers.IPv4)
			ip.Options = []layers.IPv4Option{{OptionType: 1, OptionLength: 1}, {OptionType: 1, OptionLength: 1}, {OptionType: 0, OptionLength: 1}}
			return serialize(t, ip, gopacketPayload(tcpL4(t, src, dst, 1, FlagACK, []byte("x"))))
		}(), ProtoTCP, 5000, "x"},
		{"ipv6 plain", ip6Raw(s6.Addr(), d6.Addr(), ProtoTCP, tcp6), ProtoTCP, 5000, "GET / HTTP/1.1\r\n"},
		{"ipv6 hop-by-hop router alert, destination options, routing done", ip6Raw(s6.Addr(), d6.Addr(), protoHopByHop,
			concat(ext6(protoRouting, []byte{5, 2, 0, 0, 1, 0}),
				ext6(protoDestOpts, append([]byte{4, 0}, make([]byte, 4+16)...)),
				ext6(ProtoTCP, []byte{1, 4, 0, 0, 0, 0}),
				tcp6)), ProtoTCP, 5000, "GET / HTTP/1.1\r\n"},
		{"ipv6 atomic fragment", ip6Raw(s6.Addr(), d6.Addr(), protoFragment, concat(frag6(ProtoTCP, 0, false, 9), tcp6)), ProtoTCP, 5000, "GET / HTTP/1.1\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder(true)
			pk, err := d.Decode(tc.pkt)
			if err != nil {
				t.Fatal(err)
			}
			if pk.Proto != tc.proto || pk.SrcPort != tc.sport || string(pk.Payload) != tc.data || pk.IsFragment {
				t.Fatalf("got proto %d port %d data %q fragment %v", pk.Proto, pk.SrcPort, pk.Payload, pk.IsFragment)
			}
		})
	}
}

func TestOtherProtocols(t *testing.T) {
	p := newParser(t, Config{})
	gre := ipPkt(t, ap("10.0.0.2:0").Addr(), ap("10.0.0.9:0").Addr(), layers.IPProtocolGRE, []byte{0, 0, 8, 0, 'd', 'a', 't', 'a'})
	r := p.Feed(gre, Meta{Time: t0})
	if r.Action != Decide || len(r.Effects) != 1 {
		t.Fatalf("gre: %v %v", r.Action, r.Err)
	}
	ev := r.Effects[0].Event()
	if ev.Op != "ip:opaque" || ev.Dest.Proto != "47" || !IsOpaque(&ev) || ev.Obj != "10.0.0.9" {
		t.Fatalf("gre event: %+v", ev)
	}
	esp := ip6Raw(ap("[fd00::2]:0").Addr(), ap("[fd00::9]:0").Addr(), protoESP, []byte{0, 0, 1, 0, 0, 0, 0, 1, 0xde, 0xad})
	r = p.Feed(esp, Meta{Time: t0})
	if r.Action != Decide || len(r.Effects) != 1 || r.Effects[0].Kind != KindIPOpaque || r.Effects[0].Proto != protoESP {
		t.Fatalf("esp: %v %v %+v", r.Action, r.Err, r.Effects)
	}
}

func TestICMPEcho(t *testing.T) {
	p := newParser(t, Config{})
	src, dst := ap("10.0.0.2:0").Addr(), ap("10.0.0.9:0").Addr()
	echo := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 77, Seq: 3}
	pkt := ipPkt(t, src, dst, layers.IPProtocolICMPv4, serialize(t, echo, gopacketPayload([]byte("exfil:secret"))))
	r := p.Feed(pkt, Meta{Time: t0})
	if r.Action != Decide || len(r.Effects) != 1 {
		t.Fatalf("%v %v", r.Action, r.Err)
	}
	ev := r.Effects[0].Event()
	want := map[string]string{FieldICMPID: "77", FieldICMPSeq: "3", FieldPayload: "exfil:secret", FieldICMPType: "8"}
	for _, f := range ev.Fields {
		if v, ok := want[f.Name]; ok && v != f.Value {
			t.Errorf("%s = %q, want %q", f.Name, f.Value, v)
		}
		delete(want, f.Name)
	}
	if len(want) != 0 || ev.Op != "icmp:echo" || ev.Content != "exfil:secret" || ev.Dest.Proto != "icmp" {
		t.Fatalf("event %+v, missing %v", ev, want)
	}

	// ICMPv6 echo: the checksum covers the pseudo-header.
	s6, d6 := ap("[fd00::2]:0").Addr(), ap("[fd00::9]:0").Addr()
	ip6 := netLayer(s6, d6, layers.IPProtocolICMPv6).(*layers.IPv6)
	ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(128, 0)}
	if err := ic.SetNetworkLayerForChecksum(ip6); err != nil {
		t.Fatal(err)
	}
	pkt6 := serialize(t, ip6, ic, &layers.ICMPv6Echo{Identifier: 5, SeqNumber: 6}, gopacketPayload([]byte("ping6")))
	r = p.Feed(pkt6, Meta{Time: t0})
	if r.Action != Decide || len(r.Effects) != 1 || r.Effects[0].ICMPID != 5 || r.Effects[0].ICMPSeq != 6 || string(r.Effects[0].Content) != "ping6" {
		t.Fatalf("icmpv6: %v %v %+v", r.Action, r.Err, r.Effects)
	}
	pkt6[len(pkt6)-1] ^= 1
	if r = p.Feed(pkt6, Meta{Time: t0}); r.Action != Drop || !errors.Is(r.Err, ErrChecksum) {
		t.Fatalf("icmpv6 bad checksum: %v %v", r.Action, r.Err)
	}
}

func TestChecksumNotReady(t *testing.T) {
	p := newParser(t, Config{})
	pkt := udpPkt(t, ap("10.0.0.2:5000"), ap("10.0.0.9:9999"), []byte("payload"))
	pkt[len(pkt)-1] ^= 1 // as if the checksum were left to the NIC
	if r := p.Feed(pkt, Meta{Time: t0}); r.Action != Drop {
		t.Fatalf("checked: %v %v", r.Action, r.Err)
	}
	r := p.Feed(pkt, Meta{Time: t0, ChecksumNotReady: true})
	if r.Action != Decide || r.Effects[0].Kind != KindUDP || string(r.Effects[0].Content) != "payloae" {
		t.Fatalf("not ready: %v %v", r.Action, r.Err)
	}
}

func concat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}
