package respwatch

import (
	"bytes"
	"compress/gzip"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// framed is one frame with its direction.
type framed struct {
	data []byte
	dir  capture.Direction
}

// conn builds the frames of one TCP connection between a guest (client)
// and a server, as the host side of the guest's interface sees them.
type conn struct {
	tb         testing.TB
	cli, srv   netip.AddrPort
	cISN, sISN uint32
	cseq, sseq uint32 // next sequence numbers
}

func newConn(tb testing.TB, cli, srv string) *conn {
	c := &conn{tb: tb, cli: netip.MustParseAddrPort(cli), srv: netip.MustParseAddrPort(srv), cISN: 1000, sISN: 4_294_960_000}
	c.cseq, c.sseq = c.cISN+1, c.sISN+1
	return c
}

// frame builds one segment. fromClient picks the direction.
func (c *conn) frame(fromClient bool, seq, ack uint32, syn, fin, rst bool, payload []byte) framed {
	c.tb.Helper()
	src, dst := c.srv, c.cli
	dir := capture.Ingress
	if fromClient {
		src, dst, dir = c.cli, c.srv, capture.Egress
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), Seq: seq, Ack: ack,
		SYN: syn, FIN: fin, RST: rst, ACK: !(syn && fromClient) && !rst, Window: 65535, PSH: len(payload) > 0}
	var ip gopacket.SerializableLayer
	if src.Addr().Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		_ = tcp.SetNetworkLayerForChecksum(ip4)
		ip = ip4
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip6 := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
		_ = tcp.SetNetworkLayerForChecksum(ip6)
		ip = ip6
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, tcp, gopacket.Payload(payload)); err != nil {
		c.tb.Fatal(err)
	}
	return framed{data: append([]byte(nil), buf.Bytes()...), dir: dir}
}

func (c *conn) handshake() []framed {
	return []framed{
		c.frame(true, c.cISN, 0, true, false, false, nil),
		c.frame(false, c.sISN, c.cISN+1, true, false, false, nil),
		c.frame(true, c.cISN+1, c.sISN+1, false, false, false, nil),
	}
}

// send is the client sending b in one segment.
func (c *conn) send(b string) framed {
	f := c.frame(true, c.cseq, c.sseq, false, false, false, []byte(b))
	c.cseq += uint32(len(b))
	return f
}

// reply is the server sending b in segments of at most mss bytes.
func (c *conn) reply(b string, mss int) []framed {
	var out []framed
	for len(b) > 0 {
		n := min(len(b), mss)
		out = append(out, c.frame(false, c.sseq, c.cseq, false, false, false, []byte(b[:n])))
		c.sseq += uint32(n)
		b = b[n:]
	}
	return out
}

// ack is the client acknowledging everything the server sent.
func (c *conn) ack() framed { return c.frame(true, c.cseq, c.sseq, false, false, false, nil) }

// serverFin closes the server's side.
func (c *conn) serverFin() framed {
	f := c.frame(false, c.sseq, c.cseq, false, true, false, nil)
	c.sseq++
	return f
}

func (c *conn) serverRST() framed { return c.frame(false, c.sseq, 0, false, false, true, nil) }

// feedAll feeds frames and collects the events.
func feedAll(tb testing.TB, tr *Tracker, frames []framed) []decide.Event {
	tb.Helper()
	var evs []decide.Event
	for _, f := range frames {
		clockMu.Lock()
		clock = clock.Add(time.Millisecond)
		ts := clock
		clockMu.Unlock()
		res := tr.Feed(ts, f.data, f.dir)
		evs = append(evs, res.Events...)
	}
	return evs
}

// clock gives frames fed by feedAll increasing times.
var (
	clockMu sync.Mutex
	clock   = time.Unix(1_700_000_000, 0)
)

func newTracker(tb testing.TB, cfg Config) *Tracker {
	tb.Helper()
	tr, err := NewTracker(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return tr
}

func get(path, host string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: test\r\nAccept: */*\r\n\r\n"
}

func okResponse(body string, extra ...string) string {
	h := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + itoa(len(body)) + "\r\n"
	for _, e := range extra {
		h += e + "\r\n"
	}
	return h + "\r\n" + body
}

func itoa(n int) string { return strconv.Itoa(n) }

func gz(tb testing.TB, s string) string {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	if _, err := w.Write([]byte(s)); err != nil {
		tb.Fatal(err)
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.String()
}

func field(ev *decide.Event, name string) (string, bool) {
	for _, f := range ev.Fields {
		if f.Name == name {
			return f.Value, true
		}
	}
	return "", false
}

func cat(parts ...[]framed) []framed {
	var out []framed
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func one(f framed) []framed { return []framed{f} }

// bodies returns the ops, objects and contents of events, for compact
// comparisons.
type evSummary struct {
	Op, Obj, Source, Content string
	Opaque                   bool
}

func summarize(evs []decide.Event) []evSummary {
	out := make([]evSummary, 0, len(evs))
	for _, e := range evs {
		out = append(out, evSummary{Op: e.Op, Obj: e.Obj, Source: e.Source, Content: e.Content, Opaque: e.Opaque})
	}
	return out
}

func netipAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
