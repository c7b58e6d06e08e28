package nfq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// These tests drive the loop's core (workers, decisions, verdicts) with
// synthetic packets and record its verdicts instead of sending them to a
// kernel queue; the privileged tests run the same core on real queues.

var (
	cli4 = netip.MustParseAddr("10.1.0.2")
	srv4 = netip.MustParseAddr("10.2.0.2")
	cli6 = netip.MustParseAddr("fd00:1::2")
	srv6 = netip.MustParseAddr("fd00:2::2")
)

// recSink records verdicts and RSTs.
type recSink struct {
	mu       sync.Mutex
	verdicts map[uint32]bool
	order    []uint32
	rsts     []rstInfo
	unreach  []unreachInfo
	changed  chan struct{}
}

func newRecSink() *recSink {
	return &recSink{verdicts: map[uint32]bool{}, changed: make(chan struct{}, 1)}
}

func (s *recSink) verdict(p *packet, accept bool) error {
	s.mu.Lock()
	if _, dup := s.verdicts[p.id]; dup {
		s.mu.Unlock()
		panic(fmt.Sprintf("second verdict for packet %d", p.id))
	}
	s.verdicts[p.id] = accept
	s.order = append(s.order, p.id)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	return nil
}

func (s *recSink) rst(r rstInfo) error {
	s.mu.Lock()
	s.rsts = append(s.rsts, r)
	s.mu.Unlock()
	return nil
}

func (s *recSink) unreachable(u unreachInfo) error {
	s.mu.Lock()
	s.unreach = append(s.unreach, u)
	s.mu.Unlock()
	return nil
}

func (s *recSink) get(id uint32) (accept, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	accept, ok = s.verdicts[id]
	return
}

// recDatapath records the fast-path updates.
type recDatapath struct {
	mu    sync.Mutex
	calls []string
}

func (d *recDatapath) add(s string) error {
	d.mu.Lock()
	d.calls = append(d.calls, s)
	d.mu.Unlock()
	return nil
}
func (d *recDatapath) Release(k tcx.FlowKey, end uint32) error {
	return d.add(fmt.Sprintf("release %d %d", k.SrcPort, end))
}
func (d *recDatapath) ReleaseFlow(k tcx.FlowKey) error {
	return d.add(fmt.Sprintf("release-flow %d", k.SrcPort))
}
func (d *recDatapath) Refuse(k tcx.FlowKey) error { return d.add(fmt.Sprintf("refuse %d", k.SrcPort)) }
func (d *recDatapath) Forget(k tcx.FlowKey) error { return d.add(fmt.Sprintf("forget %d", k.SrcPort)) }
func (d *recDatapath) Verdict(tcx.FlowKey) (tcx.Verdict, error) {
	return tcx.Verdict{}, nil
}
func (d *recDatapath) log() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

type harness struct {
	t   *testing.T
	c   *core
	out *recSink
	dp  *recDatapath
	id  atomic.Uint32
}

func newHarness(t *testing.T, dec Decider, mod func(*Config)) *harness {
	t.Helper()
	dp := &recDatapath{}
	cfg := Config{QueueNum: 1, MaxQueueLen: 1024, Decider: dec, Datapath: dp, HoldTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	cfg, err := cfg.withDefaults(2)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, out: newRecSink(), dp: dp}
	h.c = newCore(cfg, h.out)
	h.c.start()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			h.c.stop()
		}
		s := h.c.stats()
		checkAccounting(t, &s)
	})
	_ = stopped
	return h
}

func checkAccounting(t *testing.T, s *Stats) {
	t.Helper()
	if s.DoubleVerdicts != 0 {
		t.Errorf("%d second verdicts attempted", s.DoubleVerdicts)
	}
	if got := s.Accepted() + s.Dropped() + uint64(s.Held); got != s.Received {
		t.Errorf("received %d packets, accounted %d: %s", s.Received, got, s.String())
	}
}

// send dispatches one packet and returns its id.
func (h *harness) send(b []byte) uint32 {
	id := h.id.Add(1)
	h.c.dispatch(&packet{id: id, data: b, time: time.Now(), hw: [6]byte{2, 0, 0, 0, 0, 1}, hasHW: true, indev: 7})
	return id
}

// verdict waits for packet id's verdict.
func (h *harness) verdict(id uint32) bool {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if a, ok := h.out.get(id); ok {
			return a
		}
		select {
		case <-h.out.changed:
		case <-time.After(10 * time.Millisecond):
		}
	}
	h.t.Fatalf("packet %d got no verdict", id)
	return false
}

// waitRSTs waits (at most 10 s) until the core has sent n RSTs: a flow
// refused by a timer has its held packets' verdicts out before its RST.
func (h *harness) waitRSTs(n uint64) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for h.c.stats().RSTs < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// pending asserts that packet id has no verdict (yet).
func (h *harness) pending(id uint32) {
	h.t.Helper()
	time.Sleep(100 * time.Millisecond)
	if a, ok := h.out.get(id); ok {
		h.t.Fatalf("packet %d got a verdict (accept %v), want it held", id, a)
	}
}

func (h *harness) want(id uint32, accept bool) {
	h.t.Helper()
	if got := h.verdict(id); got != accept {
		h.t.Fatalf("packet %d: accept %v, want %v", id, got, accept)
	}
}

// Packet builders.

func ipLayer(src, dst netip.Addr, proto layers.IPProtocol) (gopacket.SerializableLayer, gopacket.NetworkLayer) {
	if src.Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		return ip, ip
	}
	ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	return ip, ip
}

func serialize(t testing.TB, ls ...gopacket.SerializableLayer) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

type tcpSeg struct {
	src, dst      netip.Addr
	sport, dport  uint16
	seq, ack      uint32
	syn, fin, rst bool
	noACK         bool
	payload       []byte
}

func tcpPkt(t testing.TB, s tcpSeg) []byte {
	ip, nl := ipLayer(s.src, s.dst, layers.IPProtocolTCP)
	tcp := &layers.TCP{SrcPort: layers.TCPPort(s.sport), DstPort: layers.TCPPort(s.dport), Seq: s.seq, Ack: s.ack,
		SYN: s.syn, FIN: s.fin, RST: s.rst, ACK: !s.syn && !s.noACK, Window: 65535}
	tcp.SetNetworkLayerForChecksum(nl)
	return serialize(t, ip, tcp, gopacket.Payload(s.payload))
}

func udpPkt(t testing.TB, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip, nl := ipLayer(src, dst, layers.IPProtocolUDP)
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	udp.SetNetworkLayerForChecksum(nl)
	return serialize(t, ip, udp, gopacket.Payload(payload))
}

func dnsQuery(t testing.TB, name string) []byte {
	q := layers.DNS{ID: 7, RD: true, Questions: []layers.DNSQuestion{{Name: []byte(name), Type: layers.DNSTypeA, Class: layers.DNSClassIN}}}
	return serialize(t, &q)
}

// conn is a client TCP connection in the tests.
type conn struct {
	h            *harness
	src, dst     netip.Addr
	sport, dport uint16
	isn, next    uint32
	ack          uint32
}

func (h *harness) dial(src, dst netip.Addr, sport, dport uint16) *conn {
	c := &conn{h: h, src: src, dst: dst, sport: sport, dport: dport, isn: 1000, next: 1001, ack: 5001}
	id := h.send(tcpPkt(h.t, tcpSeg{src: src, dst: dst, sport: sport, dport: dport, seq: c.isn, syn: true}))
	h.want(id, true)
	return c
}

// write sends data at the current sequence number and advances it.
func (c *conn) write(data string) uint32 {
	id := c.at(c.next, data)
	c.next += uint32(len(data))
	return id
}

// at sends data at sequence number seq.
func (c *conn) at(seq uint32, data string) uint32 {
	return c.h.send(tcpPkt(c.h.t, tcpSeg{src: c.src, dst: c.dst, sport: c.sport, dport: c.dport, seq: seq, ack: c.ack, payload: []byte(data)}))
}

// decider is a scripted Decider for the unit tests.
type decider struct {
	mu    sync.Mutex
	fn    func(m Meta, ev decide.Event) Outcome
	seen  []decide.Event
	metas []Meta
	calls chan Outcome
}

func newDecider(fn func(m Meta, ev decide.Event) Outcome) *decider {
	return &decider{fn: fn, calls: make(chan Outcome, 1024)}
}

func (d *decider) Decide(_ context.Context, m Meta, ev decide.Event) Outcome {
	d.mu.Lock()
	d.seen = append(d.seen, ev)
	d.metas = append(d.metas, m)
	fn := d.fn
	d.mu.Unlock()
	out := fn(m, ev)
	d.calls <- out
	return out
}

func (d *decider) events() []decide.Event {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]decide.Event(nil), d.seen...)
}

func always(v Verdict) *decider {
	return newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: v} })
}

func byHost(hosts map[string]Verdict) *decider {
	return newDecider(func(_ Meta, ev decide.Event) Outcome {
		if ev.Dest != nil {
			if v, ok := hosts[ev.Dest.Host]; ok {
				return Outcome{Verdict: v}
			}
		}
		return Outcome{Verdict: Refuse}
	})
}

const reqHead = "GET /x HTTP/1.1\r\nHost: a.test\r\n"

func TestCoreRequestSplitOverPackets(t *testing.T) {
	dec := byHost(map[string]Verdict{"a.test": Release})
	h := newHarness(t, dec, nil)
	c := h.dial(cli4, srv4, 40000, 80)
	p1 := c.write(reqHead)
	h.pending(p1) // incomplete: held
	p2 := c.write("\r\n")
	h.want(p1, true)
	h.want(p2, true)
	if evs := dec.events(); len(evs) != 1 || evs[0].Op != "http:GET" || evs[0].Dest.Host != "a.test" {
		t.Fatalf("decided %v, want the one request", evs)
	}
	want := []string{"release 40000 1001", fmt.Sprintf("release 40000 %d", c.next)}
	if diff := cmp.Diff(want, h.dp.log()); diff != "" {
		t.Errorf("fast path updates (-want +got):\n%s", diff)
	}
}

func TestCoreOutOfOrder(t *testing.T) {
	h := newHarness(t, byHost(map[string]Verdict{"a.test": Release}), nil)
	c := h.dial(cli6, srv6, 40001, 80)
	p2 := c.at(c.next+uint32(len(reqHead)), "\r\n")
	h.pending(p2)
	p1 := c.at(c.next, reqHead)
	h.want(p1, true)
	h.want(p2, true)
	// Accepted in the order they arrived: the loop never reorders a
	// flow's packets.
	h.out.mu.Lock()
	order := h.out.order
	h.out.mu.Unlock()
	if len(order) != 3 || order[1] != p2 || order[2] != p1 {
		t.Fatalf("verdict order %v, want SYN, %d, %d", order, p2, p1)
	}
}

func TestCoreRefuseResetsClient(t *testing.T) {
	h := newHarness(t, always(Refuse), nil)
	c := h.dial(cli4, srv4, 40002, 8080)
	p1 := c.write(reqHead)
	p2 := c.write("\r\n")
	h.want(p1, false)
	h.want(p2, false)
	// Later packets of the flow are dropped without a decision.
	p3 := c.write("more")
	h.want(p3, false)
	if s := h.c.stats(); s.Verdicts[DropFlowRefused] != 1 || s.Refused != 1 {
		t.Errorf("stats %s, want one refusal and one packet dropped for it", s.String())
	}
	h.out.mu.Lock()
	rsts := h.out.rsts
	h.out.mu.Unlock()
	want := []rstInfo{{
		client: netip.AddrPortFrom(cli4, 40002), server: netip.AddrPortFrom(srv4, 8080),
		seq: c.ack, ack: 1001 + uint32(len(reqHead)) + 2, hw: [6]byte{2, 0, 0, 0, 0, 1}, ifindex: 7,
	}}
	if diff := cmp.Diff(want, rsts, cmp.AllowUnexported(rstInfo{}), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("RSTs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"release 40002 1001", "refuse 40002"}, h.dp.log()); diff != "" {
		t.Errorf("fast path updates (-want +got):\n%s", diff)
	}
}

func TestCoreKeepAliveEachRequest(t *testing.T) {
	dec := byHost(map[string]Verdict{"a.test": Release, "b.test": Refuse})
	h := newHarness(t, dec, nil)
	c := h.dial(cli4, srv4, 40003, 80)
	p1 := c.write(reqHead + "\r\n")
	h.want(p1, true)
	p2 := c.write("GET /y HTTP/1.1\r\nHost: a.test\r\n\r\n")
	h.want(p2, true)
	p3 := c.write("GET /z HTTP/1.1\r\nHost: b.test\r\n\r\n")
	h.want(p3, false)
	if n := len(dec.events()); n != 3 {
		t.Fatalf("%d decisions, want 3", n)
	}
}

func TestCoreHoldThenResolve(t *testing.T) {
	var ticket atomic.Uint64
	dec := newDecider(func(Meta, decide.Event) Outcome {
		return Outcome{Verdict: Hold, Ticket: ticket.Add(1)}
	})
	h := newHarness(t, dec, nil)
	c := h.dial(cli4, srv4, 40004, 80)
	p := c.write(reqHead + "\r\n")
	<-dec.calls
	h.pending(p)
	if h.c.stats().Held != 1 {
		t.Fatal("not counted as held")
	}
	if !h.c.resolve(Resolution{Ticket: 1, Verdict: Release}) {
		t.Fatal("ticket 1 not held")
	}
	h.want(p, true)
	if h.c.resolve(Resolution{Ticket: 1, Verdict: Refuse}) {
		t.Fatal("a settled ticket was taken again")
	}
	// Held, then refused.
	c2 := h.dial(cli4, srv4, 40005, 80)
	p2 := c2.write(reqHead + "\r\n")
	<-dec.calls
	h.pending(p2)
	h.c.resolve(Resolution{Ticket: 2, Verdict: Refuse})
	h.want(p2, false)
	if s := h.c.stats(); s.Deferred != 2 || s.Released != 1 || s.Refused != 1 {
		t.Errorf("stats %s", s.String())
	}
}

// A resolution that arrives before its hold is registered (piggy-backed
// on another decision) is kept and applied.
func TestCoreEarlyResolution(t *testing.T) {
	first := true
	var mu sync.Mutex
	dec := newDecider(func(Meta, decide.Event) Outcome {
		mu.Lock()
		defer mu.Unlock()
		if first {
			first = false
			return Outcome{Verdict: Release, Resolutions: []Resolution{{Ticket: 99, Verdict: Release}}}
		}
		return Outcome{Verdict: Hold, Ticket: 99}
	})
	h := newHarness(t, dec, func(c *Config) { c.DecideWorkers = 1 })
	c := h.dial(cli4, srv4, 40006, 80)
	h.want(c.write(reqHead+"\r\n"), true)
	c2 := h.dial(cli4, srv4, 40007, 80)
	h.want(c2.write(reqHead+"\r\n"), true) // held under ticket 99, already resolved
}

func TestCoreHoldTimeout(t *testing.T) {
	dec := newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: Hold, Ticket: 5} })
	h := newHarness(t, dec, func(c *Config) {
		c.HoldTimeout = 700 * time.Millisecond
		c.Parser.PendingTimeout = 200 * time.Millisecond
	})
	c := h.dial(cli4, srv4, 40008, 80)
	p := c.write(reqHead + "\r\n")
	h.want(p, false)
	h.waitRSTs(1) // the refusal drops the held packets first, then resets the client
	if s := h.c.stats(); s.Verdicts[DropHoldTimeout] != 1 || s.RSTs != 1 {
		t.Errorf("stats %s, want a hold timeout and a RST", s.String())
	}
	if h.c.resolve(Resolution{Ticket: 5, Verdict: Release}) {
		t.Error("a timed-out ticket was still held")
	}
	// An incomplete request is decided by what it sent after the parser's
	// pending timeout, before the hold deadline.
	dec2 := always(Refuse)
	h2 := newHarness(t, dec2, func(c *Config) { c.HoldTimeout = 2 * time.Second; c.Parser.PendingTimeout = 200 * time.Millisecond })
	c2 := h2.dial(cli4, srv4, 40009, 80)
	p2 := c2.write("GET /never-ends HTTP/1.1\r\nHost: a.test\r\n")
	h2.want(p2, false)
	if evs := dec2.events(); len(evs) != 1 || !evs[0].Opaque {
		t.Errorf("incomplete request decided as %v, want one opaque effect", evs)
	}
}

func TestCoreBodyInParts(t *testing.T) {
	dec := byHost(map[string]Verdict{"a.test": Release})
	h := newHarness(t, dec, func(c *Config) {
		c.Parser.PendingTimeout = 200 * time.Millisecond
		c.PartAfter = 50 * time.Millisecond
		c.PartHoldBack = 500
	})
	c := h.dial(cli4, srv4, 40010, 80)
	body := strings.Repeat("b", 3000)
	head := fmt.Sprintf("POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: %d\r\n\r\n", len(body))
	// The client sends the head and part of the body, then stalls (as a
	// client limited by its congestion window would).
	p1 := c.write(head + body[:1000])
	p2 := c.write(body[1000:2000])
	h.want(p1, true) // head decided after the pending timeout, then the part
	// p2 holds the last PartHoldBack bytes: it goes with the rest.
	p3 := c.write(body[2000:])
	h.want(p2, true)
	h.want(p3, true)
	evs := dec.events()
	var parts []string
	for _, ev := range evs {
		for _, f := range ev.Fields {
			if f.Name == "part" {
				parts = append(parts, f.Value)
			}
		}
	}
	if len(parts) < 3 || parts[0] != "head" || parts[1] != "body" || parts[len(parts)-1] != "body" {
		t.Fatalf("decided parts %q, want head, body part(s), whole body", parts)
	}
	last := evs[len(evs)-1]
	if last.Content != body {
		t.Errorf("the last decision carries %d bytes of body, want the whole %d", len(last.Content), len(body))
	}
}

// A value that straddles a stall in a body decided in parts is seen
// whole before any of it goes out: a part keeps its last PartHoldBack
// bytes held, and they are decided again with what follows.
func TestCorePartHoldsBackStraddlingValue(t *testing.T) {
	dec := newDecider(func(m Meta, ev decide.Event) Outcome {
		if strings.Contains(ev.Content, "SECRETTOKEN") {
			return Outcome{Verdict: Refuse}
		}
		return Outcome{Verdict: Release}
	})
	h := newHarness(t, dec, func(c *Config) {
		c.Parser.PendingTimeout = 200 * time.Millisecond
		c.PartAfter = 50 * time.Millisecond
		c.PartHoldBack = 100
	})
	c := h.dial(cli4, srv4, 40011, 80)
	body := strings.Repeat("b", 2000) + strings.Repeat("x", 200) + "SECRETTOKEN" + strings.Repeat("c", 500)
	head := fmt.Sprintf("POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: %d\r\n\r\n", len(body))
	p1 := c.write(head + body[:2000])
	p2 := c.write(body[2000:2206]) // ends inside the value: ...SECRET
	// The client stalls: the first part is decided and released up to
	// p1; p2, the last bytes held, stays held.
	h.want(p1, true)
	p3 := c.write(body[2206:]) // TOKEN and the rest
	h.want(p2, false)
	h.want(p3, false)
}

func TestCoreDatagrams(t *testing.T) {
	dec := newDecider(func(m Meta, ev decide.Event) Outcome {
		switch {
		case ev.Op == "dns:query" && strings.Contains(ev.Obj, "leak"):
			return Outcome{Verdict: Refuse}
		case ev.Op == "ip:opaque":
			return Outcome{Verdict: Refuse}
		}
		return Outcome{Verdict: Release}
	})
	h := newHarness(t, dec, nil)
	h.want(h.send(udpPkt(t, cli4, srv4, 5353, 53, dnsQuery(t, "ok.example"))), true)
	h.want(h.send(udpPkt(t, cli4, srv4, 5353, 53, dnsQuery(t, "c2VjcmV0.leak.example"))), false)
	h.want(h.send(udpPkt(t, cli6, srv6, 5000, 9000, []byte("hello"))), true)
	ip, _ := ipLayer(cli4, srv4, 253)
	h.want(h.send(serialize(t, ip, gopacket.Payload("opaque"))), false)
	icmp := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(8, 0), Id: 3, Seq: 1}
	ip4, _ := ipLayer(cli4, srv4, layers.IPProtocolICMPv4)
	h.want(h.send(serialize(t, ip4, icmp, gopacket.Payload("ping payload"))), true)
	ops := []string{}
	for _, ev := range dec.events() {
		ops = append(ops, ev.Op)
	}
	if diff := cmp.Diff([]string{"dns:query", "dns:query", "udp:datagram", "ip:opaque", "icmp:echo"}, ops); diff != "" {
		t.Errorf("decided (-want +got):\n%s", diff)
	}
	h.out.mu.Lock()
	nun := len(h.out.unreach)
	h.out.mu.Unlock()
	if nun != 1 { // the refused DNS query; not ICMP, not the opaque protocol
		t.Errorf("%d ICMP errors sent, want 1 (for the refused UDP datagram)", nun)
	}
	// Datagrams are decided each: no fast-path release for them.
	if calls := h.dp.log(); len(calls) != 0 {
		t.Errorf("fast path updates %q, want none", calls)
	}
}

func TestCoreMalformedAndPanics(t *testing.T) {
	dec := newDecider(func(Meta, decide.Event) Outcome { panic("decider bug") })
	h := newHarness(t, dec, nil)
	h.want(h.send([]byte{0x45, 0, 0}), false)
	h.want(h.send([]byte("not an ip packet at all")), false)
	h.want(h.send(udpPkt(t, cli4, srv4, 1, 2, []byte("x"))), false)
	s := h.c.stats()
	if s.Verdicts[DropMalformed] != 2 || s.Verdicts[DropDecideError] != 1 || s.Panics != 1 {
		t.Errorf("stats %s", s.String())
	}
}

func TestCoreNonsenseOutcome(t *testing.T) {
	h := newHarness(t, newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: Hold} }), nil)
	h.want(h.send(udpPkt(t, cli4, srv4, 1, 2, []byte("x"))), false) // a hold without a ticket
	h2 := newHarness(t, newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: 42} }), nil)
	h2.want(h2.send(udpPkt(t, cli4, srv4, 1, 2, []byte("x"))), false)
}

func TestCoreWorkerPanic(t *testing.T) {
	h := newHarness(t, always(Release), nil)
	h.c.testHookHandle = func(p *packet) {
		if p.pk.key.DstPort == 666 {
			panic("worker bug")
		}
	}
	c := h.dial(cli4, srv4, 40011, 80)
	held := c.write(reqHead) // incomplete: held
	h.pending(held)
	h.want(h.send(udpPkt(t, cli4, srv4, 1, 666, []byte("boom"))), false)
	h.want(held, false) // the worker's state was reset: its held packets dropped
	h.want(h.send(udpPkt(t, cli4, srv4, 1, 667, []byte("fine"))), true)
	if s := h.c.stats(); s.Panics != 1 || s.Verdicts[DropPanic] != 2 {
		t.Errorf("stats %s", s.String())
	}
	h.c.stats()
}

func TestCoreFlowLimit(t *testing.T) {
	h := newHarness(t, always(Release), func(c *Config) { c.FlowPackets = 2 })
	c := h.dial(cli4, srv4, 40012, 80)
	p1 := c.write("GET /")
	p2 := c.write("aaaa")
	p3 := c.write("bbbb")
	h.want(p1, false)
	h.want(p2, false)
	h.want(p3, false)
	if s := h.c.stats(); s.Verdicts[DropFlowLimit] != 3 {
		t.Errorf("stats %s", s.String())
	}
}

func TestCoreDuplicateOfHeld(t *testing.T) {
	var ticket atomic.Uint64
	dec := newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: Hold, Ticket: ticket.Add(1)} })
	h := newHarness(t, dec, nil)
	c := h.dial(cli4, srv4, 40013, 80)
	seq := c.next
	p := c.write(reqHead + "\r\n")
	<-dec.calls
	dup := c.at(seq, reqHead+"\r\n")
	h.want(dup, false)
	h.pending(p)
	h.c.resolve(Resolution{Ticket: 1, Verdict: Release})
	h.want(p, true)
}

func TestCoreShutdownDropsHeld(t *testing.T) {
	dec := newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: Hold, Ticket: 1} })
	h := newHarness(t, dec, nil)
	c := h.dial(cli4, srv4, 40014, 80)
	p1 := c.write(reqHead + "\r\n")
	p2 := h.send(udpPkt(t, cli4, srv4, 1, 2, []byte("held too")))
	<-dec.calls
	partial := h.dial(cli4, srv4, 40015, 80).write("GET /incomplete")
	h.pending(p1)
	h.c.stop()
	for _, id := range []uint32{p1, p2, partial} {
		h.want(id, false)
	}
	// After the stop a packet is dropped at once.
	h.want(h.send(udpPkt(t, cli4, srv4, 1, 2, []byte("late"))), false)
	if s := h.c.stats(); s.Verdicts[DropShutdown] != 4 || s.Held != 0 {
		t.Errorf("stats %s", s.String())
	}
}

func TestCoreOverload(t *testing.T) {
	block := make(chan struct{})
	dec := newDecider(func(Meta, decide.Event) Outcome { <-block; return Outcome{Verdict: Release} })
	h := newHarness(t, dec, func(c *Config) { c.MaxQueueLen = 8; c.DecideWorkers = 1 })
	var ids []uint32
	for i := 0; i < 80; i++ {
		ids = append(ids, h.send(udpPkt(t, cli4, srv4, uint16(1000+i), 9, []byte("x"))))
	}
	time.Sleep(200 * time.Millisecond)
	close(block)
	for _, id := range ids {
		h.verdict(id)
	}
	s := h.c.stats()
	if s.Verdicts[DropBudget]+s.Verdicts[DropOverload] == 0 {
		t.Errorf("stats %s: nothing refused for the budget or the decision queue", s.String())
	}
	if s.Held != 0 {
		t.Errorf("%d still held", s.Held)
	}
}

// TestCoreRandomTraffic drives random interleavings of several
// connections (out of order, duplicates, random verdicts) and checks the
// invariants: one verdict per packet, and no byte of a refused request
// is ever accepted.
func TestCoreRandomTraffic(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			dec := byHost(map[string]Verdict{"ok.test": Release, "no.test": Refuse})
			h := newHarness(t, dec, func(c *Config) { c.Parser.PendingTimeout = 300 * time.Millisecond })
			type sent struct {
				id      uint32
				refused bool
			}
			var all []sent
			for c := 0; c < 4; c++ {
				hostName := "ok.test"
				if r.IntN(2) == 0 {
					hostName = "no.test"
				}
				cn := h.dial(cli4, srv4, uint16(41000+c), 80)
				req := "GET /" + strings.Repeat("p", r.IntN(3000)) + " HTTP/1.1\r\nHost: " + hostName + "\r\n\r\n"
				// Cut into segments, send in a shuffled order with
				// duplicates.
				type seg struct {
					seq  uint32
					data string
				}
				var segs []seg
				for off := 0; off < len(req); {
					n := 1 + r.IntN(700)
					n = min(n, len(req)-off)
					segs = append(segs, seg{cn.next + uint32(off), req[off : off+n]})
					off += n
				}
				r.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
				for _, s := range segs {
					all = append(all, sent{cn.at(s.seq, s.data), hostName == "no.test"})
					if r.IntN(4) == 0 {
						all = append(all, sent{cn.at(s.seq, s.data), hostName == "no.test"})
					}
				}
			}
			for _, s := range all {
				if h.verdict(s.id) && s.refused {
					t.Fatalf("packet %d of a refused request was accepted", s.id)
				}
			}
		})
	}
}

func TestConfigValidation(t *testing.T) {
	ok := Config{MaxQueueLen: 16, Decider: always(Release)}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no queue len", func(c *Config) { c.MaxQueueLen = 0 }, "MaxQueueLen is required"},
		{"no decider", func(c *Config) { c.Decider = nil }, "Decider is required"},
		{"relative netns", func(c *Config) { c.NetNS = "run/netns/x" }, "not an absolute path"},
		{"negative", func(c *Config) { c.Workers = -1 }, "Workers is negative"},
		{"short packets", func(c *Config) { c.MaxPacketLen = 100 }, "below 1280"},
		{"held over queue", func(c *Config) { c.MaxHeld = 17 }, "exceeds MaxQueueLen"},
		{"mark outside mask", func(c *Config) { c.MarkMask, c.PassMark = 0xff, 0x100 }, "inside MarkMask"},
		{"pending over hold", func(c *Config) { c.HoldTimeout = time.Second; c.Parser.PendingTimeout = 2 * time.Second }, "below HoldTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.mod(&c)
			_, err := c.withDefaults(2)
			if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want ErrConfig with %q", err, tc.want)
			}
		})
	}
	c, err := ok.withDefaults(3)
	if err != nil {
		t.Fatal(err)
	}
	if c.Workers != 3 || c.MaxHeld != 12 || c.PassMark != tcx.MarkPass || c.MarkMask != tcx.MarkMask || c.Parser.PendingTimeout != DefaultPendingTimeout {
		t.Errorf("defaults: %+v", c)
	}
}

var _ = net.IPv4len

// TestCoreDatagramOrder: a flow's datagrams get their verdicts in the
// order they arrived even when their decisions complete out of order.
func TestCoreDatagramOrder(t *testing.T) {
	dec := newDecider(func(_ Meta, ev decide.Event) Outcome {
		if ev.Content == "slow" {
			time.Sleep(200 * time.Millisecond)
		}
		return Outcome{Verdict: Release}
	})
	h := newHarness(t, dec, nil)
	a := h.send(udpPkt(t, cli4, srv4, 7000, 7001, []byte("slow")))
	b := h.send(udpPkt(t, cli4, srv4, 7000, 7001, []byte("fast")))
	other := h.send(udpPkt(t, cli4, srv4, 7002, 7001, []byte("other flow")))
	h.want(other, true) // another flow does not wait
	h.want(a, true)
	h.want(b, true)
	h.out.mu.Lock()
	order := append([]uint32(nil), h.out.order...)
	h.out.mu.Unlock()
	if len(order) != 3 || order[0] != other || order[1] != a || order[2] != b {
		t.Fatalf("verdict order %v, want %d (other flow), %d, %d", order, other, a, b)
	}
}

// A body part whose decision takes longer than the parser's pending
// timeout does not make the rest of the upload one opaque effect: the
// client, whose window the held part filled, can only send more once the
// part is released, and the wait for the rest restarts then. (Under load
// a real upload was refused mid-body this way: TestOffloadTCP.)
func TestCoreSlowPartKeepsTheUpload(t *testing.T) {
	const pt = 2 * time.Second
	dec := newDecider(func(m Meta, ev decide.Event) Outcome {
		if ev.Opaque {
			return Outcome{Verdict: Refuse}
		}
		for _, f := range ev.Fields {
			if f.Name == "part" && f.Value == "body" {
				time.Sleep(2 * pt) // a slow decision of a body part
			}
		}
		return Outcome{Verdict: Release}
	})
	h := newHarness(t, dec, func(c *Config) {
		c.HoldTimeout = 30 * time.Second
		c.Parser.PendingTimeout = pt
		c.PartAfter = 50 * time.Millisecond
		c.PartHoldBack = 100
	})
	c := h.dial(cli4, srv4, 40012, 80)
	body := strings.Repeat("b", 3000)
	head := fmt.Sprintf("POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: %d\r\n\r\n", len(body))
	p1 := c.write(head + body[:1000])
	p2 := c.write(body[1000:2000])
	h.want(p1, true) // the head, then the first part, decided slowly
	// The client's next bytes come a round trip after the release (its
	// window reopens), several of the loop's ticks later, well within
	// the pending timeout.
	time.Sleep(pt / 8)
	p3 := c.write(body[2000:])
	h.want(p2, true)
	h.want(p3, true)
	for _, ev := range dec.events() {
		if ev.Opaque {
			t.Fatalf("the rest of the upload was decided as an opaque effect: %+v", ev)
		}
	}
}
