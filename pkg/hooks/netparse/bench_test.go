package netparse

import (
	"fmt"
	"testing"
	"time"
)

// benchStream returns a SYN and the packets of n kept-alive requests, each
// split in two segments (the first is held, the second completes it).
func benchStream(tb testing.TB, src string, n int) (syn []byte, pkts [][]byte) {
	c := newClient(tb, nil, src, "93.184.216.34:80", 1000)
	syn = tcpPkt(tb, c.src, c.dst, c.isn, FlagSYN, nil)
	off := 0
	for i := 0; i < n; i++ {
		pkts = append(pkts, tcpPkt(tb, c.src, c.dst, c.seq(off), FlagACK|FlagPSH, []byte(getA[:20])))
		pkts = append(pkts, tcpPkt(tb, c.src, c.dst, c.seq(off+20), FlagACK|FlagPSH, []byte(getA[20:])))
		off += len(getA)
	}
	return syn, pkts
}

// TestNoAllocHotPath checks that a data segment of an established flow
// and a DNS query decode and classify without allocating.
func TestNoAllocHotPath(t *testing.T) {
	p := newParser(t, Config{})
	syn, pkts := benchStream(t, "10.0.0.2:40000", 600)
	m := Meta{Time: t0}
	p.Feed(syn, m)
	for _, pkt := range pkts[:200] { // warm up the buffers
		p.Feed(pkt, m)
	}
	i, decided := 200, 0
	var last *Result
	allocs := testing.AllocsPerRun(300, func() {
		last = p.Feed(pkts[i], m)
		if last.Action == Decide && len(last.Effects) == 1 {
			decided++
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("tcp data segment: %v allocations per packet", allocs)
	}
	if decided != 150 {
		t.Fatalf("tcp: %d requests decided, want 150", decided)
	}
	dns := udpPkt(t, ap("10.0.0.2:5353"), ap("10.0.0.53:53"), dnsQuery(t, 1, "www.example.com.", 1))
	p.Feed(dns, m)
	allocs = testing.AllocsPerRun(300, func() { last = p.Feed(dns, m) })
	if allocs != 0 {
		t.Errorf("dns query: %v allocations per packet", allocs)
	}
	if last.Action != Decide || last.Effects[0].Kind != KindDNS {
		t.Fatalf("dns: last result %v", last.Action)
	}
}

func BenchmarkFeedTCPData(b *testing.B) {
	const n = 4096
	syn, pkts := benchStream(b, "10.0.0.2:40000", n)
	p := newParser(b, Config{})
	m := Meta{Time: t0}
	p.Feed(syn, m)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i % len(pkts)
		if j == 0 && i > 0 {
			p.Forget(ap("10.0.0.2:40000"), ap("93.184.216.34:80"))
			p.Feed(syn, m)
		}
		if r := p.Feed(pkts[j], m); r.Action != Hold && r.Action != Decide {
			b.Fatalf("%v %v", r.Action, r.Err)
		}
	}
}

func BenchmarkFeedDNSQuery(b *testing.B) {
	p := newParser(b, Config{})
	pkt := udpPkt(b, ap("10.0.0.2:5353"), ap("10.0.0.53:53"), dnsQuery(b, 1, "www.example.com.", 1))
	m := Meta{Time: t0}
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for i := 0; i < b.N; i++ {
		if r := p.Feed(pkt, m); r.Action != Decide {
			b.Fatal(r.Err)
		}
	}
}

func BenchmarkFeedTCPAck(b *testing.B) {
	p := newParser(b, Config{})
	c := newClient(b, p, "10.0.0.2:40000", "93.184.216.34:80", 1)
	c.syn()
	ack := tcpPkt(b, c.src, c.dst, c.seq(0), FlagACK, nil)
	m := Meta{Time: t0}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if r := p.Feed(ack, m); r.Action != NoData {
			b.Fatal(r.Action)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	pkt := tcpPkt(b, ap("10.0.0.2:40000"), ap("93.184.216.34:80"), 1, FlagACK|FlagPSH, []byte(post))
	d := NewDecoder(true)
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for i := 0; i < b.N; i++ {
		if _, err := d.Decode(pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHTTPParse(b *testing.B) {
	req := []byte("POST /v1/chat/completions?stream=false HTTP/1.1\r\nHost: api.example.com\r\n" +
		"User-Agent: agent/1.0\r\nAccept: application/json\r\nAuthorization: Bearer sk-0123456789abcdef\r\n" +
		"Content-Type: application/json\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n" +
		"Content-Length: 256\r\n\r\n" + string(make([]byte, 256)))
	cfg, _ := Config{}.withDefaults()
	var scratch, out HTTPRequest
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for i := 0; i < b.N; i++ {
		var s reqScan
		st, n, err := s.advance(req, &cfg, &scratch)
		if st != scanDone || int(n) != len(req) || err != nil {
			b.Fatal(st, n, err)
		}
		out.reset()
		if err := parseHead(req[:s.headLen], &out); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkQUICInitial(b *testing.B) {
	v := rfcVectors(b, "rfc9001-a.txt")
	pkt := v["protected"]
	b.Run("same-dcid", func(b *testing.B) {
		var d quicDecoder
		var q QUICInitial
		b.ReportAllocs()
		b.SetBytes(int64(len(pkt)))
		for i := 0; i < b.N; i++ {
			if err := d.parse(pkt, &q); err != nil || !q.HelloOK {
				b.Fatal(err, q.Opaque)
			}
		}
	})
	b.Run("new-dcid", func(b *testing.B) {
		// Each packet of a new connection: key derivation included.
		var d quicDecoder
		var q QUICInitial
		b.ReportAllocs()
		b.SetBytes(int64(len(pkt)))
		for i := 0; i < b.N; i++ {
			d.keys = nil
			if err := d.parse(pkt, &q); err != nil || !q.HelloOK {
				b.Fatal(err, q.Opaque)
			}
		}
	})
}

func BenchmarkEvent(b *testing.B) {
	p := newParser(b, Config{})
	c := newClient(b, p, "10.0.0.2:40000", "93.184.216.34:80", 1)
	c.syn()
	r := c.data(0, "POST /a?x=1&token=t HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer x\r\nContent-Length: 5\r\n\r\nhello")
	e := r.Effects[0]
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if ev := e.Event(); ev.Op != "http:POST" {
			b.Fatal(ev.Op)
		}
	}
}

func BenchmarkFlows(b *testing.B) {
	// A new connection per request: SYN, request, FIN.
	p := newParser(b, Config{})
	pkts := make([][3][]byte, 256)
	for i := range pkts {
		c := newClient(b, nil, fmt.Sprintf("10.0.%d.%d:4000", i/250, i%250+1), "93.184.216.34:80", 1)
		pkts[i] = [3][]byte{tcpPkt(b, c.src, c.dst, c.isn, FlagSYN, nil),
			tcpPkt(b, c.src, c.dst, c.seq(0), FlagACK|FlagPSH, []byte(getA)),
			tcpPkt(b, c.src, c.dst, c.seq(len(getA)), FlagACK|FlagFIN, nil)}
	}
	m := Meta{Time: t0}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		f := pkts[i%len(pkts)]
		p.Feed(f[0], m)
		if r := p.Feed(f[1], m); r.Action != Decide {
			b.Fatal(r.Action, r.Err)
		}
		p.Feed(f[2], m)
		if i%len(pkts) == len(pkts)-1 {
			m.Time = m.Time.Add(time.Hour)
			p.Expire(m.Time)
		}
	}
}
