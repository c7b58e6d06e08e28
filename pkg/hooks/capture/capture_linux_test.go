package capture

import (
	"bytes"
	"os/exec"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

func TestCaptureBothDirections(t *testing.T) {
	testutil.RequireRoot(t)
	a := testutil.NewNetNS(t)
	b := testutil.NewNetNS(t)
	ifa, ifb := testutil.UniqueName("ca"), testutil.UniqueName("cb")
	testutil.Run(t, "ip", "-n", a, "link", "add", ifa, "type", "veth", "peer", "name", ifb, "netns", b)
	testutil.Run(t, "ip", "-n", a, "addr", "add", "10.77.0.1/30", "dev", ifa)
	testutil.Run(t, "ip", "-n", b, "addr", "add", "10.77.0.2/30", "dev", ifb)
	testutil.Run(t, "ip", "-n", a, "link", "set", ifa, "up")
	testutil.Run(t, "ip", "-n", b, "link", "set", ifb, "up")
	c, err := Start(ifa, "/run/netns/"+a, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if out, err := exec.Command("ip", "netns", "exec", b, "ping", "-c", "2", "-W", "2", "-p", "cafe", "10.77.0.1").CombinedOutput(); err != nil {
		t.Fatalf("ping: %v\n%s", err, out)
	}
	time.Sleep(300 * time.Millisecond)
	recs, _ := c.Records()
	var in, out int
	for _, r := range recs {
		p := gopacket.NewPacket(r.Data, layers.LayerTypeEthernet, gopacket.Default)
		icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok {
			continue
		}
		switch {
		case icmp.TypeCode.Type() == layers.ICMPv4TypeEchoRequest && r.Dir == Egress:
			in++
		case icmp.TypeCode.Type() == layers.ICMPv4TypeEchoReply && r.Dir == Ingress:
			out++
		}
	}
	if in != 2 || out != 2 {
		t.Fatalf("captured %d requests from the peer and %d replies to it, want 2 and 2 (%d frames)", in, out, len(recs))
	}
	var buf bytes.Buffer
	if err := c.WritePcapng(&buf, func(r Record) Annotation { return Annotation{Verdict: "release", Reason: "test"} }); err != nil {
		t.Fatal(err)
	}
	rd, err := pcapgo.NewNgReader(&buf, pcapgo.DefaultNgReaderOptions)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, _, err := rd.ReadPacketData(); err != nil {
			break
		}
		n++
	}
	if n != len(recs) {
		t.Errorf("pcapng holds %d frames, capture %d", n, len(recs))
	}
}
