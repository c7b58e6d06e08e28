package netparse

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Worst-case cost of the stream parsers: adversarial streams that a
// guest controls (where it cuts them, how long it makes each line), sent
// one byte per segment and in MSS-sized segments. The bound the parser
// is built to (docs/fuzzing.md): O(1) amortised work per stream byte,
// whatever the segmentation, and at most 2*RetainBytes + 2*MaxHeaderBytes
// + MaxBodyBytes of buffer per flow. BenchmarkWorstCase reports ns/B for
// each; TestWorstCaseMemory checks the memory bound.

type worstCase struct {
	name   string
	port   uint16
	stream []byte
}

func worstCases(tb testing.TB, cfg Config) []worstCase {
	c, err := cfg.withDefaults()
	if err != nil {
		tb.Fatal(err)
	}
	h, body := c.MaxHeaderBytes, c.MaxBodyBytes
	var cases []worstCase
	add := func(name string, port uint16, s []byte) { cases = append(cases, worstCase{name, port, s}) }

	// A request line as long as the head may be, its end last.
	add("long request line", 80, []byte("GET /"+strings.Repeat("a", h-40)+" HTTP/1.1\r\nHost: h\r\n\r\n"))
	// A head of many short lines (the field count bound ends it).
	add("many header lines", 80, []byte("GET / HTTP/1.1\r\n"+strings.Repeat("a:\r\n", (h-40)/4)+"\r\n"))
	// A chunked body of one-byte chunks up to the wire bound.
	add("one-byte chunks", 80, []byte("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"+
		strings.Repeat("1\r\nx\r\n", (body+h)/6-16)+"0\r\n\r\n"))
	// A trailer line as long as the wire bound allows.
	add("long trailer line", 80, []byte("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: "+
		strings.Repeat("v", body)+"\r\n\r\n"))
	// Pipelined minimal requests.
	add("pipelined tiny requests", 80, bytes.Repeat([]byte("GET / HTTP/1.1\r\n\r\n"), body/18))
	// A ClientHello of one-byte records, as long as the bound allows.
	msgLen := (h+80)/6 - 8
	msg := append([]byte{1, byte(msgLen >> 16), byte(msgLen >> 8), byte(msgLen)}, make([]byte, msgLen)...)
	var recs []byte
	for _, m := range msg {
		recs = append(recs, 22, 3, 1, 0, 1, m)
	}
	add("one-byte tls records", 443, recs)
	// DNS over TCP: minimal messages back to back.
	q := dnsQuery(tb, 1, "a.", 1)
	var dns []byte
	for len(dns) < body {
		dns = binary.BigEndian.AppendUint16(dns, uint16(len(q)))
		dns = append(dns, q...)
	}
	add("dns over tcp", 53, dns)
	return cases
}

// segmentPackets builds the SYN and the data packets of stream cut into
// segments of size bytes.
func segmentPackets(tb testing.TB, port uint16, stream []byte, size int) (syn []byte, pkts [][]byte) {
	c := newClient(tb, nil, "10.0.0.2:40000", fmt.Sprintf("10.0.0.9:%d", port), 1)
	syn = tcpPkt(tb, c.src, c.dst, c.isn, FlagSYN, nil)
	if size == 1 {
		// One template, patched: serialising a million packets would
		// cost more than parsing them (fed with ChecksumNotReady).
		tmpl := tcpPkt(tb, c.src, c.dst, c.seq(0), FlagACK|FlagPSH, []byte{0})
		for off, ch := range stream {
			pkt := append([]byte(nil), tmpl...)
			binary.BigEndian.PutUint32(pkt[20+4:], c.seq(off))
			pkt[len(pkt)-1] = ch
			pkts = append(pkts, pkt)
		}
		return syn, pkts
	}
	for off := 0; off < len(stream); off += size {
		end := min(off+size, len(stream))
		pkts = append(pkts, tcpPkt(tb, c.src, c.dst, c.seq(off), FlagACK|FlagPSH, stream[off:end]))
	}
	return syn, pkts
}

// BenchmarkWorstCase runs each stream at two scales (the default limits
// and a quarter of them): a cost per byte that stays flat from one to the
// other is linear.
func BenchmarkWorstCase(b *testing.B) {
	for _, cfg := range []Config{
		{PendingTimeout: time.Hour, MaxHeaderBytes: 16 << 10, MaxBodyBytes: 64 << 10},
		{PendingTimeout: time.Hour},
	} {
		for _, wc := range worstCases(b, cfg) {
			for _, size := range []int{1, 1400} {
				b.Run(fmt.Sprintf("%s/%dKiB/%dB-segments", strings.ReplaceAll(wc.name, " ", "-"), len(wc.stream)>>10, size), func(b *testing.B) {
					syn, pkts := segmentPackets(b, wc.port, wc.stream, size)
					b.SetBytes(int64(len(wc.stream)))
					b.ResetTimer()
					for range b.N {
						b.StopTimer()
						p := newParser(b, cfg)
						p.Feed(syn, Meta{Time: t0})
						b.StartTimer()
						for _, pkt := range pkts {
							p.Feed(pkt, Meta{Time: t0, ChecksumNotReady: true})
						}
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(wc.stream)), "ns/B")
				})
			}
		}
	}
}

// TestWorstCaseMemory feeds every adversarial stream one byte per
// segment and checks the parser's buffers never pass the per-flow bound,
// and that each stream ends decided (no byte left waiting).
func TestWorstCaseMemory(t *testing.T) {
	cfg := Config{PendingTimeout: time.Hour}
	c, _ := cfg.withDefaults()
	bound := 2*c.RetainBytes + 2*c.MaxHeaderBytes + c.MaxBodyBytes
	for _, wc := range worstCases(t, cfg) {
		syn, pkts := segmentPackets(t, wc.port, wc.stream, 1)
		p := newParser(t, cfg)
		p.Feed(syn, Meta{Time: t0})
		peak, effects := 0, 0
		for _, pkt := range pkts {
			r := p.Feed(pkt, Meta{Time: t0, ChecksumNotReady: true})
			if r.Action == Refuse || r.Action == Drop {
				t.Fatalf("%s: %v %v", wc.name, r.Action, r.Err)
			}
			effects += len(r.Effects)
			peak = max(peak, p.streamBytes)
		}
		if peak > bound {
			t.Errorf("%s: %d bytes buffered for one flow, bound %d", wc.name, peak, bound)
		}
		if effects == 0 {
			t.Errorf("%s: no effect", wc.name)
		}
		t.Logf("%s: %d bytes, %d effects, peak buffer %d (bound %d)", wc.name, len(wc.stream), effects, peak, bound)
	}
}
