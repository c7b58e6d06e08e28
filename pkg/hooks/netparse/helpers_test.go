package netparse

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/net/dns/dnsmessage"
)

// Test packets are built with gopacket's serializer, so checksums come
// from an implementation independent of the parser's.

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func netLayer(src, dst netip.Addr, proto layers.IPProtocol) gopacket.NetworkLayer {
	if src.Is4() {
		return &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice())}
	}
	return &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: proto, SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice())}
}

func serialize(tb testing.TB, ls ...gopacket.SerializableLayer) []byte {
	tb.Helper()
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		tb.Fatalf("serialize: %v", err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

// tcpL4 returns a TCP header and payload with the checksum for src, dst.
func tcpL4(tb testing.TB, src, dst netip.AddrPort, seq uint32, fl TCPFlags, payload []byte) []byte {
	tb.Helper()
	nl := netLayer(src.Addr(), dst.Addr(), layers.IPProtocolTCP)
	t := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: seq, Ack: 1,
		Window: 65535, FIN: fl&FlagFIN != 0, SYN: fl&FlagSYN != 0, RST: fl&FlagRST != 0, PSH: fl&FlagPSH != 0,
		ACK: fl&FlagACK != 0}
	if err := t.SetNetworkLayerForChecksum(nl); err != nil {
		tb.Fatal(err)
	}
	return serialize(tb, t, gopacket.Payload(payload))
}

func udpL4(tb testing.TB, src, dst netip.AddrPort, payload []byte) []byte {
	tb.Helper()
	nl := netLayer(src.Addr(), dst.Addr(), layers.IPProtocolUDP)
	u := &layers.UDP{SrcPort: layers.UDPPort(src.Port()), DstPort: layers.UDPPort(dst.Port())}
	if err := u.SetNetworkLayerForChecksum(nl); err != nil {
		tb.Fatal(err)
	}
	return serialize(tb, u, gopacket.Payload(payload))
}

// ipPkt wraps a transport payload in an IP header (no extension headers).
func ipPkt(tb testing.TB, src, dst netip.Addr, proto layers.IPProtocol, l4 []byte) []byte {
	tb.Helper()
	nl := netLayer(src, dst, proto)
	return serialize(tb, nl.(gopacket.SerializableLayer), gopacket.Payload(l4))
}

func tcpPkt(tb testing.TB, src, dst netip.AddrPort, seq uint32, fl TCPFlags, payload []byte) []byte {
	tb.Helper()
	return ipPkt(tb, src.Addr(), dst.Addr(), layers.IPProtocolTCP, tcpL4(tb, src, dst, seq, fl, payload))
}

func udpPkt(tb testing.TB, src, dst netip.AddrPort, payload []byte) []byte {
	tb.Helper()
	return ipPkt(tb, src.Addr(), dst.Addr(), layers.IPProtocolUDP, udpL4(tb, src, dst, payload))
}

// ip6Raw builds an IPv6 packet by hand: header, then rest (extension
// headers and transport) with next header nh.
func ip6Raw(src, dst netip.Addr, nh uint8, rest []byte) []byte {
	b := make([]byte, 40, 40+len(rest))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:6], uint16(len(rest)))
	b[6], b[7] = nh, 64
	s, d := src.As16(), dst.As16()
	copy(b[8:24], s[:])
	copy(b[24:40], d[:])
	return append(b, rest...)
}

// ext6 builds an extension header of 8*(n+1) bytes: next header, length,
// then body padded with zeros.
func ext6(nh uint8, body []byte) []byte {
	n := (len(body) + 2 + 7) / 8 * 8
	b := make([]byte, n)
	b[0], b[1] = nh, byte(n/8-1)
	copy(b[2:], body)
	return b
}

// frag6 builds an IPv6 fragment header.
func frag6(nh uint8, off int, more bool, id uint32) []byte {
	b := make([]byte, 8)
	b[0] = nh
	v := uint16(off/8) << 3
	if more {
		v |= 1
	}
	binary.BigEndian.PutUint16(b[2:4], v)
	binary.BigEndian.PutUint32(b[4:8], id)
	return b
}

// frag4 builds an IPv4 fragment with the given slice of the datagram's
// payload.
func frag4(tb testing.TB, src, dst netip.Addr, proto layers.IPProtocol, id uint16, off int, more bool, data []byte) []byte {
	tb.Helper()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: proto, Id: id, FragOffset: uint16(off / 8),
		SrcIP: net.IP(src.AsSlice()), DstIP: net.IP(dst.AsSlice())}
	if more {
		ip.Flags = layers.IPv4MoreFragments
	}
	return serialize(tb, ip, gopacket.Payload(data))
}

// client drives one TCP connection from the guest.
type client struct {
	tb       testing.TB
	p        *Parser
	src, dst netip.AddrPort
	isn      uint32
	at       time.Time
}

func newClient(tb testing.TB, p *Parser, src, dst string, isn uint32) *client {
	// p may be nil to only build packets.
	return &client{tb: tb, p: p, src: ap(src), dst: ap(dst), isn: isn, at: t0}
}

// feed sends a packet and returns the result.
func (c *client) feed(pkt []byte) *Result {
	c.at = c.at.Add(time.Millisecond)
	return c.p.Feed(pkt, Meta{Time: c.at})
}

func (c *client) syn() *Result {
	return c.feed(tcpPkt(c.tb, c.src, c.dst, c.isn, FlagSYN, nil))
}

// data sends payload at offset off of the stream (0 = first byte after
// the SYN).
func (c *client) data(off int, payload string) *Result {
	return c.feed(tcpPkt(c.tb, c.src, c.dst, c.isn+1+uint32(off), FlagACK|FlagPSH, []byte(payload)))
}

func (c *client) fin(off int, payload string) *Result {
	return c.feed(tcpPkt(c.tb, c.src, c.dst, c.isn+1+uint32(off), FlagACK|FlagFIN, []byte(payload)))
}

// seq is the sequence number of stream offset off.
func (c *client) seq(off int) uint32 { return c.isn + 1 + uint32(off) }

func newParser(tb testing.TB, cfg Config) *Parser {
	tb.Helper()
	p, err := NewParser(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// realClientHello returns the first TLS record Go's crypto/tls client
// sends for serverName.
func realClientHello(tb testing.TB, serverName string, alpn []string) []byte {
	tb.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, NextProtos: alpn, MinVersion: tls.VersionTLS12})
		_ = c.Handshake() // fails when the pipe closes
	}()
	_ = b.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		tb.Fatalf("read clienthello: %v", err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		tb.Fatalf("read clienthello: %v", err)
	}
	return append(hdr, body...)
}

// dnsQuery builds a query with x/net's dnsmessage (an encoder independent
// of the parser).
func dnsQuery(tb testing.TB, id uint16, name string, qtype uint16) []byte {
	tb.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		tb.Fatal(err)
	}
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.Type(qtype), Class: dnsmessage.ClassINET}); err != nil {
		tb.Fatal(err)
	}
	if err := b.StartAdditionals(); err != nil {
		tb.Fatal(err)
	}
	var opt dnsmessage.ResourceHeader
	if err := opt.SetEDNS0(1232, dnsmessage.RCodeSuccess, false); err != nil {
		tb.Fatal(err)
	}
	if err := b.OPTResource(opt, dnsmessage.OPTResource{}); err != nil {
		tb.Fatal(err)
	}
	msg, err := b.Finish()
	if err != nil {
		tb.Fatal(err)
	}
	return msg
}

func gopacketPayload(b []byte) gopacket.SerializableLayer { return gopacket.Payload(b) }
