package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/carbd/carbd/pkg/hooks/capture"
)

func testFrame(t *testing.T, src, dst netip.Addr, payload string, arp bool) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	var ls []gopacket.SerializableLayer
	switch {
	case arp:
		eth.EthernetType = layers.EthernetTypeARP
		ls = []gopacket.SerializableLayer{eth, &layers.ARP{AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4,
			HwAddressSize: 6, ProtAddressSize: 4, Operation: layers.ARPRequest, SourceHwAddress: eth.SrcMAC,
			SourceProtAddress: src.AsSlice(), DstHwAddress: make([]byte, 6), DstProtAddress: dst.AsSlice()}}
	case src.Is6():
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 255, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		udp := &layers.UDP{SrcPort: 4000, DstPort: 5000}
		_ = udp.SetNetworkLayerForChecksum(ip)
		ls = []gopacket.SerializableLayer{eth, ip, udp, gopacket.Payload(payload)}
	default:
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, ACK: true, Window: 100}
		if strings.HasPrefix(payload, "HTTP/") { // the world's answer
			tcp.SrcPort, tcp.DstPort = 80, 40000
		}
		_ = tcp.SetNetworkLayerForChecksum(ip)
		ls = []gopacket.SerializableLayer{eth, ip, tcp, gopacket.Payload(payload)}
	}
	b := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(b, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// annotate's verdicts and when they are final (the streamed audit writes
// a frame then): link-local frames at once; a held flow's never; the
// sandbox's data captured before its flow's latest decision not yet (the
// decision may be about an earlier request); an ACK or an answer from
// the world at once.
func TestAnnotate(t *testing.T) {
	guest, world := netip.MustParseAddr("10.200.0.2"), netip.MustParseAddr("198.18.1.2")
	nc := &netChannel{flows: newLRUTable[flowID, flowNote](16, time.Hour, nil)}
	decided := time.Now()
	id := newFlowID(netip.AddrPortFrom(guest, 40000), netip.AddrPortFrom(world, 80), 6)
	nc.flows.put(id, flowNote{seq: 3, verdict: "release", reason: "provenance: ok", at: decided})
	before, after := decided.Add(-time.Millisecond), decided.Add(time.Millisecond)
	for _, c := range []struct {
		name    string
		rec     capture.Record
		verdict string
		final   bool
	}{
		{"arp", capture.Record{Time: after, Data: testFrame(t, guest, world, "", true), Dir: capture.Egress}, "link-local", true},
		{"ipv6 link-local", capture.Record{Time: after, Data: testFrame(t, netip.MustParseAddr("fe80::1"), netip.MustParseAddr("ff02::2"), "x", false), Dir: capture.Egress}, "link-local", true},
		{"request decided after capture", capture.Record{Time: before, Data: testFrame(t, guest, world, "GET /", false), Dir: capture.Egress}, "release", true},
		{"later request on the connection", capture.Record{Time: after, Data: testFrame(t, guest, world, "GET /2", false), Dir: capture.Egress}, "release", false},
		{"ack", capture.Record{Time: after, Data: testFrame(t, guest, world, "", false), Dir: capture.Egress}, "release", true},
		{"answer", capture.Record{Time: after, Data: testFrame(t, world, guest, "HTTP/1.1 200", false), Dir: capture.Ingress}, "release", true},
		{"other flow", capture.Record{Time: after, Data: testFrame(t, guest, netip.MustParseAddr("198.18.9.9"), "x", false), Dir: capture.Egress}, "undecided", false},
	} {
		a := nc.annotate(c.rec)
		if a.Verdict != c.verdict || a.Final != c.final {
			t.Errorf("%s: %+v, want %s final=%v", c.name, a, c.verdict, c.final)
		}
	}
	nc.flows.put(id, flowNote{seq: 4, verdict: "held", at: time.Now()})
	if a := nc.annotate(capture.Record{Time: before, Data: testFrame(t, guest, world, "POST", false), Dir: capture.Egress}); a.Verdict != "held" || a.Final {
		t.Errorf("held: %+v", a)
	}
}

// Old runs beyond the bound are removed; FindRun finds by id, prefix and
// sandbox (its newest run).
func TestRunsKeptAndFound(t *testing.T) {
	root := t.TempDir()
	runs := filepath.Join(root, "w1", auditRunsDir)
	for i, name := range []string{"20261201T100000Z-aaaaaa", "20261201T110000Z-bbbbbb", "20261201T120000Z-cccccc"} {
		dir := filepath.Join(runs, name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		sb := "s1"
		if i == 2 {
			sb = "s2"
		}
		if err := writeRunInfo(RunInfo{Run: name, Sandbox: sb, Started: time.Date(2026, 12, 1, 10+i, 0, 0, 0, time.UTC), Dir: dir, Pcap: filepath.Join(dir, auditPcapName)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ run, sandbox, want, err string }{
		{"20261201T110000Z-bbbbbb", "", "20261201T110000Z-bbbbbb", ""},
		{"20261201T10", "", "20261201T100000Z-aaaaaa", ""},
		{"20261201T1", "", "", "3 runs begin"},
		{"", "s1", "20261201T110000Z-bbbbbb", ""},
		{"", "s3", "", "no run of sandbox"},
		{"nope", "", "", "no run \"nope\""},
	} {
		got, err := FindRun(root, c.run, c.sandbox)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("FindRun(%q, %q): %v, want error %q", c.run, c.sandbox, err, c.err)
			}
			continue
		}
		if err != nil || got.Run != c.want || got.Dir != filepath.Join(runs, c.want) {
			t.Errorf("FindRun(%q, %q) = %+v, %v; want %s", c.run, c.sandbox, got, err, c.want)
		}
	}
	pruneAuditRuns(runs, 1)
	left, err := ListRuns(root)
	if err != nil || len(left) != 1 || left[0].Run != "20261201T120000Z-cccccc" {
		t.Fatalf("after pruning to 1: %+v %v", left, err)
	}
}
