package capture

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

func tcpFrame(t *testing.T, dst string, payload string) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: net.ParseIP("10.200.0.2"), DstIP: net.ParseIP(dst)}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 80, Seq: 1, PSH: true, ACK: true, Window: 512}
	_ = tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeSample(t *testing.T) []byte {
	var b bytes.Buffer
	w, err := NewWriter(&b, "cbh-demo", LinkTypeEthernet, 65535)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 123456789)
	if err := w.WritePacket(ts, tcpFrame(t, "192.0.2.10", "POST /share HTTP/1.1\r\n\r\n"), 0, Egress, Annotation{Verdict: "refuse", Seq: 7, Reason: "uncleared: carries secret data"}); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(ts.Add(time.Millisecond), tcpFrame(t, "192.0.2.20", "GET / HTTP/1.1\r\n\r\n"), 0, Egress, Annotation{Verdict: "release", Seq: 8, Reason: "trusted"}); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(ts.Add(2*time.Millisecond), tcpFrame(t, "192.0.2.30", "x"), 0, Ingress, Annotation{}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestPcapngReadsBackWithPcapgo(t *testing.T) {
	data := writeSample(t)
	r, err := pcapgo.NewNgReader(bytes.NewReader(data), pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeEthernet {
		t.Errorf("link type %v", r.LinkType())
	}
	n := 0
	for {
		pkt, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		n++
		if n == 1 && (ci.Timestamp.UnixNano() != 1700000000123456789 || !bytes.Contains(pkt, []byte("POST /share"))) {
			t.Errorf("packet 1: ts %v, data %q", ci.Timestamp.UnixNano(), pkt)
		}
	}
	if n != 3 {
		t.Errorf("read %d packets, want 3", n)
	}
}

// tshark, the analysts' tool, shows the verdicts.
func TestPcapngVerdictsInTshark(t *testing.T) {
	tshark := os.Getenv("CARBD_TSHARK")
	if tshark == "" {
		var err error
		if tshark, err = exec.LookPath("tshark"); err != nil {
			if os.Getenv("CARBD_CI") != "" {
				t.Fatal("tshark is not installed but CI must have it")
			}
			t.Skip("skipping: tshark is not installed (make setup installs it)")
		}
	}
	f := filepath.Join(t.TempDir(), "audit.pcapng")
	if err := os.WriteFile(f, writeSample(t), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(tshark, "-r", f, "-T", "fields", "-E", "separator=|", "-e", "ip.dst", "-e", "frame.comment").Output()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{"192.0.2.10|carbd: refuse #7: uncleared: carries secret data", "192.0.2.20|carbd: release #8: trusted", "192.0.2.30|"}
	if len(lines) != len(want) {
		t.Fatalf("tshark printed:\n%s", out)
	}
	for i := range want {
		if strings.TrimSpace(lines[i]) != want[i] {
			t.Errorf("line %d: %q, want %q", i, lines[i], want[i])
		}
	}
	out, err = exec.Command(tshark, "-r", f, "-V").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "Verdict") {
		t.Errorf("tshark does not show the pcapng verdict option:\n%s", out)
	}
}
