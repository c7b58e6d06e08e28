package netparse

import (
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// Captures of real traffic (made by TestCapture as root, inside a private
// network namespace) replayed without root. Loopback leaves TCP and UDP
// checksums to offload, so the packets are fed with ChecksumNotReady, as
// NFQUEUE reports such packets.

// captured is one effect seen while replaying a capture.
type captured struct {
	ev       decide.Event
	span     Span
	seq, end uint32
	src      netip.AddrPort
}

type replay struct {
	effects []captured
	answers []*DNSAnswer
	actions map[Action]int
}

// serverPorts are the ports of the capture's servers: packets to them are
// the guest's egress.
var serverPorts = map[uint16]bool{8080: true, 8443: true, 53: true}

// readPcap returns the IP packets of a pcap file (raw IP or Ethernet, as
// tcpdump writes on loopback).
func readPcap(t testing.TB, path string) ([][]byte, []time.Time) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var pkts [][]byte
	var times []time.Time
	for {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch r.LinkType() {
		case layers.LinkTypeEthernet:
			if len(data) < 14 {
				continue
			}
			if et := binary.BigEndian.Uint16(data[12:14]); et != 0x0800 && et != 0x86dd {
				continue
			}
			data = data[14:]
		case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
		default:
			t.Fatalf("%s: link type %v", path, r.LinkType())
		}
		pkts = append(pkts, data)
		times = append(times, ci.Timestamp)
	}
	return pkts, times
}

// replayPcap feeds the guest-to-world packets of a capture to a parser
// and collects the effects; DNS responses are parsed as answers.
func replayPcap(t testing.TB, path string) *replay {
	t.Helper()
	pkts, times := readPcap(t, path)
	t.Logf("%s: %d packets", path, len(pkts))
	p := newParser(t, Config{})
	d := NewDecoder(false)
	out := &replay{actions: map[Action]int{}}
	for i, pkt := range pkts {
		pk, err := d.Decode(pkt)
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		switch {
		case pk.Proto == ProtoUDP && pk.SrcPort == 53:
			a, err := ParseDNSAnswer(pk.Payload)
			if err != nil {
				t.Fatalf("packet %d: dns answer: %v", i, err)
			}
			out.answers = append(out.answers, a)
			continue
		case pk.Proto == ProtoTCP || pk.Proto == ProtoUDP:
			if !serverPorts[pk.DstPort] {
				continue // the server's side
			}
		case pk.Proto == ProtoICMP && pk.ICMPType != 8, pk.Proto == ProtoICMPv6 && pk.ICMPType != 128:
			continue // replies and other messages from the responder's side
		}
		res := p.Feed(pkt, Meta{Time: times[i], ChecksumNotReady: true})
		out.actions[res.Action]++
		if res.Action == Refuse || res.Action == Drop {
			t.Errorf("packet %d: %v: %v", i, res.Action, res.Err)
		}
		for j := range res.Effects {
			e := &res.Effects[j]
			out.effects = append(out.effects, captured{ev: e.Event(), span: e.Span, seq: e.Seq, end: e.End, src: e.Src})
		}
	}
	return out
}

func (r *replay) find(t testing.TB, op, obj string) *captured {
	t.Helper()
	for i := range r.effects {
		if r.effects[i].ev.Op == op && r.effects[i].ev.Obj == obj {
			return &r.effects[i]
		}
	}
	var have []string
	for _, e := range r.effects {
		reason, _ := field(&e.ev, FieldOpaqueReason)
		have = append(have, e.ev.Op+" "+e.ev.Obj+" "+e.span.String()+" "+reason.Value+" "+strings.ReplaceAll(e.ev.Content[:min(len(e.ev.Content), 80)], "\r\n", "|"))
	}
	t.Fatalf("no %s %s among:\n%s", op, obj, strings.Join(have, "\n"))
	return nil
}

func field(ev *decide.Event, name string) (decide.Field, bool) {
	for _, f := range ev.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return decide.Field{}, false
}

// Expectations per capture: what the test's clients sent.

func checkHTTPCapture(t *testing.T, r *replay) {
	get := r.find(t, "http:GET", "http://127.0.0.1:8080/hello?name=carbd")
	if f, ok := field(&get.ev, "header.authorization"); !ok || f.Role != decide.RoleCredential || f.Value != "Bearer t0ken" {
		t.Errorf("authorization field %+v", f)
	}
	if f, ok := field(&get.ev, "query.name"); !ok || f.Value != "carbd" || f.Role != decide.RoleSelector {
		t.Errorf("query field %+v", f)
	}
	// The second request of the kept-alive connection starts where the
	// first ended.
	again := r.find(t, "http:GET", "http://127.0.0.1:8080/again")
	if again.src != get.src || again.seq != get.end || get.span != SpanBytes || again.span != SpanBytes {
		t.Errorf("keep-alive ranges: first %v [%d,%d) from %v, second [%d,%d) from %v", get.span, get.seq, get.end, get.src, again.seq, again.end, again.src)
	}
	post := r.find(t, "http:POST", "http://127.0.0.1:8080/submit")
	if post.ev.Content != "secret=42&user=agent" {
		t.Errorf("post content %q", post.ev.Content)
	}
	chunked := r.find(t, "http:POST", "http://127.0.0.1:8080/chunked")
	if chunked.ev.Content != strings.Repeat("chunky-", 300) {
		t.Errorf("chunked content %d bytes", len(chunked.ev.Content))
	}
	// Expect: 100-continue: the head is decided first, then the body.
	var parts []string
	for _, e := range r.effects {
		if e.ev.Obj == "http://127.0.0.1:8080/upload" {
			f, _ := field(&e.ev, FieldPart)
			parts = append(parts, f.Value+":"+e.ev.Content[:min(len(e.ev.Content), 10)])
		}
	}
	if strings.Join(parts, ",") != "head:,body:upload-dat" {
		t.Errorf("expect-continue parts %q", parts)
	}
	v6 := r.find(t, "http:GET", "http://[::1]:8080/v6")
	if v6.ev.Dest.Addr != netip.MustParseAddr("::1") || v6.ev.Dest.Proto != "tcp" {
		t.Errorf("v6 dest %+v", v6.ev.Dest)
	}
	split := r.find(t, "http:POST", "http://127.0.0.1:8080/split")
	if split.ev.Content != "split-body-1234" {
		t.Errorf("split content %q", split.ev.Content)
	}
	if r.actions[Hold] < 3 {
		t.Errorf("the pieces of the split request were not held: %v", r.actions)
	}
	p1 := r.find(t, "http:GET", "http://127.0.0.1:8080/p1")
	p2 := r.find(t, "http:GET", "http://127.0.0.1:8080/p2")
	if p1.src != split.src || p1.seq != split.end || p2.seq != p1.end || p2.end-p1.seq != 2*(p1.end-p1.seq) {
		t.Errorf("pipelined ranges: split [%d,%d) p1 [%d,%d) p2 [%d,%d)", split.seq, split.end, p1.seq, p1.end, p2.seq, p2.end)
	}
}

func checkDNSCapture(t *testing.T, r *replay) {
	udp := r.find(t, "dns:query", "exfil-test.example")
	if f, _ := field(&udp.ev, FieldQType); f.Value != "A" || udp.ev.Dest.Proto != "udp" || udp.ev.Dest.Port != 53 {
		t.Errorf("udp query %+v", udp.ev)
	}
	tcp := r.find(t, "dns:query", "tcp-test.example")
	if f, _ := field(&tcp.ev, FieldQType); f.Value != "AAAA" || tcp.ev.Dest.Proto != "tcp" || tcp.span != SpanBytes {
		t.Errorf("tcp query %+v %v", tcp.ev, tcp.span)
	}
	r.find(t, "dns:query", "alias.example")
	addrs := map[string][]netip.Addr{}
	for _, a := range r.answers {
		for k, v := range a.Addrs() {
			addrs[k] = append(addrs[k], v...)
		}
	}
	for name, want := range map[string]string{"exfil-test.example": "192.0.2.53", "alias.example": "192.0.2.54", "target.example": "192.0.2.54"} {
		if len(addrs[name]) == 0 || addrs[name][0] != netip.MustParseAddr(want) {
			t.Errorf("answer for %s: %v, want %s", name, addrs[name], want)
		}
	}
}

func checkTLSCapture(t *testing.T, r *replay) {
	h := r.find(t, "tls:clienthello", "secure.example:8443")
	if f, _ := field(&h.ev, FieldALPN); f.Value != "h2,http/1.1" {
		t.Errorf("alpn %q", f.Value)
	}
	if f, _ := field(&h.ev, FieldSNI); f.Role != decide.RoleTarget {
		t.Errorf("sni role %v", f.Role)
	}
	if !h.ev.Opaque || h.span != SpanOpen {
		t.Errorf("opaque %v span %v", h.ev.Opaque, h.span)
	}
	if r.actions[Covered] == 0 {
		t.Errorf("application data after the handshake was not covered: %v", r.actions)
	}
}

func checkICMPCapture(t *testing.T, r *replay) {
	v4 := r.find(t, "icmp:echo", "127.0.0.1")
	if !strings.Contains(v4.ev.Content, "secret") {
		t.Errorf("echo payload %q", v4.ev.Content)
	}
	v6 := r.find(t, "icmp:echo", "::1")
	if v6.ev.Dest.Proto != "icmpv6" {
		t.Errorf("v6 proto %q", v6.ev.Dest.Proto)
	}
}

var captureChecks = map[string]func(*testing.T, *replay){
	"http": checkHTTPCapture,
	"dns":  checkDNSCapture,
	"tls":  checkTLSCapture,
	"icmp": checkICMPCapture,
}

func TestReplayCaptures(t *testing.T) {
	for name, check := range captureChecks {
		t.Run(name, func(t *testing.T) {
			path := "testdata/" + name + ".pcap"
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("%v (run TestCapture as root with -update-pcaps to make it)", err)
			}
			check(t, replayPcap(t, path))
		})
	}
}
