package tcx

import (
	"math"
	"net/netip"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/cilium/ebpf"
)

// skbCtx is struct __sk_buff, the context BPF_PROG_TEST_RUN takes and
// returns for a TC program. The kernel accepts only mark, priority,
// ifindexes, cb, tstamp, wire_len, gso_segs, gso_size and hwtstamp set.
type skbCtx struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex, TCIndex                                  uint32
	CB                                                                          [5]uint32
	Hash, TCClassid, Data, DataEnd, NapiID, Family, RemoteIP4, LocalIP4         uint32
	RemoteIP6, LocalIP6                                                         [4]uint32
	RemotePort, LocalPort, DataMeta                                             uint32
	FlowKeys, Tstamp                                                            uint64
	WireLen, GsoSegs                                                            uint32
	Sk                                                                          uint64
	GsoSize                                                                     uint32
	TstampType                                                                  uint8
	_                                                                           [3]byte
	Hwtstamp                                                                    uint64
}

// harness is the program loaded with private, unpinned maps: nothing is
// attached anywhere.
type harness struct {
	d *Datapath
}

func newHarness(tb testing.TB) *harness {
	tb.Helper()
	testutil.RequireRoot(tb)
	prog, objs, err := load(1024, "", nil)
	if err != nil {
		tb.Fatal(err)
	}
	d := &Datapath{prog: prog, objs: objs, id: "test"}
	tb.Cleanup(d.release)
	h := &harness{d: d}
	h.setLease(tb, true)
	return h
}

func (h *harness) setLease(tb testing.TB, alive bool) {
	tb.Helper()
	until := uint64(math.MaxUint64)
	if !alive {
		until = 0
	}
	if err := h.d.writeConfig(until); err != nil {
		tb.Fatal(err)
	}
}

func (h *harness) setGen(tb testing.TB, gen uint64) {
	tb.Helper()
	if err := h.d.objs.readGen.Update(uint32(0), gen, ebpf.UpdateAny); err != nil {
		tb.Fatal(err)
	}
}

// run feeds one frame to the program and returns its verdict, the mark it
// left and the single counter it moved.
func (h *harness) run(tb testing.TB, frame []byte, in skbCtx) (ret uint32, mark uint32, reason Reason) {
	tb.Helper()
	before, err := h.d.Counters()
	if err != nil {
		tb.Fatal(err)
	}
	var out skbCtx
	ret, err = h.d.prog.Run(&ebpf.RunOptions{Data: frame, Context: in, ContextOut: &out})
	if err != nil {
		tb.Fatalf("run program: %v", err)
	}
	after, err := h.d.Counters()
	if err != nil {
		tb.Fatal(err)
	}
	diff := after.Sub(before)
	reason = NumReasons
	for r, c := range diff {
		if c.Packets == 0 {
			continue
		}
		if reason != NumReasons || c.Packets != 1 || c.Bytes != uint64(len(frame)) {
			tb.Fatalf("counters moved by more than one packet: %+v", diff)
		}
		reason = Reason(r)
	}
	if reason == NumReasons {
		tb.Fatalf("no counter moved")
	}
	return ret, out.Mark, reason
}

var (
	g4, w4 = "10.0.0.2", "192.0.2.1"
	g6, w6 = "fd00::2", "2001:db8::1"
)

// programCase is one packet for the program, with the verdicts in place
// and the reason it must be counted under.
type programCase struct {
	name   string
	v      map[FlowKey]Verdict
	dead   bool // lease expired
	frame  []byte
	gso    uint32
	gen    uint64 // the read generation (read_gen)
	want   Reason
	forgot *FlowKey // a verdict the program must have deleted
}

func programCases() []programCase {
	tcp4 := key(ProtoTCP, g4, w4, 40000, 80)
	tcp6 := key(ProtoTCP, g6, w6, 40000, 443)
	udp4 := key(ProtoUDP, g4, w4, 5000, 9999)
	dns4 := key(ProtoUDP, g4, w4, 5000, 53)
	echo4 := ICMPEchoKey(netip.MustParseAddr(g4), netip.MustParseAddr(w4), 77)
	echo6 := ICMPEchoKey(netip.MustParseAddr(g6), netip.MustParseAddr(w6), 77)
	opaque4 := key(253, g4, w4, 0, 0)
	const isn = 1000

	type verdicts = map[FlowKey]Verdict
	released := func(seqEnd uint32) Verdict { return Verdict{Action: Released, TCPRange: true, SeqEnd: seqEnd} }
	whole := Verdict{Action: Released}
	refused := Verdict{Action: Refused}
	at := func(gen uint64) Verdict { return Verdict{Action: Released, ReadGen: true, Gen: gen} }

	return []programCase{
		// Link-local traffic passes, even without a daemon.
		{name: "arp", frame: ether(ethARP, arp()), want: PassLinkLocal},
		{name: "arp/no-daemon", dead: true, frame: ether(ethARP, arp()), want: PassLinkLocal},
		{name: "nd-solicit", frame: ether(ethIPv6, ipv6(58, "fe80::2", "ff02::1:ff00:1", 255, icmp(135, 0, 0))), want: PassLinkLocal},
		{name: "nd-advert/no-daemon", dead: true, frame: ether(ethIPv6, ipv6(58, "fe80::2", "fe80::1", 255, icmp(136, 0, 0))), want: PassLinkLocal},
		{name: "nd-router-solicit", frame: ether(ethIPv6, ipv6(58, "fe80::2", "ff02::2", 255, icmp(133, 0, 0))), want: PassLinkLocal},
		{name: "nd-hoplimit-64-is-not-nd", frame: ether(ethIPv6, ipv6(58, g6, w6, 64, icmp(135, 0, 0))), want: QueueUndecided},
		{name: "nd-code-1-is-not-nd", frame: ether(ethIPv6, ipv6(58, "fe80::2", "fe80::1", 255, icmp(135, 1, 0))), want: QueueUndecided},
		{name: "mld-report-after-hbh", frame: ether(ethIPv6, ipv6(0, "fe80::2", "ff02::16", 1, ext6(58, 0, icmp(143, 0, 0)))), want: PassLinkLocal},
		{name: "mld-hoplimit-2-is-not-mld", frame: ether(ethIPv6, ipv6(58, "fe80::2", "ff02::16", 2, icmp(143, 0, 0))), want: QueueUndecided},

		// Undecided.
		{name: "tcp4/syn", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn, tcpSYN, nil))), want: QueueUndecided},
		{name: "tcp6/data", frame: ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, isn, tcpACK, bytesN(100)))), want: QueueUndecided},
		{name: "udp4", frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(10)))), want: QueueUndecided},
		{name: "icmp4-echo", frame: ether(ethIPv4, ipv4(1, g4, w4, icmp(8, 0, 77))), want: QueueUndecided},
		{name: "icmp6-echo", frame: ether(ethIPv6, ipv6(58, g6, w6, 64, icmp(128, 0, 77))), want: QueueUndecided},
		{name: "tcp4/no-daemon", dead: true, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn, tcpSYN, nil))), want: DropNoDaemon},

		// Released byte range.
		{name: "tcp4/range/inside", v: verdicts{tcp4: released(isn + 101)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK|tcpPSH, bytesN(100)))), want: PassFast},
		{name: "tcp4/range/one-beyond", v: verdicts{tcp4: released(isn + 100)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK|tcpPSH, bytesN(100)))), want: QueueBeyondRange},
		{name: "tcp4/range/second-request", v: verdicts{tcp4: released(isn + 101)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+101, tcpACK|tcpPSH, bytesN(50)))), want: QueueBeyondRange},
		{name: "tcp4/range/retransmit-old", v: verdicts{tcp4: released(isn + 1001)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: PassFast},
		{name: "tcp4/range/pure-ack-past-end", v: verdicts{tcp4: released(isn + 1)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+5000, tcpACK, nil))), want: PassFast},
		{name: "tcp4/range/fin", v: verdicts{tcp4: released(isn + 1)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpFIN|tcpACK, nil))), want: PassFast},
		{name: "tcp4/range/rst", v: verdicts{tcp4: released(isn + 1)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpRST, nil))), want: PassFast},
		{name: "tcp4/range/wrap-inside", v: verdicts{tcp4: released(100)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 0xffffff00, tcpACK, bytesN(0x100+100)))), want: PassFast},
		{name: "tcp4/range/wrap-beyond", v: verdicts{tcp4: released(99)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 0xffffff00, tcpACK, bytesN(0x100+100)))), want: QueueBeyondRange},
		{name: "tcp4/range/end-before-wrap", v: verdicts{tcp4: released(0xfffffff0)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 0xfffffff0, tcpACK, bytesN(0x20)))), want: QueueBeyondRange},
		{name: "tcp4/range/syn-resets", v: verdicts{tcp4: released(isn + 1)}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 5, tcpSYN, nil))), want: QueueUndecided, forgot: &tcp4},
		{name: "tcp6/range/inside", v: verdicts{tcp6: released(isn + 101)}, frame: ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, isn+1, tcpACK, bytesN(100)))), want: PassFast},
		{name: "tcp6/range/beyond", v: verdicts{tcp6: released(isn + 100)}, frame: ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, isn+1, tcpACK, bytesN(100)))), want: QueueBeyondRange},
		{name: "tcp4/whole-flow", v: verdicts{tcp4: whole}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 12345, tcpACK, bytesN(1000)))), want: PassFast},
		{name: "tcp4/whole-flow/syn", v: verdicts{tcp4: whole}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 12345, tcpSYN, nil))), want: PassFast},
		{name: "tcp4/other-flow", v: verdicts{tcp4: whole}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40001, 80, 1, tcpACK, bytesN(10)))), want: QueueUndecided},
		{name: "tcp4/released/no-daemon", dead: true, v: verdicts{tcp4: whole}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 1, tcpACK, nil))), want: DropNoDaemon},

		// UDP and ICMP per flow; DNS always queued.
		{name: "udp4/released", v: verdicts{udp4: whole}, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(10)))), want: PassFast},
		{name: "udp4/released-via-Release", v: verdicts{udp4: {Action: Released}}, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(1400)))), want: PassFast},
		{name: "udp4/dns-released-still-queued", v: verdicts{dns4: whole}, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 53, bytesN(30)))), want: QueueDNS},
		{name: "udp6/dns", frame: ether(ethIPv6, ipv6(17, g6, w6, 64, udp(5000, 53, bytesN(30)))), want: QueueDNS},
		{name: "icmp4-echo/released", v: verdicts{echo4: whole}, frame: ether(ethIPv4, ipv4(1, g4, w4, icmp(8, 0, 77))), want: PassFast},
		{name: "icmp4-echo/other-id", v: verdicts{echo4: whole}, frame: ether(ethIPv4, ipv4(1, g4, w4, icmp(8, 0, 78))), want: QueueUndecided},
		{name: "icmp6-echo/released", v: verdicts{echo6: whole}, frame: ether(ethIPv6, ipv6(58, g6, w6, 64, icmp(128, 0, 77))), want: PassFast},
		{name: "icmp4-unreach", frame: ether(ethIPv4, ipv4(1, g4, w4, icmp(3, 3, 0))), want: QueueUndecided},

		// Refused.
		{name: "tcp4/refused", v: verdicts{tcp4: refused}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 1, tcpSYN, nil))), want: DropRefused},
		{name: "tcp6/refused", v: verdicts{tcp6: refused}, frame: ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, 1, tcpACK, nil))), want: DropRefused},
		{name: "udp4/dns-refused", v: verdicts{dns4: refused}, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 53, bytesN(30)))), want: DropRefused},
		{name: "opaque/refused", v: verdicts{opaque4: refused}, frame: ether(ethIPv4, ipv4(253, g4, w4, bytesN(20))), want: DropRefused},
		{name: "tcp4/refused/ip-options", v: verdicts{tcp4: refused}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 1, tcpACK, nil), withOptions(2))), want: DropRefused},

		// Fragments, options, routing headers, opaque protocols.
		{name: "ipv4/first-fragment", v: verdicts{udp4: whole}, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(64)), withFrag(true, 0))), want: QueueFragment},
		{name: "ipv4/later-fragment", frame: ether(ethIPv4, ipv4(17, g4, w4, bytesN(64), withFrag(false, 185))), want: QueueFragment},
		{name: "ipv6/fragment", v: verdicts{key(ProtoUDP, g6, w6, 5000, 9999): whole}, frame: ether(ethIPv6, ipv6(44, g6, w6, 64, frag6(17, 0, true, udp(5000, 9999, bytesN(64))))), want: QueueFragment},
		{name: "ipv6/fragment-after-dstopts", frame: ether(ethIPv6, ipv6(60, g6, w6, 64, ext6(44, 0, frag6(17, 10, false, bytesN(64))))), want: QueueFragment},
		{name: "ipv4/options/released", v: verdicts{tcp4: whole}, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, 1, tcpACK, bytesN(10)), withOptions(3))), want: QueueIPOptions},
		{name: "ipv6/routing-header/released", v: verdicts{tcp6: whole}, frame: ether(ethIPv6, ipv6(43, g6, w6, 64, ext6(6, 2, tcp(40000, 443, 1, tcpACK, bytesN(10))))), want: QueueIPOptions},
		{name: "ipv6/hbh-dstopts-ah/released", v: verdicts{tcp6: whole}, frame: ether(ethIPv6, ipv6(0, g6, w6, 64, ext6(60, 0, ext6(51, 0, ah6(6, tcp(40000, 443, 1, tcpACK, bytesN(10))))))), want: PassFast},
		{name: "ipv6/eight-dstopts", frame: ether(ethIPv6, ipv6(60, g6, w6, 64, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(60, 0, ext6(6, 0, tcp(40000, 443, 1, tcpACK, nil))))))))))), want: QueueOpaque},
		{name: "ipv4/proto-253", frame: ether(ethIPv4, ipv4(253, g4, w4, bytesN(20))), want: QueueOpaque},
		{name: "ipv4/gre", frame: ether(ethIPv4, ipv4(47, g4, w4, bytesN(20))), want: QueueOpaque},
		{name: "ipv4/ipv6-in-ipv4", frame: ether(ethIPv4, ipv4(41, g4, w4, ipv6(6, g6, w6, 64, tcp(1, 2, 3, tcpSYN, nil)))), want: QueueOpaque},
		{name: "ipv6/proto-253", frame: ether(ethIPv6, ipv6(253, g6, w6, 64, bytesN(20))), want: QueueOpaque},
		{name: "ipv6/icmpv4-inside-ipv6", frame: ether(ethIPv6, ipv6(1, g6, w6, 64, icmp(8, 0, 1))), want: QueueOpaque},
		{name: "ipv6/no-next-header", frame: ether(ethIPv6, ipv6(59, g6, w6, 64, nil)), want: QueueOpaque},
		{name: "opaque/released-still-queued", v: verdicts{opaque4: whole}, frame: ether(ethIPv4, ipv4(253, g4, w4, bytesN(20))), want: QueueOpaque},

		// Layer 2.
		{name: "vlan", frame: ether(0x8100, append([]byte{0, 100, 0x08, 0x00}, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil))...)), want: DropVLAN},
		{name: "qinq", frame: ether(0x88a8, append([]byte{0, 100, 0x81, 0x00}, bytesN(60)...)), want: DropVLAN},
		{name: "lldp", frame: ether(0x88cc, bytesN(60)), want: DropNonIP},
		{name: "ipx", frame: ether(0x8137, bytesN(60)), want: DropNonIP},

		// Malformed.
		{name: "ipv4/total-length-past-frame", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil), withTotLen(200))), want: DropMalformed},
		{name: "ipv4/total-length-below-header", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil), withTotLen(12))), want: DropMalformed},
		{name: "ipv4/ihl-4", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil), withIHL(4))), want: DropMalformed},
		{name: "ipv4/version-6", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil), withVersion(6))), want: DropMalformed},
		{name: "ipv4/options-past-total-length", frame: ether(ethIPv4, ipv4(6, g4, w4, nil, withIHL(15), withTotLen(24))), want: DropMalformed},
		{name: "tcp/truncated", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil)[:12])), want: DropMalformed},
		{name: "tcp/doff-4", frame: ether(ethIPv4, ipv4(6, g4, w4, func() []byte { b := tcp(1, 2, 3, tcpSYN, nil); b[12] = 4 << 4; return b }())), want: DropMalformed},
		{name: "tcp/doff-past-packet", frame: ether(ethIPv4, ipv4(6, g4, w4, func() []byte { b := tcp(1, 2, 3, tcpSYN, nil); b[12] = 15 << 4; return b }())), want: DropMalformed},
		{name: "udp/truncated", frame: ether(ethIPv4, ipv4(17, g4, w4, []byte{1, 2, 3})), want: DropMalformed},
		{name: "icmp/truncated", frame: ether(ethIPv4, ipv4(1, g4, w4, []byte{8, 0, 0, 0})), want: DropMalformed},
		{name: "ipv6/payload-past-frame", frame: func() []byte {
			f := ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(1, 2, 3, tcpSYN, nil)))
			be.PutUint16(f[14+4:], 500)
			return f
		}(), want: DropMalformed},
		{name: "ipv6/version-4", frame: func() []byte {
			f := ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(1, 2, 3, tcpSYN, nil)))
			f[14] = 0x40
			return f
		}(), want: DropMalformed},
		{name: "ipv6/hbh-not-first", frame: ether(ethIPv6, ipv6(60, g6, w6, 64, ext6(0, 0, tcp(1, 2, 3, tcpSYN, nil)))), want: DropMalformed},
		{name: "ipv6/ext-past-payload", frame: ether(ethIPv6, ipv6(60, g6, w6, 64, ext6(6, 0, nil)[:6])), want: DropMalformed},
		{name: "ipv6/ext-length-past-payload", frame: ether(ethIPv6, ipv6(60, g6, w6, 64, ext6(6, 0, tcp(1, 2, 3, tcpSYN, nil))[:8])), want: DropMalformed},
		{name: "ipv6/jumbo-without-gso", frame: func() []byte {
			f := ether(ethIPv6, ipv6(0, g6, w6, 64, ext6(6, 0, tcp(1, 2, 3, tcpSYN, nil))))
			be.PutUint16(f[14+4:], 0)
			return f
		}(), want: DropMalformed},
		{name: "ipv6/zero-length-tcp", frame: func() []byte {
			f := ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(1, 2, 3, tcpSYN, nil)))
			be.PutUint16(f[14+4:], 0)
			return f
		}(), want: DropMalformed},

		// BIG TCP: GSO packets past 64 KiB carry no IP length. (BPF_PROG_TEST_RUN
		// takes at most a page, so the packets here are small, with the
		// same zero length and a GSO size.)
		{name: "ipv4/big-tcp", v: verdicts{tcp4: released(isn + 1 + 2000)}, gso: 1448, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(2000)), withTotLen(0))), want: PassFast},
		{name: "ipv4/big-tcp/beyond", v: verdicts{tcp4: released(isn + 2000)}, gso: 1448, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(2000)), withTotLen(0))), want: QueueBeyondRange},
		{name: "ipv6/big-tcp", v: verdicts{tcp6: released(isn + 1 + 2000)}, gso: 1428, frame: func() []byte {
			f := ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, isn+1, tcpACK, bytesN(2000))))
			be.PutUint16(f[14+4:], 0)
			return f
		}(), want: PassFast},
		{name: "ipv4/zero-length-without-gso", frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(1, 2, 3, tcpSYN, nil), withTotLen(0))), want: DropMalformed},

		// A flow released to its end at a read generation: its data
		// passes while the generation is the one stamped, and is queued
		// once the agent read again (or the generation is anything else:
		// a map replaced or reset). Packets without client bytes pass.
		{name: "read-gen/tcp/same", v: verdicts{tcp4: at(5)}, gen: 5, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: PassFast},
		{name: "read-gen/tcp/read-since", v: verdicts{tcp4: at(5)}, gen: 6, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: QueueRead},
		{name: "read-gen/tcp/older", v: verdicts{tcp4: at(5)}, gen: 4, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: QueueRead},
		{name: "read-gen/tcp/pure-ack", v: verdicts{tcp4: at(5)}, gen: 6, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, nil))), want: PassFast},
		{name: "read-gen/tcp/fin", v: verdicts{tcp4: at(5)}, gen: 6, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK|tcpFIN, nil))), want: PassFast},
		{name: "read-gen/ipv6/read-since", v: verdicts{tcp6: at(0)}, gen: 1, frame: ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, isn+1, tcpACK, bytesN(10)))), want: QueueRead},
		{name: "read-gen/udp/same", v: verdicts{udp4: at(9)}, gen: 9, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(30)))), want: PassFast},
		{name: "read-gen/udp/read-since", v: verdicts{udp4: at(9)}, gen: 10, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(30)))), want: QueueRead},
		{name: "read-gen/udp/empty-datagram", v: verdicts{udp4: at(9)}, gen: 10, frame: ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, nil))), want: QueueRead},
		{name: "read-gen/whole-without-stamp", v: verdicts{tcp4: whole}, gen: 7, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: PassFast},
		{name: "read-gen/refused", v: verdicts{tcp4: refused}, gen: 7, frame: ether(ethIPv4, ipv4(6, g4, w4, tcp(40000, 80, isn+1, tcpACK, bytesN(100)))), want: DropRefused},
	}

}

func TestProgram(t *testing.T) {
	tests := programCases()
	h := newHarness(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.v {
				if err := h.d.SetVerdict(k, v); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				for k := range tc.v {
					if err := h.d.Forget(k); err != nil {
						t.Error(err)
					}
				}
			})
			h.setLease(t, !tc.dead)
			t.Cleanup(func() { h.setLease(t, true) })
			h.setGen(t, tc.gen)

			const otherBits = 0x0000abcd
			ret, mark, reason := h.run(t, tc.frame, skbCtx{Mark: otherBits, GsoSize: tc.gso, GsoSegs: min(tc.gso, 1)})
			if reason != tc.want {
				t.Fatalf("counted as %s, want %s", reason, tc.want)
			}
			wantRet, wantMark := uint32(actOK), uint32(0)
			switch tc.want.Outcome() {
			case Dropped:
				wantRet, wantMark = actShot, otherBits
			case Queued:
				wantMark = MarkQueue | otherBits
			case Passed:
				wantMark = MarkPass | otherBits
				if tc.want == PassLinkLocal {
					wantMark = MarkLinkLocal | otherBits
				}
			}
			if ret != wantRet {
				t.Errorf("program returned %d, want %d", ret, wantRet)
			}
			if mark != wantMark {
				t.Errorf("mark %#x, want %#x", mark, wantMark)
			}
			if tc.forgot != nil {
				v, err := h.d.Verdict(*tc.forgot)
				if err != nil {
					t.Fatal(err)
				}
				if v.Action != Undecided {
					t.Errorf("verdict of %v after the packet: %+v, want none", *tc.forgot, v)
				}
			}
		})
	}
}

// TestFlowTable checks the per-flow state the program keeps and its
// conversion back to FlowKeys.
func TestFlowTable(t *testing.T) {
	h := newHarness(t)
	if n := h.d.objs.flows.MaxEntries(); n != 1024 {
		t.Errorf("flow table sized %d, want the 1024 asked for", n)
	}
	if n := h.d.objs.verdicts.MaxEntries(); n != 1024 {
		t.Errorf("verdict table sized %d, want the 1024 asked for", n)
	}
	tcp6 := key(ProtoTCP, g6, w6, 40000, 443)
	udp4 := key(ProtoUDP, g4, w4, 5000, 9999)
	if err := h.d.Release(tcp6, 2000); err != nil {
		t.Fatal(err)
	}
	frames := [][]byte{
		ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, 1000, tcpSYN, nil))),
		ether(ethIPv6, ipv6(6, g6, w6, 64, tcp(40000, 443, 1001, tcpACK, bytesN(500)))),
		ether(ethIPv4, ipv4(17, g4, w4, udp(5000, 9999, bytesN(10)))),
	}
	var want6, want4 uint64
	for i, f := range frames {
		h.run(t, f, skbCtx{})
		if i < 2 {
			want6 += uint64(len(f))
		} else {
			want4 += uint64(len(f))
		}
	}
	flows, err := h.d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	got := map[FlowKey]Flow{}
	for _, f := range flows {
		got[f.Key] = f
	}
	if len(got) != 2 {
		t.Fatalf("flows: %+v, want 2", flows)
	}
	if f := got[tcp6]; f.Packets != 2 || f.Bytes != want6 || f.FirstSeen.After(f.LastSeen) || f.FirstSeen.IsZero() {
		t.Errorf("tcp6 flow %+v, want 2 packets, %d bytes", f, want6)
	}
	// The SYN reset the byte-range verdict.
	if f := got[tcp6]; f.Verdict.Action != Undecided {
		t.Errorf("tcp6 verdict %+v after a SYN, want undecided", f.Verdict)
	}
	if f := got[udp4]; f.Packets != 1 || f.Bytes != want4 || f.Verdict.Action != Undecided {
		t.Errorf("udp4 flow %+v, want 1 packet, %d bytes, undecided", f, want4)
	}
	if err := h.d.Forget(udp4); err != nil {
		t.Fatal(err)
	}
	flows, err = h.d.Flows()
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 1 || flows[0].Key != tcp6 {
		t.Errorf("after Forget: %+v, want only %v", flows, tcp6)
	}
}
