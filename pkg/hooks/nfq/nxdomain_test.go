package nfq

import (
	"net"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// dnsQueryPacket is an IP packet carrying a DNS query for name from
// client to server, port 40000 to 53.
func dnsQueryPacket(t *testing.T, client, server netip.Addr, name string, edns bool) []byte {
	t.Helper()
	q := &layers.DNS{ID: 0xbeef, RD: true, Questions: []layers.DNSQuestion{{Name: []byte(name), Type: layers.DNSTypeAAAA, Class: layers.DNSClassIN}}}
	if edns {
		q.Additionals = []layers.DNSResourceRecord{{Type: layers.DNSTypeOPT, Class: 1232}}
	}
	udp := &layers.UDP{SrcPort: 40000, DstPort: 53}
	var ip gopacket.NetworkLayer
	if client.Is4() {
		ip = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: client.AsSlice(), DstIP: server.AsSlice()}
	} else {
		ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: client.AsSlice(), DstIP: server.AsSlice()}
	}
	if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip.(gopacket.SerializableLayer), udp, q); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestNXDomainFrame(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	for _, tc := range []struct{ client, server string }{{"10.200.0.2", "10.200.0.1"}, {"fd00::2", "fd00::1"}} {
		client, server := netip.MustParseAddr(tc.client), netip.MustParseAddr(tc.server)
		u := unreachInfo{orig: dnsQueryPacket(t, client, server, "ab.chatgpt.com", true), hw: [6]byte{2, 0, 0, 0, 0, 2}, ifindex: 1, dns: true}
		frame, v6, err := nxdomainFrame(u, mac)
		if err != nil {
			t.Fatal(err)
		}
		if v6 != client.Is6() {
			t.Errorf("v6 = %v", v6)
		}
		pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Fatalf("%s: the answer does not decode: %v", tc.client, el.Error())
		}
		eth := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
		udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		dns := pkt.Layer(layers.LayerTypeDNS).(*layers.DNS)
		src, dst := pkt.NetworkLayer().NetworkFlow().Endpoints()
		if eth.DstMAC.String() != "02:00:00:00:00:02" || src.String() != tc.server || dst.String() != tc.client || udp.SrcPort != 53 || udp.DstPort != 40000 {
			t.Errorf("%s: addressed %s -> %s, %d -> %d, to %s", tc.client, src, dst, udp.SrcPort, udp.DstPort, eth.DstMAC)
		}
		if dns.ID != 0xbeef || !dns.QR || !dns.RD || dns.ResponseCode != layers.DNSResponseCodeNXDomain || len(dns.Questions) != 1 ||
			string(dns.Questions[0].Name) != "ab.chatgpt.com" || dns.Questions[0].Type != layers.DNSTypeAAAA || len(dns.Answers)+len(dns.Additionals) != 0 {
			t.Errorf("%s: answer %+v", tc.client, dns)
		}
		// The UDP checksum is right (the client's stack drops it otherwise).
		if cs, err := udpChecksumOK(frame, v6); err != nil || !cs {
			t.Errorf("%s: udp checksum: %v %v", tc.client, cs, err)
		}
	}
	// Not a DNS query: no answer (the ICMP error is sent instead).
	bad := dnsQueryPacket(t, netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), "x.example", false)
	bad = bad[:len(bad)-6]
	bad[3] = byte(len(bad)) // IPv4 total length
	if _, _, err := nxdomainFrame(unreachInfo{orig: bad, dns: true}, mac); err == nil {
		t.Error("a truncated query was answered")
	}
}

// udpChecksumOK recomputes the UDP checksum of an Ethernet frame.
func udpChecksumOK(frame []byte, v6 bool) (bool, error) {
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	got := udp.Checksum
	cp := *udp
	if err := cp.SetNetworkLayerForChecksum(pkt.NetworkLayer()); err != nil {
		return false, err
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, &cp, gopacket.Payload(udp.Payload)); err != nil {
		return false, err
	}
	want := uint16(buf.Bytes()[6])<<8 | uint16(buf.Bytes()[7])
	return got == want, nil
}
