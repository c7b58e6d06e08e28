package netparse

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// Segmentation invariance: whatever the segments a stream arrives in
// (cut anywhere, out of order, retransmitted with overlaps), as long as
// the reassembler accepts them, the stream parsers return the same
// effects with the same byte ranges as for the stream in one segment.
//
// Two things are allowed to differ, and the comparison leaves them out:
// the Content of an opaque non-HTTP effect (the bytes that had arrived
// when the rest of the connection was decided as one opaque effect) and
// the text of a parse error (it quotes bytes near where parsing stopped);
// the kind of reason (its sentinel error) must match.

// segConfig has small limits, so that small inputs reach every bound, and
// no pending timeout: the property is about segments, not about time.
func segConfig() Config {
	c := fuzzConfig
	c.PendingTimeout = time.Hour
	return c
}

// reasonSentinels, most specific first.
var reasonSentinels = []error{
	ErrOpaqueProto, ErrOpaqueTLS, ErrOpaqueTunnel, ErrOversized, ErrStreamEnded,
	ErrPendingTimeout, ErrNoSYN, ErrHTTP, ErrTLS, ErrDNS,
}

func reasonKind(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range reasonSentinels {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "other: " + err.Error()
}

// segKey describes an effect with everything the invariance covers.
func segKey(c *client, e *Effect) string {
	end := int64(-1)
	if e.Span == SpanBytes {
		end = int64(e.End - c.seq(0))
	}
	return effectString(e, int64(e.Seq-c.seq(0)), end)
}

// effectString describes an effect covering stream bytes [start, end).
func effectString(e *Effect, start, end int64) string {
	ev := e.Event()
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %s %v [%d,%d) reason=%q", ev.Op, ev.Obj, e.Span, start, end, reasonKind(e.Opaque))
	opaqueStream := e.Kind == KindTCPOpaque
	if !opaqueStream {
		fmt.Fprintf(&sb, " content=%q", ev.Content)
	}
	for _, f := range ev.Fields {
		v := f.Value
		switch {
		case f.Name == FieldOpaqueReason:
			v = reasonKind(e.Opaque)
		case opaqueStream && f.Name == FieldPayload:
			v = "(arrived so far)"
		}
		fmt.Fprintf(&sb, " %s/%v=%q", f.Name, f.Role, v)
	}
	if e.Kind == KindHTTP {
		r := &e.HTTP
		fmt.Fprintf(&sb, " bodylen=%d chunked=%v trunc=%v tunnel=%v head=%v bodyonly=%v trailers=%d",
			r.BodyLen, r.Chunked, r.Truncated, r.Tunnel, r.HeadOnly, r.BodyOnly, len(r.Trailers))
	}
	return sb.String()
}

// segRun collects the effects of one delivery of a stream.
type segRun struct {
	t      testing.TB
	p      *Parser
	c      *client
	stream []byte
	out    []string
}

func newSegRun(t testing.TB, port uint16, stream []byte) *segRun {
	p := newParser(t, segConfig())
	c := newClient(t, p, "10.0.0.2:40000", fmt.Sprintf("10.0.0.9:%d", port), 0xfffffff0)
	c.syn()
	return &segRun{t: t, p: p, c: c, stream: stream}
}

func (s *segRun) flow() *flow {
	return s.p.flows[flowKey{s.c.src, s.c.dst}]
}

// send delivers stream[lo:hi] (with FIN when fin); accepted says the
// reassembler took it (a Drop is a segment it refuses to buffer, which a
// sender would retransmit).
func (s *segRun) send(lo, hi int, fin bool) (accepted bool) {
	var r *Result
	if fin {
		r = s.c.fin(lo, string(s.stream[lo:hi]))
	} else {
		r = s.c.data(lo, string(s.stream[lo:hi]))
	}
	checkEffects(s.t.(*testing.T), r)
	switch r.Action {
	case Refuse:
		s.t.Fatalf("consistent segment [%d,%d) refused: %v", lo, hi, r.Err)
	case Drop:
		if !errors.Is(r.Err, ErrTCPWindow) && !errors.Is(r.Err, ErrTCPStale) {
			s.t.Fatalf("segment [%d,%d) dropped: %v", lo, hi, r.Err)
		}
		return false
	}
	for i := range r.Effects {
		s.out = append(s.out, segKey(s.c, &r.Effects[i]))
	}
	return true
}

// window is how far past the undecided start (relative to the stream) a
// segment may reach, and where the retained bytes start.
func (s *segRun) bounds() (retained, next, contig, limit int) {
	f := s.flow()
	if f == nil {
		return len(s.stream), len(s.stream), len(s.stream), len(s.stream)
	}
	off := func(seq uint32) int { return int(int32(seq - s.c.seq(0))) }
	retained, next = off(f.base), off(f.next)
	contig = off(f.base) + f.contigEnd()
	if f.mode == modeOpen || f.refused != nil {
		return retained, next, len(s.stream), len(s.stream)
	}
	return retained, next, min(contig, len(s.stream)), min(next+s.p.window(), len(s.stream))
}

// finish fills every hole in order, then closes the stream.
func (s *segRun) finish(finSent bool) []string {
	for guard := 0; ; guard++ {
		if guard > 4*len(s.stream)+16 {
			s.t.Fatalf("sweep does not progress")
		}
		_, _, contig, limit := s.bounds()
		if contig >= len(s.stream) {
			break
		}
		hi := limit
		if f := s.flow(); f != nil {
			for _, h := range f.have {
				if lo := int(int32(f.base + uint32(h.lo) - s.c.seq(0))); lo > contig {
					hi = min(hi, lo)
					break
				}
			}
		}
		if hi <= contig || !s.send(contig, hi, false) {
			s.t.Fatalf("sweep segment [%d,%d) not accepted", contig, hi)
		}
	}
	if !finSent {
		s.send(len(s.stream), len(s.stream), true)
	}
	return s.out
}

// wholeEffects delivers the stream in one segment with FIN.
func wholeEffects(t testing.TB, port uint16, stream []byte) []string {
	s := newSegRun(t, port, stream)
	if !s.send(0, len(stream), true) {
		t.Fatalf("whole stream not accepted")
	}
	return s.out
}

// cutEffects delivers the stream in order, cut at the given offsets.
func cutEffects(t testing.TB, port uint16, stream []byte, cuts []int) []string {
	s := newSegRun(t, port, stream)
	at := 0
	for _, c := range cuts {
		if c > at && c < len(stream) {
			s.send(at, c, false)
			at = c
		}
	}
	s.send(at, len(stream), true)
	return s.out
}

// scheduledEffects delivers the stream as a schedule drawn from next:
// segments anywhere from the retained bytes to the window's end, of any
// length, so that some arrive out of order, overlap or repeat what was
// sent; FIN may come early on the segment that ends the stream. Then
// the holes are filled in order.
func scheduledEffects(t testing.TB, port uint16, stream []byte, next func(n int) int, steps int) []string {
	s := newSegRun(t, port, stream)
	finSent := false
	for range steps {
		retained, undecided, contig, limit := s.bounds()
		if contig >= len(s.stream) && finSent {
			break
		}
		var lo int
		switch next(4) {
		case 0: // retransmission of decided or received bytes
			lo = retained + next(max(contig-retained, 1))
		case 1: // out of order
			lo = undecided + next(max(limit-undecided, 1))
		default: // in order
			lo = contig
		}
		lo = min(max(lo, retained), len(s.stream))
		n := 1 + next(64)
		if next(8) == 0 {
			n = 1 + next(1024)
		}
		hi := min(lo+n, limit, len(s.stream))
		if hi < lo {
			continue
		}
		fin := hi == len(s.stream) && next(2) == 0
		if s.send(lo, hi, fin) && fin {
			finSent = true
		}
	}
	return s.finish(finSent)
}

// segCorpus is the streams every property runs over: HTTP requests and
// their edge cases, chunked bodies, a ClientHello in one record and split
// over several records, DNS over TCP, another protocol, and every input a
// fuzzer found (see testdata/fuzz/FuzzSegments).
func segCorpus(tb testing.TB) []struct {
	name   string
	port   uint16
	stream []byte
} {
	hello := realClientHello(tb, "segments.example", []string{"h2", "http/1.1"})
	var split []byte // the same handshake message cut into 100-byte records
	msg := hello[5:]
	for len(msg) > 0 {
		n := min(len(msg), 100)
		split = append(split, 22, 3, 1, byte(n>>8), byte(n))
		split = append(split, msg[:n]...)
		msg = msg[n:]
	}
	dnsTCP := func(msgs ...[]byte) []byte {
		var b []byte
		for _, m := range msgs {
			b = binary.BigEndian.AppendUint16(b, uint16(len(m)))
			b = append(b, m...)
		}
		return b
	}
	big := strings.Repeat("x", 1500)
	chunks := strings.Repeat("3\r\nabc\r\n", 200)
	type tc = struct {
		name   string
		port   uint16
		stream []byte
	}
	return []tc{
		{"pipelined", 80, []byte(getA + getB + post)},
		{"issue15", 80, []byte("A / HTTP/1.0\n\n\n\nA / HTTP/1.0\n\n")},
		{"leading blank lines", 80, []byte("\r\n\nGET / HTTP/1.0\n\n\r\n\r\n\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")},
		{"too many blank lines", 80, []byte(getA + "\n\n\n\n\nGET / HTTP/1.0\n\n")},
		{"chunked", 80, []byte("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: v\r\n\r\n" + getB)},
		{"chunked many", 80, []byte("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + "0\r\n\r\n" + getB)},
		{"chunked over the body bound", 80, []byte("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5dc\r\n" + big + "\r\nzz\r\n0\r\n\r\n")},
		{"chunked bad after data", 80, []byte("POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n")},
		{"content-length over the bound", 80, []byte("POST /u HTTP/1.1\r\nHost: h\r\nContent-Length: 1500\r\n\r\n" + big + getA)},
		{"expect-continue", 8080, []byte("PUT /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc" + getB)},
		{"connect", 3128, []byte("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n\x16\x03\x01\x00\x05hello")},
		{"head too big", 80, []byte("GET /" + strings.Repeat("a", 2100) + " HTTP/1.1\r\n\r\n")},
		{"bad header", 80, []byte(getA + "GET / HTTP/1.1\r\nHost : h\r\n\r\n")},
		{"bare cr", 80, []byte("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n")},
		{"truncated", 80, []byte(getA + "GET /half HTTP/1.1\r\nHo")},
		{"ssh", 22, []byte("SSH-2.0-OpenSSH_9.2\r\n\x00\x00\x01")},
		{"long non-request line", 80, bytes.Repeat([]byte("0"), 400)},
		{"bad byte late in an unended request line", 80, []byte("GET /" + strings.Repeat("a", 300) + "\x01bb")},
		{"bad byte late in a request line", 80, []byte("GET /" + strings.Repeat("a", 300) + "\x01bb HTTP/1.1\r\n\r\n")},
		{"tls one record", 443, hello},
		{"tls split records", 443, split},
		{"tls truncated", 443, split[:len(split)-7]},
		{"tls record over the bound", 443, append([]byte{22, 3, 1, 0x0b, 0xb8, 1, 0, 0, 4, 3, 3, 0, 0}, make([]byte, 2995)...)},
		{"dns over tcp", 53, dnsTCP(dnsQuery(tb, 1, "a.example.", 1), dnsQuery(tb, 2, "b.example.", 28))},
		{"dns over tcp truncated", 53, dnsTCP(dnsQuery(tb, 1, "a.example.", 1))[:20]},
	}
}

// TestSegmentationInvariance runs deterministic random schedules over the
// corpus: every schedule must give the effects of the whole stream.
func TestSegmentationInvariance(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 8
	}
	for _, tc := range segCorpus(t) {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.stream) > newParser(t, segConfig()).window() {
				t.Fatalf("corpus stream of %d bytes exceeds the window", len(tc.stream))
			}
			want := wholeEffects(t, tc.port, tc.stream)
			if len(want) == 0 {
				t.Fatalf("no effects for the whole stream")
			}
			// Every single cut, then random schedules.
			for cut := 1; cut < len(tc.stream); cut += max(1, len(tc.stream)/97) {
				if got := cutEffects(t, tc.port, tc.stream, []int{cut}); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("cut at %d:\nwhole: %q\ncut:   %q", cut, want, got)
				}
			}
			for round := range rounds {
				rng := rand.New(rand.NewPCG(uint64(round), 15))
				got := scheduledEffects(t, tc.port, tc.stream, func(n int) int { return rng.IntN(n) }, 400)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("schedule %d:\nwhole:     %q\nscheduled: %q", round, want, got)
				}
			}
		})
	}
}

// TestSegmentationOneByte delivers every corpus stream one byte per
// segment.
func TestSegmentationOneByte(t *testing.T) {
	for _, tc := range segCorpus(t) {
		want := wholeEffects(t, tc.port, tc.stream)
		cuts := make([]int, len(tc.stream))
		for i := range cuts {
			cuts[i] = i
		}
		if got := cutEffects(t, tc.port, tc.stream, cuts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s, one byte per segment:\nwhole: %q\ncut:   %q", tc.name, want, got)
		}
	}
}

// FuzzSegments takes a stream, a port (which selects DNS over TCP on 53)
// and a schedule: the effects must be those of the whole stream.
func FuzzSegments(f *testing.F) {
	for i, tc := range segCorpus(f) {
		f.Add(tc.stream, tc.port, []byte{byte(i), 3, 200, 1, 7, 0, 0, 64, 2, 9})
	}
	window := newParser(f, segConfig()).window()
	f.Fuzz(func(t *testing.T, stream []byte, port uint16, schedule []byte) {
		if len(stream) == 0 || len(stream) > window || len(schedule) > 512 {
			return
		}
		want := wholeEffects(t, port, stream)
		pos := 0
		next := func(n int) int {
			if pos >= len(schedule) {
				return 0
			}
			v := int(schedule[pos])
			pos++
			if n > 256 && pos < len(schedule) {
				v = v<<8 | int(schedule[pos])
				pos++
			}
			return v % n
		}
		got := scheduledEffects(t, port, stream, next, len(schedule))
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("segmentation changed the effects:\nwhole:     %q\nscheduled: %q", want, got)
		}
	})
}
