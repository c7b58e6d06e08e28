package netparse

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/google/gopacket/layers"
)

// checkEffects asserts what holds for any effect of any input.
func checkEffects(t *testing.T, r *Result) {
	t.Helper()
	if r.Action == Decide && len(r.Effects) == 0 && r.Packet != nil {
		t.Fatalf("decide without effects")
	}
	if (r.Action == Refuse || r.Action == Drop) && r.Err == nil {
		t.Fatalf("%v without a reason", r.Action)
	}
	for i := range r.Effects {
		e := &r.Effects[i]
		ev := e.Event()
		if ev.Op == "" || ev.Obj == "" {
			t.Fatalf("effect without op or object: %+v", ev)
		}
		if (e.Opaque != nil) != ev.Opaque || ev.Opaque != IsOpaque(&ev) {
			t.Fatalf("opaque flag inconsistent")
		}
		if e.Span == SpanBytes && int32(e.End-e.Seq) <= 0 {
			t.Fatalf("empty byte span [%d,%d)", e.Seq, e.End)
		}
	}
}

func FuzzDecodePacket(f *testing.F) {
	src, dst := ap("10.0.0.2:40000"), ap("10.0.0.9:80")
	s6, d6 := ap("[fd00::2]:40000"), ap("[fd00::9]:53")
	f.Add(tcpPkt(f, src, dst, 1, FlagSYN, nil))
	f.Add(tcpPkt(f, src, dst, 2, FlagACK|FlagPSH, []byte(getA)))
	f.Add(udpPkt(f, s6, d6, dnsQuery(f, 1, "x.example.", 1)))
	f.Add(ip6Raw(s6.Addr(), d6.Addr(), protoHopByHop, concat(ext6(protoFragment, []byte{5, 2, 0, 0, 1, 0}), frag6(ProtoUDP, 0, true, 7), make([]byte, 16))))
	f.Add(frag4(f, src.Addr(), dst.Addr(), layers.IPProtocolUDP, 3, 8, false, []byte("tail")))
	f.Add(ipPkt(f, src.Addr(), dst.Addr(), layers.IPProtocolICMPv4, []byte{8, 0, 0xf7, 0xfe, 0, 1, 0, 0}))
	f.Fuzz(func(t *testing.T, pkt []byte) {
		p := newParser(t, Config{})
		orig := append([]byte(nil), pkt...)
		for _, csum := range []bool{false, true} {
			r := p.Feed(pkt, Meta{Time: t0, ChecksumNotReady: csum})
			checkEffects(t, r)
			if !bytes.Equal(pkt, orig) {
				t.Fatalf("Feed modified the packet")
			}
		}
	})
}

// streamEffects feeds stream (client bytes after the SYN) cut at the given
// offsets and returns the effects as strings.
// fuzzConfig has small limits (and a small retention, so that trimming
// runs) to reach the bounds with small inputs.
var fuzzConfig = Config{MaxHeaderBytes: 2048, MaxBodyBytes: 1024, RetainBytes: 32}

func streamEffects(t *testing.T, port uint16, stream []byte, cuts []int) ([]string, bool) {
	p := newParser(t, fuzzConfig)
	c := newClient(t, p, "10.0.0.2:40000", fmt.Sprintf("10.0.0.9:%d", port), 0xfffffff0)
	c.syn()
	var out []string
	at := 0
	for _, cut := range append(cuts, len(stream)) {
		if cut <= at || cut > len(stream) {
			continue
		}
		r := c.data(at, string(stream[at:cut]))
		checkEffects(t, r)
		if r.Action == Refuse || r.Action == Drop {
			t.Fatalf("in-order segment %v: %v", r.Action, r.Err)
		}
		for i := range r.Effects {
			out = append(out, effectKey(c, &r.Effects[i]))
		}
		at = cut
	}
	r := c.fin(len(stream), "")
	for i := range r.Effects {
		out = append(out, effectKey(c, &r.Effects[i]))
	}
	return out, true
}

func effectKey(c *client, e *Effect) string {
	ev := e.Event()
	end := int64(-1)
	if e.Span == SpanBytes {
		end = int64(e.End - c.seq(0))
	}
	reason, content := "", ev.Content
	if e.Opaque != nil && e.Kind != KindHTTP {
		// An opaque stream's content is what had arrived when it was
		// decided, which depends on the segments.
		content = ""
	}
	if e.Opaque != nil && e.Kind != KindTCPOpaque {
		// Parse errors quote bytes near where they stopped: compare the
		// kind of reason only.
		for _, s := range []error{ErrHTTP, ErrTLS, ErrDNS, ErrOversized, ErrOpaqueProto, ErrOpaqueTLS, ErrOpaqueTunnel, ErrStreamEnded} {
			if errors.Is(e.Opaque, s) {
				reason = s.Error()
			}
		}
	}
	return fmt.Sprintf("%s %s %v [%d,%d) %q %s %d", ev.Op, ev.Obj, e.Span, e.Seq-c.seq(0), end, content, reason, len(ev.Fields))
}

// FuzzHTTP checks that how a stream is cut into segments never changes
// the effects (for HTTP, TLS and DNS over TCP streams).
func FuzzHTTP(f *testing.F) {
	f.Add([]byte(getA+getB+post), uint16(80), uint16(5), uint16(60))
	f.Add([]byte("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nT: v\r\n\r\n"+getB), uint16(80), uint16(40), uint16(70))
	f.Add([]byte("PUT /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"), uint16(8080), uint16(1), uint16(2))
	f.Add([]byte("CONNECT h:443 HTTP/1.1\r\n\r\n\x16\x03\x01"), uint16(3128), uint16(10), uint16(30))
	f.Add([]byte("\r\nGET / HTTP/1.0\n\n"), uint16(80), uint16(1), uint16(3))
	f.Add(append([]byte{0, 12}, dnsQuery(f, 1, "a.", 1)[:12]...), uint16(53), uint16(2), uint16(9))
	window := newParser(f, fuzzConfig).window()
	f.Fuzz(func(t *testing.T, stream []byte, port, c1, c2 uint16) {
		// Beyond the window a whole stream is not one acceptable segment.
		if len(stream) == 0 || len(stream) > window {
			return
		}
		whole, _ := streamEffects(t, port, stream, nil)
		cut, _ := streamEffects(t, port, stream, []int{int(c1) % len(stream), int(c2) % len(stream)})
		if fmt.Sprint(whole) != fmt.Sprint(cut) {
			t.Fatalf("segmentation changed the effects:\nwhole: %q\ncut:   %q", whole, cut)
		}
	})
}

// capturedClientHello returns the ClientHello record of testdata/tls.pcap
// (Go's crypto/tls client, captured by TestCapture).
func capturedClientHello(tb testing.TB) []byte {
	pkts, _ := readPcap(tb, "testdata/tls.pcap")
	d := NewDecoder(false)
	for _, pkt := range pkts {
		if pk, err := d.Decode(pkt); err == nil && pk.Proto == ProtoTCP && pk.DstPort == 8443 && len(pk.Payload) > 0 {
			return append([]byte(nil), pk.Payload...)
		}
	}
	tb.Fatal("no clienthello in testdata/tls.pcap")
	return nil
}

func FuzzTLSClientHello(f *testing.F) {
	rec := capturedClientHello(f)
	f.Add(rec)
	f.Add(rec[:100])
	f.Add(append([]byte{22, 3, 1, 0, 4}, 1, 0, 0, 0))
	f.Fuzz(func(t *testing.T, b []byte) {
		scratch := new([]byte)
		msg, st, err := clientHelloFromRecords(b, 1<<16, scratch)
		if (st == tlsBad) != (err != nil) {
			t.Fatalf("status %v with err %v", st, err)
		}
		var ch ClientHello
		if st == tlsDone {
			if err := parseClientHelloMsg(msg, &ch); err == nil && len(ch.SNI) > 0 && !bytes.Contains(msg, ch.SNI) {
				t.Fatalf("sni not from the message")
			}
		}
		_ = parseClientHello(b, &ch)
	})
}

func FuzzDNS(f *testing.F) {
	f.Add(dnsQuery(f, 1, "www.example.com.", 1))
	f.Add([]byte{0, 1, 0x81, 0x80, 0, 1, 0, 1, 0, 0, 0, 0, 1, 'a', 0, 0, 1, 0, 1, 0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 1, 0, 2, 0xc0, 12})
	f.Fuzz(func(t *testing.T, msg []byte) {
		var q DNSQuery
		if err := parseDNSQuery(msg, &q); err == nil {
			for _, qq := range q.Questions {
				if len(qq.Name) == 0 || len(qq.Name) > 4*maxNameWire {
					t.Fatalf("name of %d bytes", len(qq.Name))
				}
			}
		}
		if a, err := ParseDNSAnswer(msg); err == nil {
			for name, addrs := range a.Addrs() {
				if name == "" || len(addrs) == 0 {
					t.Fatalf("empty mapping %q %v", name, addrs)
				}
			}
		}
	})
}

// FuzzQUICInitial fuzzes both the protected packet and, through the test
// encoder, the decrypted frames: a packet the encoder protected always
// decrypts.
func FuzzQUICInitial(f *testing.F) {
	v := rfcVectors(f, "rfc9001-a.txt")
	f.Add(v["protected"], v["crypto_frame"])
	f.Add(v["protected"][:60], []byte{0x02, 0, 0, 0, 0, 0x06, 0, 1, 1})
	f.Add([]byte{0xc3, 0x6b, 0x33, 0x43, 0xcf, 0}, []byte{0x1c, 0, 0, 0})
	f.Fuzz(func(t *testing.T, pkt, frames []byte) {
		var d quicDecoder
		var q QUICInitial
		_ = d.parse(pkt, &q)
		if len(frames) == 0 || len(frames) > 1500 {
			return
		}
		dcid := []byte{9, 8, 7, 6, 5, 4, 3, 2}
		payload := append(append([]byte(nil), frames...), make([]byte, max(0, 20-len(frames)))...)
		enc, _, _ := protectInitial(t, QUICv1, dcid, initialHeader(QUICv1, dcid, 1, len(payload)), payload)
		if err := d.parse(enc, &q); err != nil {
			t.Fatalf("header of an encoded packet: %v", err)
		}
		if q.Opaque != nil && bytes.Contains([]byte(q.Opaque.Error()), []byte("decryption failed")) {
			t.Fatalf("encoded packet did not decrypt")
		}
	})
}

// FuzzReassembly drives TCP segments and IP fragments in fuzzed order,
// sizes and duplicates over fixed data: consistent bytes never refuse,
// and once everything arrived the effects are those of the whole data.
func FuzzReassembly(f *testing.F) {
	f.Add([]byte{3, 10, 0, 40, 1, 20, 2, 200, 5, 7})
	f.Add([]byte{0, 0, 0, 0, 255, 255})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 256 {
			return
		}
		stream := []byte(getA + post + getB)
		want, _ := streamEffects(t, 80, stream, nil)
		p := newParser(t, fuzzConfig)
		c := newClient(t, p, "10.0.0.2:40000", "10.0.0.9:80", 0xfffffff0)
		c.syn()
		var got []string
		for i := 0; i+1 < len(ops); i += 2 {
			off := int(ops[i]) % len(stream)
			n := 1 + int(ops[i+1])%64
			r := c.data(off, string(stream[off:min(off+n, len(stream))]))
			if r.Action == Refuse {
				t.Fatalf("consistent segment refused: %v", r.Err)
			}
			for j := range r.Effects {
				got = append(got, effectKey(c, &r.Effects[j]))
			}
		}
		for off := 0; off < len(stream); off += 50 {
			r := c.data(off, string(stream[off:min(off+50, len(stream))]))
			if r.Action == Refuse {
				t.Fatalf("consistent segment refused: %v", r.Err)
			}
			for j := range r.Effects {
				got = append(got, effectKey(c, &r.Effects[j]))
			}
		}
		r := c.fin(len(stream), "")
		for j := range r.Effects {
			got = append(got, effectKey(c, &r.Effects[j]))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("effects differ:\nwant %q\ngot  %q", want, got)
		}

		// Fragments of one UDP datagram: units of 8 bytes, fuzzed order.
		payload := bytes.Repeat([]byte("0123456789abcdef"), 8)
		l4 := udpL4(t, ap("10.0.0.2:1000"), ap("10.0.0.53:9"), payload)
		fp := newParser(t, Config{})
		done := false
		for i := 0; i+1 < len(ops) && !done; i += 2 {
			off := int(ops[i]) % (len(l4) / 8) * 8
			end := min(off+8*(1+int(ops[i+1])%4), len(l4))
			last := end == len(l4)
			if !last && (end-off)%8 != 0 {
				continue
			}
			r := fp.Feed(frag4(t, ap("10.0.0.2:0").Addr(), ap("10.0.0.53:0").Addr(), layers.IPProtocolUDP, 5, off, !last, l4[off:end]), Meta{Time: t0})
			switch r.Action {
			case Decide:
				if !bytes.Equal(r.Effects[0].Content, payload) {
					t.Fatalf("reassembled payload differs")
				}
				done = true
			case Refuse:
				if !errors.Is(r.Err, ErrFragOverlap) && !errors.Is(r.Err, ErrFragRefused) && !errors.Is(r.Err, ErrFragTooMany) {
					t.Fatalf("fragment refused: %v", r.Err)
				}
				return
			}
		}
	})
}
