package respwatch

import (
	"bufio"
	"crypto/sha256"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/events.golden from the events of TestEventsGolden")

// goldenCase is one connection of TestEventsGolden: responses of random
// framings and sizes around the body bounds, to requests of random
// methods, cut into random segments, some of them swapped.
type goldenCase struct {
	cfg     Config
	methods []string
	stream  string
	close   bool // the server closes after the stream
	cuts    []int
	swaps   []int // segment i and i+1 arrive swapped
}

func goldenBody(rng *rand.Rand, n int) string {
	const alpha = "abcdefghijklmnopqrstuvwxyz0123456789 \n<>/=&?"
	b := make([]byte, n)
	for i := range b {
		b[i] = alpha[rng.IntN(len(alpha))]
	}
	return string(b)
}

func goldenChunked(rng *rand.Rand, body string, extra ...string) string {
	var s strings.Builder
	s.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
	for _, e := range extra {
		s.WriteString(e + "\r\n")
	}
	s.WriteString("\r\n")
	for len(body) > 0 {
		n := min(len(body), 1+rng.IntN(3000))
		s.WriteString(hex(n) + "\r\n" + body[:n] + "\r\n")
		body = body[n:]
	}
	s.WriteString("0\r\n\r\n")
	return s.String()
}

// goldenCases builds the cases from a fixed seed: the same cases on
// every run and every machine.
func goldenCases(tb testing.TB) []goldenCase {
	rng := rand.New(rand.NewPCG(13, 2026))
	var cases []goldenCase
	for i := 0; i < 160; i++ {
		c := goldenCase{cfg: Config{MaxBodyBytes: 4096, MaxWireBytes: 2048}}
		if i%4 == 3 {
			c.cfg = Config{} // the defaults: 1 MiB
		}
		bound := c.cfg.MaxBodyBytes
		if bound == 0 {
			bound = 1 << 20
		}
		size := func() int {
			switch rng.IntN(4) {
			case 0:
				return rng.IntN(200)
			case 1:
				return bound - 2 + rng.IntN(5) // around the bound
			case 2:
				return rng.IntN(2 * bound)
			}
			return bound + rng.IntN(bound/4+1)
		}
		var stream strings.Builder
		for k := 0; k < 1+rng.IntN(3); k++ {
			m := "GET"
			switch body := goldenBody(rng, size()); rng.IntN(9) {
			case 0, 1, 2:
				stream.WriteString(okResponse(body, "Location: /next"))
			case 3:
				stream.WriteString(goldenChunked(rng, body, "Set-Cookie: a=b"))
			case 4:
				stream.WriteString(okResponse(gz(tb, body), "Content-Encoding: gzip"))
			case 5:
				stream.WriteString(goldenChunked(rng, gz(tb, body), "Content-Encoding: gzip"))
			case 6:
				m = "HEAD"
				stream.WriteString("HTTP/1.1 200 OK\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n")
			case 7:
				m = "PUT"
				stream.WriteString("HTTP/1.1 100 Continue\r\n\r\n" + okResponse(body))
			case 8:
				// Close-delimited: it ends the stream.
				stream.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + body)
				c.close = true
			}
			c.methods = append(c.methods, m)
			if c.close {
				break
			}
		}
		if !c.close && rng.IntN(5) == 0 {
			// The server closes inside its last response.
			c.close = true
			s := stream.String()
			stream.Reset()
			stream.WriteString(s[:len(s)-rng.IntN(min(len(s), 100))])
		}
		c.stream = stream.String()
		for at := 0; ; {
			at += 1 + rng.IntN(3000)
			if at >= len(c.stream) {
				break
			}
			c.cuts = append(c.cuts, at)
		}
		for j := 0; j+1 < len(c.cuts); j++ {
			if rng.IntN(10) == 0 {
				c.swaps = append(c.swaps, j)
				j++
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// goldenFrames is the connection of c as frames: the requests, then the
// server's segments, the guest's acknowledgements, the server's FIN.
func goldenFrames(tb testing.TB, c *goldenCase) []framed {
	cn := newConn(tb, guest, server)
	frames := cn.handshake()
	for i, m := range c.methods {
		req := strings.Replace(get("/g/"+itoa(i), "golden.test"), "GET", m, 1)
		if m == "PUT" {
			req = "PUT /g/" + itoa(i) + " HTTP/1.1\r\nHost: golden.test\r\nContent-Length: 2\r\n\r\nok"
		}
		frames = append(frames, cn.send(req))
	}
	var segs []framed
	at := 0
	for _, end := range append(c.cuts, len(c.stream)) {
		segs = append(segs, cn.reply(c.stream[at:end], end-at)...)
		at = end
	}
	for _, j := range c.swaps {
		segs[j], segs[j+1] = segs[j+1], segs[j]
	}
	for i, s := range segs {
		frames = append(frames, s)
		if i%3 == 2 {
			frames = append(frames, cn.ack())
		}
	}
	frames = append(frames, cn.ack())
	if c.close {
		frames = append(frames, cn.serverFin(), cn.ack())
	}
	return frames
}

// digestEvents is a digest of everything in the events and the tracker's
// counters (the buffered bytes left out: they say how, not what).
func digestEvents(evs []decide.Event, st Stats) string {
	h := sha256.New()
	for _, e := range evs {
		fmt.Fprintf(h, "%v|%v|%v|%q|%q|%q|%v|%+v|", e.Time.UnixNano(), e.Ch, e.Dir, e.Op, e.Obj, e.Source, e.Opaque, *e.Dest)
		for _, f := range e.Fields {
			fmt.Fprintf(h, "%q=%v:%q|", f.Name, f.Role, f.Value)
		}
		fmt.Fprintf(h, "%d:%q\n", len(e.Content), e.Content)
	}
	st.BufferBytes = 0
	fmt.Fprintf(h, "%+v", st)
	return fmt.Sprintf("%x", h.Sum(nil)[:12])
}

// How runGolden gives the tracker a connection.
const (
	viaFrames = iota // every frame to Feed
	viaServer        // the server's segments (but SYN and RST) to FeedServer
	viaPair          // also: the guest's data segments framed by netparse's RequestStream and given to Pair, not fed (as the interceptor's tap does)
)

// runGolden feeds the case's frames as via says and returns the events
// and the counters.
func runGolden(tb testing.TB, c *goldenCase, frames []framed, via int) ([]decide.Event, Stats) {
	tr := newTracker(tb, c.cfg)
	rs, err := netparse.NewRequestStream(netparse.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	ts := time.Unix(1_700_000_000, 0)
	var evs []decide.Event
	var p pkt
	for _, f := range frames {
		ts = ts.Add(time.Millisecond)
		if via != viaFrames {
			if err := decodeFrame(f.data, &p); err != nil {
				tb.Fatal(err)
			}
		}
		switch {
		case via >= viaServer && f.dir == capture.Ingress && p.flags&(flagSYN|flagRST) == 0:
			evs = append(evs, tr.FeedServer(ts, p.dst, p.src, p.seq, p.payload, p.flags&flagFIN != 0).Events...)
		case via == viaPair && f.dir == capture.Egress && len(p.payload) > 0:
			if _, err := rs.Write(p.payload); err != nil {
				tb.Fatal(err)
			}
			for r := rs.Next(); r != nil; r = rs.Next() {
				r.Src, r.Dst, r.Proto, r.Family = p.src, p.dst, 6, 4
				if q, ok := RequestOf(&r.Effect); ok {
					tr.Pair(p.src, p.dst, q)
				}
			}
		default:
			evs = append(evs, tr.Feed(ts, f.data, f.dir).Events...)
		}
	}
	evs = append(evs, tr.Close(ts.Add(time.Second)).Events...)
	return evs, tr.Stats()
}

// TestEventsGolden: the events of 160 random connections (framings,
// sizes around the body bounds, codings, interim and HEAD responses,
// random segments, some reordered, closes inside a response) are the
// ones recorded in testdata/events.golden. The file was written by the
// tracker before its body buffers changed (-update-golden rewrites it):
// the events must stay byte for byte what they were, whether the
// server's segments come as frames (Feed) or not (FeedServer), and
// whether the tracker frames the requests or is given them (Pair).
func TestEventsGolden(t *testing.T) {
	cases := goldenCases(t)
	var got []string
	total := 0
	for i := range cases {
		frames := goldenFrames(t, &cases[i])
		evs, st := runGolden(t, &cases[i], frames, viaFrames)
		d := digestEvents(evs, st)
		if sevs, sst := runGolden(t, &cases[i], frames, viaServer); digestEvents(sevs, sst) != d {
			t.Errorf("case %d: FeedServer's events (digest %s) differ from Feed's (%s)", i, digestEvents(sevs, sst), d)
		}
		// Pair: the guest's segments are not fed, so Stats.Frames differs.
		if pevs, _ := runGolden(t, &cases[i], frames, viaPair); digestEvents(pevs, Stats{}) != digestEvents(evs, Stats{}) {
			t.Errorf("case %d: with Pair, the events differ from Feed's", i)
		}
		total += len(evs)
		got = append(got, fmt.Sprintf("%03d %s", i, d))
	}
	if total < 300 {
		t.Fatalf("only %d events from %d cases", total, len(cases))
	}
	const file = "testdata/events.golden"
	if *updateGolden {
		if err := os.WriteFile(file, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		want = append(want, sc.Text())
	}
	if len(want) != len(got) {
		t.Fatalf("%d cases, golden has %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			c := &cases[i]
			t.Errorf("case %d (cfg %+v, methods %v, %d bytes, close %v, %d cuts, swaps %v): digest %s, golden %s",
				i, c.cfg, c.methods, len(c.stream), c.close, len(c.cuts), c.swaps, got[i], want[i])
		}
	}
}

// BenchmarkTapIngress measures what the interceptor's response tap
// (pkg/hooks/intercept, respTap) costs per byte of a download: a 32 MiB
// Content-Length response, given to the tracker in 16 KiB reads (a TLS
// record's plaintext each), as the tap gives it (FeedServer: no frame).
func BenchmarkTapIngress(b *testing.B) {
	const size = 32 << 20
	const read = 16 << 10
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " + itoa(size) + "\r\n\r\n"
	body := []byte(goldenBody(rand.New(rand.NewPCG(1, 2)), read))
	b.SetBytes(size)
	b.ReportAllocs()
	ts := time.Unix(1_700_000_000, 0)
	for i := 0; i < b.N; i++ {
		tap := newBenchTap(b)
		tap.ingress(ts, []byte(head))
		n := 0
		for left := size; left > 0; left -= read {
			n += tap.ingress(ts, body[:min(read, left)])
		}
		if n != 1 {
			b.Fatalf("%d response events", n)
		}
	}
}

// benchTap gives a tracker one connection's server bytes as the
// interceptor's tap does.
type benchTap struct {
	tr   *Tracker
	cn   *conn
	sseq uint32
}

func newBenchTap(b *testing.B) *benchTap {
	tr := newTracker(b, Config{MaxFlows: 1, PendingTimeout: time.Hour, FlowIdle: 24 * time.Hour})
	cn := newConn(b, guest, server)
	ts := time.Unix(1_700_000_000, 0)
	for _, f := range append(cn.handshake(), cn.send(get("/download", "bench.test"))) {
		tr.Feed(ts, f.data, f.dir)
	}
	return &benchTap{tr: tr, cn: cn, sseq: cn.sseq}
}

// ingress gives the tracker the server bytes p and returns how many
// responses they completed.
func (t *benchTap) ingress(ts time.Time, p []byte) int {
	res := t.tr.FeedServer(ts, t.cn.cli, t.cn.srv, t.sseq, p, false)
	t.sseq += uint32(len(p))
	n := 0
	for _, ev := range res.Events {
		if ev.Op == OpResponse {
			n++
		}
	}
	return n
}

// feedServer is feedAll with the server's segments (but SYN and RST)
// given to FeedServer.
func feedServer(tb testing.TB, tr *Tracker, frames []framed) []decide.Event {
	tb.Helper()
	var evs []decide.Event
	var p pkt
	for _, f := range frames {
		clockMu.Lock()
		clock = clock.Add(time.Millisecond)
		ts := clock
		clockMu.Unlock()
		if f.dir == capture.Ingress {
			if err := decodeFrame(f.data, &p); err != nil {
				tb.Fatal(err)
			}
			if p.flags&(flagSYN|flagRST) == 0 {
				evs = append(evs, tr.FeedServer(ts, p.dst, p.src, p.seq, p.payload, p.flags&flagFIN != 0).Events...)
				continue
			}
		}
		evs = append(evs, tr.Feed(ts, f.data, f.dir).Events...)
	}
	return evs
}

// sameEvents reports whether a and b are the same events but for their
// times.
func sameEvents(a, b []decide.Event) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		dx, dy := *x.Dest, *y.Dest
		x.Time, y.Time, x.Dest, y.Dest = time.Time{}, time.Time{}, nil, nil
		if fmt.Sprintf("%+v %+v", x, dx) != fmt.Sprintf("%+v %+v", y, dy) {
			return false
		}
	}
	return true
}
