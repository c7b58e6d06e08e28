package nfq

import (
	"errors"
	"fmt"
	"net"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// nxdomainFrame builds the Ethernet frame of the answer to a refused DNS
// query over UDP (Config.DNSRefusal): from the address and port it was
// sent to, its id, opcode, RD flag and question, QR and RA set, rcode
// NXDOMAIN, no records. It fails for anything but a one-question query.
func nxdomainFrame(u unreachInfo, srcMAC net.HardwareAddr) ([]byte, bool, error) {
	p, err := peek(u.orig)
	if err != nil || p.frag {
		return nil, false, errors.New("nfq: nxdomain: not an unfragmented IP packet")
	}
	first := layers.LayerTypeIPv4
	if p.src.Is6() {
		first = layers.LayerTypeIPv6
	}
	pkt := gopacket.NewPacket(u.orig, first, gopacket.DecodeOptions{NoCopy: true})
	udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if udp == nil {
		return nil, false, errors.New("nfq: nxdomain: not UDP")
	}
	var q layers.DNS
	if err := q.DecodeFromBytes(udp.Payload, gopacket.NilDecodeFeedback); err != nil || q.QR || len(q.Questions) != 1 {
		return nil, false, errors.New("nfq: nxdomain: not a one-question DNS query")
	}
	ans := &layers.DNS{ID: q.ID, QR: true, OpCode: q.OpCode, RD: q.RD, RA: true, ResponseCode: layers.DNSResponseCodeNXDomain,
		Questions: q.Questions}
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: net.HardwareAddr(u.hw[:])}
	out := &layers.UDP{SrcPort: udp.DstPort, DstPort: udp.SrcPort}
	var ip gopacket.NetworkLayer
	if p.src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: p.dst.AsSlice(), DstIP: p.src.AsSlice()}
	}
	if err := out.SetNetworkLayerForChecksum(ip); err != nil {
		return nil, false, fmt.Errorf("nfq: nxdomain: %w", err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip.(gopacket.SerializableLayer), out, ans); err != nil {
		return nil, false, fmt.Errorf("nfq: nxdomain: serialize: %w", err)
	}
	return buf.Bytes(), p.src.Is6(), nil
}
