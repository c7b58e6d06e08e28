package netparse

import (
	"errors"
	"testing"
	"time"

	"github.com/google/gopacket/layers"
)

// fragments4 splits an IPv4 datagram's payload into fragments of size n
// (a multiple of 8) and returns them in order.
func fragments4(t *testing.T, l4 []byte, proto layers.IPProtocol, id uint16, n int) [][]byte {
	src, dst := ap("10.0.0.2:0").Addr(), ap("10.0.0.53:0").Addr()
	var out [][]byte
	for off := 0; off < len(l4); off += n {
		end := min(off+n, len(l4))
		out = append(out, frag4(t, src, dst, proto, id, off, end < len(l4), l4[off:end]))
	}
	return out
}

func fragments6(t *testing.T, l4 []byte, nh uint8, id uint32, n int) [][]byte {
	src, dst := ap("[fd00::2]:0").Addr(), ap("[fd00::53]:0").Addr()
	var out [][]byte
	for off := 0; off < len(l4); off += n {
		end := min(off+n, len(l4))
		out = append(out, ip6Raw(src, dst, protoFragment, concat(frag6(nh, off, end < len(l4), id), l4[off:end])))
	}
	return out
}

func TestFragments(t *testing.T) {
	q := dnsQuery(t, 7, "fragmented.example.", 16)
	l4v4 := udpL4(t, ap("10.0.0.2:3333"), ap("10.0.0.53:53"), q)
	l4v6 := udpL4(t, ap("[fd00::2]:3333"), ap("[fd00::53]:53"), q)
	v4 := fragments4(t, l4v4, layers.IPProtocolUDP, 42, 16)
	v6 := fragments6(t, l4v6, ProtoUDP, 4242, 16)
	for _, tc := range []struct {
		name  string
		frags [][]byte
		order []int
	}{
		{"ipv4 in order", v4, []int{0, 1, 2, 3}},
		{"ipv4 reversed", v4, []int{3, 2, 1, 0}},
		{"ipv6 in order", v6, []int{0, 1, 2, 3}},
		{"ipv6 shuffled", v6, []int{2, 0, 3, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.frags) != 4 {
				t.Fatalf("%d fragments", len(tc.frags))
			}
			p := newParser(t, Config{})
			var key FragKey
			for i, k := range tc.order {
				r := p.Feed(tc.frags[k], Meta{Time: t0})
				if i == 0 {
					key = r.Packet.Datagram
				} else if r.Packet == nil || r.Packet.Datagram != key {
					t.Fatalf("fragment %d: datagram key changed", k)
				}
				if i < len(tc.order)-1 {
					if r.Action != Hold {
						t.Fatalf("fragment %d: %v %v", k, r.Action, r.Err)
					}
					continue
				}
				if r.Action != Decide || len(r.Effects) != 1 || !r.Packet.Reassembled {
					t.Fatalf("last fragment: %v %v", r.Action, r.Err)
				}
				ev := r.Effects[0].Event()
				if ev.Op != "dns:query" || ev.Obj != "fragmented.example" {
					t.Fatalf("event %q %q", ev.Op, ev.Obj)
				}
			}
		})
	}
}

func TestFragmentRefusals(t *testing.T) {
	l4 := udpL4(t, ap("10.0.0.2:3333"), ap("10.0.0.53:9"), make([]byte, 56))
	src, dst := ap("10.0.0.2:0").Addr(), ap("10.0.0.53:0").Addr()
	f := func(off int, more bool, data []byte) []byte {
		return frag4(t, src, dst, layers.IPProtocolUDP, 9, off, more, data)
	}
	rewritten := append([]byte(nil), l4[8:24]...)
	rewritten[3] ^= 0xff
	tests := []struct {
		name  string
		cfg   Config
		frags [][]byte
		want  []Action
		err   error // of the last fragment
	}{
		{"overlap with other bytes", Config{}, [][]byte{f(0, true, l4[:16]), f(8, true, rewritten), f(16, false, l4[16:])},
			[]Action{Hold, Refuse, Refuse}, ErrFragRefused},
		{"overlap with same bytes, other extent", Config{}, [][]byte{f(0, true, l4[:16]), f(8, true, l4[8:32])},
			[]Action{Hold, Refuse}, ErrFragOverlap},
		{"exact duplicate", Config{}, [][]byte{f(0, true, l4[:16]), f(0, true, l4[:16]), f(16, false, l4[16:])},
			[]Action{Hold, Drop, Decide}, nil},
		{"not a multiple of 8", Config{}, [][]byte{f(0, true, l4[:12])}, []Action{Refuse}, ErrFragBad},
		{"too many", Config{MaxFragments: 2}, [][]byte{f(0, true, l4[:8]), f(8, true, l4[8:16]), f(16, true, l4[16:24])},
			[]Action{Hold, Hold, Refuse}, ErrFragTooMany},
		{"two ends", Config{}, [][]byte{f(32, false, l4[32:]), f(8, false, l4[8:16])}, []Action{Hold, Refuse}, ErrFragBad},
		{"beyond 64 KiB", Config{}, [][]byte{f(65528, false, l4[:16])}, []Action{Refuse}, ErrFragTooBig},
		{"memory bound", Config{MaxFragBytes: 20}, [][]byte{f(0, true, l4[:16]), f(16, true, l4[16:32])}, []Action{Hold, Refuse}, ErrFragFull},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newParser(t, tc.cfg)
			var r *Result
			for i, pkt := range tc.frags {
				r = p.Feed(pkt, Meta{Time: t0})
				if r.Action != tc.want[i] {
					t.Fatalf("fragment %d: %v %v, want %v", i, r.Action, r.Err, tc.want[i])
				}
			}
			if tc.err != nil && !errors.Is(r.Err, tc.err) {
				t.Fatalf("err %v, want %v", r.Err, tc.err)
			}
		})
	}
}

func TestFragmentTimeoutAndTable(t *testing.T) {
	p := newParser(t, Config{MaxFragDatagrams: 2, FragTimeout: 30 * time.Second})
	src, dst := ap("10.0.0.2:0").Addr(), ap("10.0.0.53:0").Addr()
	first := func(id uint16) []byte {
		return frag4(t, src, dst, layers.IPProtocolUDP, id, 0, true, make([]byte, 16))
	}
	for id := uint16(1); id <= 2; id++ {
		if r := p.Feed(first(id), Meta{Time: t0}); r.Action != Hold {
			t.Fatalf("datagram %d: %v %v", id, r.Action, r.Err)
		}
	}
	if r := p.Feed(first(3), Meta{Time: t0.Add(time.Second)}); r.Action != Refuse || !errors.Is(r.Err, ErrFragFull) {
		t.Fatalf("third datagram: %v %v", r.Action, r.Err)
	}
	r := p.Expire(t0.Add(31 * time.Second))
	if len(r.Expired) != 2 {
		t.Fatalf("expired %v", r.Expired)
	}
	if r := p.Feed(first(3), Meta{Time: t0.Add(32 * time.Second)}); r.Action != Hold {
		t.Fatalf("after expiry: %v %v", r.Action, r.Err)
	}
}

func TestFragmentedTCP(t *testing.T) {
	// A TCP segment fragmented at the IP layer reaches the stream whole.
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40100", "10.0.0.53:80", 100)
	c.syn()
	l4 := tcpL4(t, c.src, c.dst, c.seq(0), FlagACK|FlagPSH, []byte(getA))
	frags := fragments4(t, l4, layers.IPProtocolTCP, 77, 24)
	for i, fr := range frags {
		// fragments4 addresses 10.0.0.2 -> 10.0.0.53, like the client.
		r := p.Feed(fr, Meta{Time: t0})
		if i < len(frags)-1 {
			if r.Action != Hold {
				t.Fatalf("fragment %d: %v %v", i, r.Action, r.Err)
			}
			continue
		}
		if r.Action != Decide || len(r.Effects) != 1 || r.Effects[0].Kind != KindHTTP {
			t.Fatalf("last: %v %v", r.Action, r.Err)
		}
	}
}
