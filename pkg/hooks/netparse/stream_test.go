package netparse

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// eff summarises an effect relative to a client's stream offsets.
type eff struct {
	Op     string
	Obj    string
	Span   Span
	Start  int
	End    int // -1 for open spans
	Body   string
	Opaque bool
}

func summarize(c *client, e *Effect) eff {
	ev := e.Event()
	s := eff{Op: ev.Op, Obj: ev.Obj, Span: e.Span, Start: int(e.Seq - c.seq(0)), End: -1, Opaque: e.Opaque != nil}
	if e.Span == SpanBytes {
		s.End = int(e.End - c.seq(0))
	}
	if e.Kind == KindHTTP {
		s.Body = string(e.HTTP.Body)
	}
	return s
}

type step struct {
	off  int    // stream offset of the segment
	data string // its bytes
	fin  bool
	want Action
	tail bool
	effs []eff
	err  error // for Refuse and Drop
}

func runSteps(t *testing.T, c *client, steps []step) {
	t.Helper()
	if r := c.syn(); r.Action != NoData {
		t.Fatalf("syn: %v %v", r.Action, r.Err)
	}
	for i, s := range steps {
		var r *Result
		if s.fin {
			r = c.fin(s.off, s.data)
		} else {
			r = c.data(s.off, s.data)
		}
		if r.Action != s.want || r.Tail != s.tail {
			t.Fatalf("step %d (off %d, %q): action %v tail %v (err %v), want %v tail %v", i, s.off, clip([]byte(s.data), 40), r.Action, r.Tail, r.Err, s.want, s.tail)
		}
		if s.err != nil && !errors.Is(r.Err, s.err) {
			t.Fatalf("step %d: err %v, want %v", i, r.Err, s.err)
		}
		var got []eff
		for j := range r.Effects {
			got = append(got, summarize(c, &r.Effects[j]))
		}
		if diff := cmp.Diff(s.effs, got); diff != "" {
			t.Fatalf("step %d effects (-want +got):\n%s", i, diff)
		}
	}
}

const (
	getA = "GET /a?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"
	getB = "GET /b HTTP/1.1\r\nHost: example.com\r\n\r\n"
	post = "POST /up HTTP/1.1\r\nHost: example.com\r\nContent-Length: 11\r\n\r\nhello world"
)

func TestStreamHTTP(t *testing.T) {
	la, lb, lp := len(getA), len(getB), len(post)
	chunked := "POST /c HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Sum: abc\r\n\r\n"
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"one request one segment", Config{}, []step{
			{off: 0, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false}}},
		}},
		{"split request", Config{}, []step{
			{off: 0, data: post[:7], want: Hold},
			{off: 7, data: post[7:50], want: Hold},
			{off: 50, data: post[50:], want: Decide, effs: []eff{{"http:POST", "http://example.com/up", SpanBytes, 0, lp, "hello world", false}}},
		}},
		{"out of order and retransmitted", Config{}, []step{
			{off: 50, data: post[50:], want: Hold},
			{off: 50, data: post[50:], want: Hold}, // retransmission of a held segment
			{off: 0, data: post[:20], want: Hold},
			{off: 20, data: post[20:50], want: Decide, effs: []eff{{"http:POST", "http://example.com/up", SpanBytes, 0, lp, "hello world", false}}},
			{off: 20, data: post[20:60], want: Covered}, // retransmission of decided bytes, resegmented
		}},
		{"pipelined requests with exact ranges", Config{}, []step{
			{off: 0, data: getA + getB + post[:10], want: Decide, tail: true, effs: []eff{
				{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false},
				{"http:GET", "http://example.com/b", SpanBytes, la, la + lb, "", false},
			}},
			{off: la + lb + 10, data: post[10:], want: Decide, effs: []eff{
				{"http:POST", "http://example.com/up", SpanBytes, la + lb, la + lb + lp, "hello world", false},
			}},
			{off: la + lb + lp, data: getA, want: Decide, effs: []eff{
				{"http:GET", "http://example.com/a?x=1", SpanBytes, la + lb + lp, 2*la + lb + lp, "", false},
			}},
		}},
		{"chunked body with trailer", Config{}, []step{
			{off: 0, data: chunked, want: Decide, effs: []eff{{"http:POST", "http://example.com/c", SpanBytes, 0, len(chunked), "hello world", false}}},
		}},
		{"overlap with different data refuses the flow", Config{}, []step{
			{off: 0, data: post[:30], want: Hold},
			{off: 20, data: strings.Repeat("X", 20), want: Refuse, err: ErrTCPConflict},
			{off: 30, data: post[30:], want: Refuse, err: ErrTCPConflict},
		}},
		{"a refused flow stays refused", Config{}, []step{
			{off: 0, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false}}},
			{off: 10, data: "XXXXXXXX", want: Refuse, err: ErrTCPConflict},
			{off: la, data: getB, want: Refuse, err: ErrTCPConflict},
		}},
		{"rewritten retransmission of decided bytes refuses the flow", Config{}, []step{
			{off: 0, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false}}},
			{off: 0, data: strings.Replace(getA, "/a?x=1", "/z?x=9", 1), want: Refuse, err: ErrTCPConflict},
		}},
		{"oversized head", Config{MaxHeaderBytes: 1024}, []step{
			{off: 0, data: "GET / HTTP/1.1\r\nX-Pad: " + strings.Repeat("a", 1100), want: Decide, effs: []eff{{"tcp:opaque", "93.184.216.34:80", SpanOpen, 0, -1, "", true}}},
			{off: 1200, data: "more", want: Covered},
		}},
		{"oversized body with content-length", Config{MaxBodyBytes: 8}, []step{
			{off: 0, data: post[:lp-5], want: Hold},
			{off: lp - 5, data: post[lp-5 : lp-2], want: Decide, effs: []eff{{"http:POST", "http://example.com/up", SpanBytes, 0, lp, "hello wo", true}}},
			{off: lp - 2, data: post[lp-2:], want: Covered},
			{off: lp, data: getB, want: Decide, effs: []eff{{"http:GET", "http://example.com/b", SpanBytes, lp, lp + lb, "", false}}},
		}},
		{"oversized chunked body", Config{MaxBodyBytes: 8}, []step{
			{off: 0, data: chunked[:len(chunked)-10], want: Decide, effs: []eff{{"http:POST", "http://example.com/c", SpanOpen, 0, -1, "hello wo", true}}},
			{off: len(chunked) - 10, data: chunked[len(chunked)-10:], want: Covered},
		}},
		{"ambiguous framing is opaque", Config{}, []step{
			{off: 0, data: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", want: Decide,
				effs: []eff{{"tcp:opaque", "93.184.216.34:80", SpanOpen, 0, -1, "", true}}},
		}},
		{"not http", Config{}, []step{
			{off: 0, data: "SSH-2.0-OpenSSH_9.2\r\n", want: Decide, effs: []eff{{"tcp:opaque", "93.184.216.34:80", SpanOpen, 0, -1, "", true}}},
			{off: 21, data: "binary", want: Covered},
		}},
		{"stream ends inside a request", Config{}, []step{
			{off: 0, data: "GET / HTTP/1.1\r\nHost: a\r\n", want: Hold},
			{off: 25, data: "", fin: true, want: NoData, effs: []eff{{"tcp:opaque", "93.184.216.34:80", SpanOpen, 0, -1, "", true}}},
		}},
		{"connect opens a tunnel", Config{}, []step{
			{off: 0, data: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", want: Decide,
				effs: []eff{{"http:CONNECT", "example.com:443", SpanOpen, 0, -1, "", true}}},
			{off: 57, data: "\x16\x03\x01", want: Covered},
		}},
		{"stale retransmission", Config{RetainBytes: 16}, []step{
			{off: 0, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false}}},
			{off: la, data: getB, want: Decide, effs: []eff{{"http:GET", "http://example.com/b", SpanBytes, la, la + lb, "", false}}},
			{off: la + lb, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, la + lb, 2*la + lb, "", false}}},
			{off: 0, data: getA, want: Drop, err: ErrTCPStale},
		}},
		{"segment beyond the window", Config{MaxHeaderBytes: 1024, MaxBodyBytes: 1024}, []step{
			{off: 10000, data: "x", want: Drop, err: ErrTCPWindow},
			{off: 0, data: getA, want: Decide, effs: []eff{{"http:GET", "http://example.com/a?x=1", SpanBytes, 0, la, "", false}}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newParser(t, tc.cfg)
			runSteps(t, newClient(t, p, "10.0.0.2:40000", "93.184.216.34:80", 1000), tc.steps)
		})
	}
}

func TestStreamSeqWraparound(t *testing.T) {
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40001", "93.184.216.34:80", 0xffffffff-20)
	runSteps(t, c, []step{
		{off: 30, data: post[30:], want: Hold},
		{off: 0, data: post[:30], want: Decide, effs: []eff{{"http:POST", "http://example.com/up", SpanBytes, 0, len(post), "hello world", false}}},
		{off: len(post), data: getB, want: Decide, effs: []eff{{"http:GET", "http://example.com/b", SpanBytes, len(post), len(post) + len(getB), "", false}}},
	})
}

func TestStreamChunkedByteByByte(t *testing.T) {
	body := "POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" +
		"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40002", "10.9.9.9:8080", 7)
	c.syn()
	for i := 0; i < len(body)-1; i++ {
		if r := c.data(i, body[i:i+1]); r.Action != Hold {
			t.Fatalf("byte %d: %v %v", i, r.Action, r.Err)
		}
	}
	r := c.data(len(body)-1, body[len(body)-1:])
	if r.Action != Decide || len(r.Effects) != 1 {
		t.Fatalf("last byte: %v %v %d effects", r.Action, r.Err, len(r.Effects))
	}
	e := &r.Effects[0]
	if got := string(e.HTTP.Body); got != "abc0123456789abcdef" {
		t.Errorf("body %q", got)
	}
	if e.End-c.seq(0) != uint32(len(body)) {
		t.Errorf("end %d, want %d", e.End-c.seq(0), len(body))
	}
	if ev := e.Event(); ev.Obj != "http://h/c" {
		t.Errorf("obj %q", ev.Obj)
	}
}

func TestStreamExpectContinue(t *testing.T) {
	head := "PUT /f HTTP/1.1\r\nHost: up.example\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40003", "10.9.9.9:80", 1)
	runSteps(t, c, []step{
		{off: 0, data: head, want: Decide, effs: []eff{{"http:PUT", "http://up.example/f", SpanBytes, 0, len(head), "", false}}},
		{off: len(head), data: "bo", want: Hold},
		{off: len(head) + 2, data: "dy!", want: Decide, effs: []eff{{"http:PUT", "http://up.example/f", SpanBytes, len(head), len(head) + 5, "body!", false}}},
	})
}

func TestStreamPendingTimeout(t *testing.T) {
	p := newParser(t, Config{PendingTimeout: time.Second})
	c := newClient(t, p, "10.0.0.2:40004", "10.9.9.9:80", 1)
	head := "POST /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\n"
	c.syn()
	if r := c.data(0, head+"ab"); r.Action != Hold {
		t.Fatalf("%v %v", r.Action, r.Err)
	}
	if r := p.Expire(c.at.Add(500 * time.Millisecond)); len(r.Effects) != 0 {
		t.Fatalf("expired early: %d effects", len(r.Effects))
	}
	r := p.Expire(c.at.Add(1500 * time.Millisecond))
	if len(r.Effects) != 1 || !r.Effects[0].HTTP.HeadOnly || r.Effects[0].End-c.seq(0) != uint32(len(head)) {
		t.Fatalf("flush: %d effects %+v", len(r.Effects), r.Effects)
	}
	c.at = c.at.Add(2 * time.Second)
	r = c.data(len(head)+2, "cd")
	if r.Action != Decide || len(r.Effects) != 1 || !r.Effects[0].HTTP.BodyOnly || string(r.Effects[0].HTTP.Body) != "abcd" {
		t.Fatalf("body: %v %v %+v", r.Action, r.Err, r.Effects)
	}
	ev := r.Effects[0].Event()
	if ev.Obj != "http://h/slow" || ev.Op != "http:POST" {
		t.Errorf("body event %q %q", ev.Op, ev.Obj)
	}
	// An incomplete head is decided as opaque when its wait runs out.
	c2 := newClient(t, p, "10.0.0.2:40005", "10.9.9.9:80", 1)
	c2.syn()
	c2.data(0, "GET /x HTT")
	r = p.Expire(c2.at.Add(2 * time.Second))
	if len(r.Effects) != 1 || r.Effects[0].Kind != KindTCPOpaque || !errors.Is(r.Effects[0].Opaque, ErrPendingTimeout) {
		t.Fatalf("incomplete head: %+v", r.Effects)
	}
}

func TestStreamMidstream(t *testing.T) {
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40006", "10.9.9.9:80", 500)
	r := c.data(100, getA)
	if r.Action != Decide || len(r.Effects) != 1 || r.Effects[0].Span != SpanFlow || !errors.Is(r.Effects[0].Opaque, ErrNoSYN) {
		t.Fatalf("%v %v %+v", r.Action, r.Err, r.Effects)
	}
	if r := c.data(0, "earlier bytes"); r.Action != Covered {
		t.Fatalf("earlier bytes: %v", r.Action)
	}
	// The verdict loop can tell the parser where requests start again.
	if err := p.Resync(c.src, c.dst, c.seq(200), c.at); err != nil {
		t.Fatal(err)
	}
	r = c.data(200, getB)
	if r.Action != Decide || len(r.Effects) != 1 || r.Effects[0].Kind != KindHTTP {
		t.Fatalf("after resync: %v %v %+v", r.Action, r.Err, r.Effects)
	}
}

func TestStreamRefusalSticks(t *testing.T) {
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40010", "10.9.9.9:80", 1)
	c.syn()
	c.data(0, "GET / HTTP/1.1\r\n")
	if r := c.data(0, "PUT"); r.Action != Refuse {
		t.Fatalf("conflict: %v", r.Action)
	}
	for name, pkt := range map[string][]byte{
		"rst":     tcpPkt(t, c.src, c.dst, c.seq(16), FlagRST, nil),
		"new syn": tcpPkt(t, c.src, c.dst, c.seq(15), FlagSYN, nil),
	} {
		if r := c.feed(pkt); r.Action != Refuse || !errors.Is(r.Err, ErrTCPConflict) {
			t.Fatalf("%s: %v %v", name, r.Action, r.Err)
		}
	}
	if r := c.data(16, "Host: x\r\n\r\n"); r.Action != Refuse {
		t.Fatalf("data after reset: %v", r.Action)
	}
	// Idle for FlowIdle, the 4-tuple is forgotten.
	p.Expire(c.at.Add(6 * time.Minute))
	c.at = c.at.Add(6 * time.Minute)
	if r := c.syn(); r.Action != NoData {
		t.Fatalf("after idle: %v %v", r.Action, r.Err)
	}
}

func TestStreamControlPackets(t *testing.T) {
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40007", "10.9.9.9:80", 1)
	c.syn()
	if r := c.syn(); r.Action != NoData {
		t.Fatalf("syn retransmission: %v", r.Action)
	}
	if r := c.feed(tcpPkt(t, c.src, c.dst, c.seq(0), FlagACK, nil)); r.Action != NoData {
		t.Fatalf("ack: %v", r.Action)
	}
	if r := c.feed(tcpPkt(t, c.src, c.dst, c.seq(0), FlagRST|FlagACK, []byte("leak"))); r.Action != Refuse || !errors.Is(r.Err, ErrRSTData) {
		t.Fatalf("rst with data: %v %v", r.Action, r.Err)
	}
	if r := c.feed(tcpPkt(t, c.src, c.dst, c.seq(0), FlagRST, nil)); r.Action != NoData || p.Flows() != 0 {
		t.Fatalf("rst: %v, %d flows", r.Action, p.Flows())
	}
	c2 := newClient(t, p, "10.0.0.2:40011", "10.9.9.9:80", 1)
	c2.syn()
	urg := tcpL4(t, c2.src, c2.dst, c2.seq(0), FlagACK|FlagPSH, []byte("GET /xsecret"))
	urg[13] |= byte(FlagURG)
	urg[19] = 6 // urgent pointer
	if r := p.Feed(ipPkt(t, c2.src.Addr(), c2.dst.Addr(), 6, urg), Meta{Time: t0, ChecksumNotReady: true}); r.Action != Refuse || !errors.Is(r.Err, ErrTCPUrgent) {
		t.Fatalf("urgent data: %v %v", r.Action, r.Err)
	}
}

func TestStreamFlowTableFull(t *testing.T) {
	p := newParser(t, Config{MaxFlows: 2})
	for i, src := range []string{"10.0.0.2:1", "10.0.0.2:2"} {
		if r := newClient(t, p, src, "10.9.9.9:80", 1).syn(); r.Action != NoData {
			t.Fatalf("flow %d: %v %v", i, r.Action, r.Err)
		}
	}
	if r := newClient(t, p, "10.0.0.2:3", "10.9.9.9:80", 1).syn(); r.Action != Refuse || !errors.Is(r.Err, ErrFlowsFull) {
		t.Fatalf("third flow: %v %v", r.Action, r.Err)
	}
	// Idle flows are forgotten; then there is room again.
	p.Expire(t0.Add(10 * time.Minute))
	c := newClient(t, p, "10.0.0.2:3", "10.9.9.9:80", 1)
	c.at = t0.Add(10 * time.Minute)
	if r := c.syn(); r.Action != NoData {
		t.Fatalf("after expiry: %v %v", r.Action, r.Err)
	}
}

func TestStreamDNSOverTCP(t *testing.T) {
	q1, q2 := dnsQuery(t, 1, "a.example.", 1), dnsQuery(t, 2, "b.example.", 28)
	msg := func(q []byte) string { return string([]byte{byte(len(q) >> 8), byte(len(q))}) + string(q) }
	m1, m2 := msg(q1), msg(q2)
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40008", "10.0.0.53:53", 9)
	runSteps(t, c, []step{
		{off: 0, data: m1 + m2[:5], want: Decide, tail: true, effs: []eff{{"dns:query", "a.example", SpanBytes, 0, len(m1), "", false}}},
		{off: len(m1) + 5, data: m2[5:], want: Decide, effs: []eff{{"dns:query", "b.example", SpanBytes, len(m1), len(m1) + len(m2), "", false}}},
	})
}

func TestStreamTLS(t *testing.T) {
	hello := realClientHello(t, "api.example.com", []string{"h2", "http/1.1"})
	p := newParser(t, Config{})
	c := newClient(t, p, "10.0.0.2:40009", "10.9.9.9:443", 77)
	runSteps(t, c, []step{
		{off: 0, data: string(hello[:100]), want: Hold},
		{off: 100, data: string(hello[100:]), want: Decide, effs: []eff{{"tls:clienthello", "api.example.com:443", SpanOpen, 0, -1, "", true}}},
		{off: len(hello), data: "\x17\x03\x03\x00\x05hello", want: Covered},
	})
}
