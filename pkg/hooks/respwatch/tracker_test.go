package respwatch

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/go-cmp/cmp"
)

const (
	guest  = "10.0.0.2:40000"
	server = "93.184.216.34:80"
)

func TestTrackerGET(t *testing.T) {
	c := newConn(t, guest, server)
	body := `{"iban":"DE89 3704 0044 0532 0130 00","next":"https://api.example.com/v2/pay"}`
	frames := cat(c.handshake(), one(c.send(get("/v1/account?id=7", "api.example.com"))),
		c.reply(okResponse(body, "Set-Cookie: sid=abc123secret; Path=/", "Location: https://api.example.com/moved"), 1448), one(c.ack()))
	tr := newTracker(t, Config{})
	evs := feedAll(t, tr, frames)
	want := []evSummary{
		{Op: OpResponseHeaders, Obj: "http://api.example.com/v1/account?id=7", Source: "fetch:api.example.com/v1/account",
			Content: "Set-Cookie: sid=abc123secret; Path=/\nLocation: https://api.example.com/moved\n"},
		{Op: OpResponse, Obj: "http://api.example.com/v1/account?id=7", Source: "fetch:api.example.com/v1/account", Content: body},
	}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	ev := evs[1]
	wantDest := decide.Dest{Host: "api.example.com", Addr: netip.MustParseAddr("93.184.216.34"), Port: 80, Proto: "tcp"}
	if ev.Ch != decide.ChanNet || ev.Dir != decide.In || ev.Dest == nil || *ev.Dest != wantDest {
		t.Errorf("event %v %v %+v, want net in %+v", ev.Ch, ev.Dir, ev.Dest, wantDest)
	}
	for name, v := range map[string]string{FieldStatus: "200", FieldMethod: "GET", FieldContentType: "text/plain", FieldBodyLen: "78"} {
		if got, _ := field(&ev, name); got != v {
			t.Errorf("field %s = %q, want %q", name, got, v)
		}
	}
	if ev.Origin() != "fetch:api.example.com/v1/account" {
		t.Errorf("origin %q", ev.Origin())
	}
	st := tr.Stats()
	if st.Responses != 1 || st.Events != 2 || st.Opaque != 0 || st.Flows != 1 {
		t.Errorf("stats %+v", st)
	}
	// The connection ends: nothing more is reported and memory is free.
	evs = feedAll(t, tr, []framed{c.serverFin()})
	if len(evs) != 0 || tr.Stats().Flows != 0 || tr.Stats().BufferBytes != 0 {
		t.Errorf("after FIN: %d events, stats %+v", len(evs), tr.Stats())
	}
}

func TestTrackerKeepAliveAndPipelining(t *testing.T) {
	c := newConn(t, guest, server)
	r1 := okResponse("first body")
	r2 := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nsecond\r\n5\r\n body\r\n0\r\n\r\n"
	r3 := "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found"
	frames := cat(c.handshake(),
		// Keep-alive: one request, its response, then two pipelined
		// requests in one segment, answered in one segment.
		one(c.send(get("/a", "h.test"))), c.reply(r1, 1448), one(c.ack()),
		one(c.send(get("/b", "h.test")+"HEAD /c HTTP/1.1\r\nHost: h.test\r\n\r\n"+get("/d", "h.test"))),
		c.reply(r2+"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"+r3, 1448), one(c.ack()))
	evs := feedAll(t, newTracker(t, Config{}), frames)
	want := []evSummary{
		{Op: OpResponse, Obj: "http://h.test/a", Source: "fetch:h.test/a", Content: "first body"},
		{Op: OpResponse, Obj: "http://h.test/b", Source: "fetch:h.test/b", Content: "second body"},
		{Op: OpResponse, Obj: "http://h.test/c", Source: "fetch:h.test/c", Content: ""},
		{Op: OpResponse, Obj: "http://h.test/d", Source: "fetch:h.test/d", Content: "not found"},
	}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	if m, _ := field(&evs[2], FieldMethod); m != "HEAD" {
		t.Errorf("third response paired with %q, want HEAD", m)
	}
}

// TestTrackerReorder delivers a response's segments out of order, with
// duplicates, and checks the body is the same as in order.
func TestTrackerReorder(t *testing.T) {
	body := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 400) // 18 KB
	for seed := uint64(1); seed <= 20; seed++ {
		c := newConn(t, guest, server)
		hs := c.handshake()
		req := c.send(get("/doc", "h.test"))
		segs := c.reply(okResponse(body), 1000)
		rng := rand.New(rand.NewPCG(seed, 7))
		rng.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
		// Retransmit a few.
		for i := 0; i < 3; i++ {
			segs = append(segs, segs[rng.IntN(len(segs))])
		}
		evs := feedAll(t, newTracker(t, Config{}), cat(hs, one(req), segs, one(c.ack())))
		if len(evs) != 1 || evs[0].Content != body || evs[0].Opaque {
			t.Fatalf("seed %d: %d events, opaque %v, content %d bytes (want %d)", seed, len(evs), len(evs) > 0 && evs[0].Opaque, len(evs[0].Content), len(body))
		}
	}
}

// TestTrackerLoss drops segments: the guest's acknowledgement says they
// were delivered, so carbd knows it will never see them.
func TestTrackerLoss(t *testing.T) {
	body := strings.Repeat("0123456789", 500) // 5000 bytes: segments of 1000
	t.Run("inside a content-length body: framing survives", func(t *testing.T) {
		c := newConn(t, guest, server)
		hs := c.handshake()
		req := c.send(get("/big", "h.test"))
		segs := c.reply(okResponse(body), 1000)
		lostAt := 3 // a segment of the body
		segs = append(segs[:lostAt], segs[lostAt+1:]...)
		ack1 := c.ack() // the guest got it all: one segment never reached carbd
		req2 := c.send(get("/next", "h.test"))
		segs2 := c.reply(okResponse("after the loss"), 1000)
		tr := newTracker(t, Config{})
		evs := feedAll(t, tr, cat(hs, one(req), segs, one(ack1), one(req2), segs2, one(c.ack())))
		if len(evs) != 2 {
			t.Fatalf("%d events: %+v", len(evs), summarize(evs))
		}
		if !evs[0].Opaque || !strings.HasPrefix(body, evs[0].Content) || len(evs[0].Content) == 0 || len(evs[0].Content) >= len(body) {
			t.Errorf("lost response: opaque %v, %d bytes", evs[0].Opaque, len(evs[0].Content))
		}
		if why, _ := field(&evs[0], "opaque.reason"); !strings.Contains(why, ErrLost.Error()) {
			t.Errorf("reason %q", why)
		}
		if evs[1].Opaque || evs[1].Content != "after the loss" || evs[1].Obj != "http://h.test/next" {
			t.Errorf("next response: %+v", summarize(evs[1:]))
		}
		if tr.Stats().LostBytes != 1000 {
			t.Errorf("lost %d bytes, want 1000", tr.Stats().LostBytes)
		}
	})
	t.Run("in a head: the rest of the connection is opaque", func(t *testing.T) {
		c := newConn(t, guest, server)
		hs := c.handshake()
		req := c.send(get("/one", "h.test") + get("/two", "h.test"))
		segs := c.reply(okResponse("one")+okResponse("two"), 40)
		// Lose the segment with the start of the second head.
		first := len(okResponse("one")) / 40
		segs = append(segs[:first+1], segs[first+2:]...)
		evs := feedAll(t, newTracker(t, Config{}), cat(hs, one(req), segs, one(c.ack())))
		want := []evSummary{
			{Op: OpResponse, Obj: "http://h.test/one", Source: "fetch:h.test/one", Content: "one"},
			{Op: OpResponse, Obj: "http://h.test/two", Source: "fetch:h.test/two", Content: "", Opaque: true},
		}
		if d := cmp.Diff(want, summarize(evs)); d != "" {
			t.Fatalf("-want +got\n%s", d)
		}
	})
	t.Run("truncated frame (capture snaplen)", func(t *testing.T) {
		c := newConn(t, guest, server)
		hs := c.handshake()
		req := c.send(get("/t", "h.test"))
		segs := c.reply(okResponse(body), 1400)
		segs[1].data = segs[1].data[:len(segs[1].data)-14]
		tr := newTracker(t, Config{})
		evs := feedAll(t, tr, cat(hs, one(req), segs, one(c.ack())))
		if len(evs) != 1 || !evs[0].Opaque || tr.Stats().Truncated != 1 || tr.Stats().LostBytes != 14 {
			t.Fatalf("%+v stats %+v", summarize(evs), tr.Stats())
		}
	})
}

func TestTrackerTLS(t *testing.T) {
	hello := clientHello(t, "secure.example.com")
	c := newConn(t, guest, "93.184.216.34:443")
	serverHello := "\x16\x03\x03\x00\x04\x02\x00\x00\x00" + strings.Repeat("\x17\x03\x03\x00\x10"+strings.Repeat("x", 16), 3)
	tr := newTracker(t, Config{})
	evs := feedAll(t, tr, cat(c.handshake(), one(c.send(string(hello))), c.reply(serverHello, 20), one(c.ack()),
		one(c.send("\x17\x03\x03\x00\x05abcde")), c.reply(serverHello, 100), one(c.ack())))
	if len(evs) != 1 {
		t.Fatalf("%d events, want one per connection: %+v", len(evs), summarize(evs))
	}
	ev := evs[0]
	if ev.Op != OpTLS || ev.Obj != "secure.example.com:443" || ev.Content != "" || !ev.Opaque || ev.Dest.Host != "secure.example.com" {
		t.Errorf("%+v dest %+v", summarize(evs), ev.Dest)
	}
}

// clientHello returns the first record Go's TLS client sends.
func clientHello(t testing.TB, sni string) []byte {
	a, b := net.Pipe()
	go func() {
		_ = tls.Client(a, &tls.Config{ServerName: sni, InsecureSkipVerify: true}).Handshake()
	}()
	defer a.Close()
	defer b.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(b, head); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(head[3:5])))
	copy(rec, head)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestTrackerOpaqueStream(t *testing.T) {
	c := newConn(t, guest, "198.51.100.7:22")
	evs := feedAll(t, newTracker(t, Config{MaxOpaqueBytes: 64}), cat(c.handshake(),
		c.reply("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", 1448), one(c.ack()),
		one(c.send("SSH-2.0-client\r\n")), c.reply(strings.Repeat("k", 500), 1448), one(c.ack())))
	want := []evSummary{{Op: OpStream, Obj: "198.51.100.7:22", Source: "fetch:198.51.100.7:22", Content: "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n", Opaque: true}}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
}

// TestTrackerHostClaim: the Host header is the guest's claim; a name the
// resolver did not give for the address does not name the source.
func TestTrackerHostClaim(t *testing.T) {
	c := newConn(t, guest, "203.0.113.66:8080")
	frames := cat(c.handshake(), one(c.send(get("/token", "trusted.example.com"))), c.reply(okResponse("secret"), 1448), one(c.ack()))
	resolved := func(host string, a netip.Addr) bool {
		return host == "trusted.example.com" && a == netip.MustParseAddr("192.0.2.10")
	}
	evs := feedAll(t, newTracker(t, Config{Resolved: resolved}), frames)
	if len(evs) != 1 {
		t.Fatalf("%d events", len(evs))
	}
	ev := evs[0]
	if ev.Dest.Host != "" || ev.Obj != "http://203.0.113.66:8080/token" || ev.Source != "fetch:203.0.113.66:8080/token" {
		t.Errorf("unverified host named the source: obj %q source %q dest %+v", ev.Obj, ev.Source, ev.Dest)
	}
	if h, _ := field(&ev, FieldClaimedHost); h != "trusted.example.com" {
		t.Errorf("claimed host field %q", h)
	}
	// The same request to the address the resolver gave is believed.
	c2 := newConn(t, guest, "192.0.2.10:8080")
	evs = feedAll(t, newTracker(t, Config{Resolved: resolved}), cat(c2.handshake(), one(c2.send(get("/token", "trusted.example.com:8080"))),
		c2.reply(okResponse("secret"), 1448)))
	if len(evs) != 1 || evs[0].Dest.Host != "trusted.example.com" || evs[0].Obj != "http://trusted.example.com:8080/token" ||
		evs[0].Source != "fetch:trusted.example.com:8080/token" {
		t.Errorf("verified host: %+v", summarize(evs))
	}
}

func TestTrackerInterimAndNoBody(t *testing.T) {
	c := newConn(t, guest, server)
	post := "POST /upload HTTP/1.1\r\nHost: h.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
	frames := cat(c.handshake(), one(c.send(post)), c.reply("HTTP/1.1 100 Continue\r\n\r\n", 1448), one(c.ack()),
		one(c.send("hello")), c.reply("HTTP/1.1 201 Created\r\nContent-Length: 7\r\n\r\ncreated", 1448), one(c.ack()),
		one(c.send(get("/nothing", "h.test"))), c.reply("HTTP/1.1 204 No Content\r\n\r\n", 1448),
		one(c.send(get("/same", "h.test"))), c.reply("HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", 1448), one(c.ack()))
	evs := feedAll(t, newTracker(t, Config{}), frames)
	want := []evSummary{
		{Op: OpResponse, Obj: "http://h.test/upload", Source: "fetch:h.test/upload", Content: "created"},
		{Op: OpResponse, Obj: "http://h.test/nothing", Source: "fetch:h.test/nothing"},
		{Op: OpResponse, Obj: "http://h.test/same", Source: "fetch:h.test/same"},
	}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
}

func TestTrackerCloseDelimitedAndRST(t *testing.T) {
	c := newConn(t, guest, server)
	frames := cat(c.handshake(), one(c.send(get("/old", "h.test"))), c.reply("HTTP/1.0 200 OK\r\n\r\nuntil the server closes", 8), one(c.serverFin()))
	tr := newTracker(t, Config{})
	evs := feedAll(t, tr, frames)
	if len(evs) != 1 || evs[0].Content != "until the server closes" || evs[0].Opaque {
		t.Fatalf("%+v", summarize(evs))
	}
	if _, inc := field(&evs[0], FieldIncomplete); inc {
		t.Error("a close-delimited body ended by FIN is complete")
	}
	// A reset inside a body reports what arrived, marked incomplete.
	c2 := newConn(t, guest, server)
	evs = feedAll(t, tr, cat(c2.handshake(), one(c2.send(get("/cut", "h.test"))),
		c2.reply("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", 1448), one(c2.serverRST())))
	if len(evs) != 1 || evs[0].Content != "partial" {
		t.Fatalf("%+v", summarize(evs))
	}
	if v, _ := field(&evs[0], FieldIncomplete); v != "true" {
		t.Errorf("incomplete field %q", v)
	}
	if st := tr.Stats(); st.Flows != 0 || st.BufferBytes != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestTrackerMissedStart(t *testing.T) {
	t.Run("no handshake: a response at a segment start", func(t *testing.T) {
		c := newConn(t, guest, server)
		// The capture starts mid-connection: a request and its response.
		evs := feedAll(t, newTracker(t, Config{}), cat(one(c.send(get("/x", "h.test"))), c.reply(okResponse("mid"), 1448)))
		if len(evs) != 1 || evs[0].Content != "mid" || evs[0].Obj != "http://93.184.216.34" {
			t.Fatalf("%+v", summarize(evs))
		}
		if v, _ := field(&evs[0], FieldRequest); v != "unknown" {
			t.Errorf("request field %q", v)
		}
	})
	t.Run("SYN-ACK missed: the handshake's ACK tells where the stream starts", func(t *testing.T) {
		c := newConn(t, guest, server)
		hs := c.handshake()
		evs := feedAll(t, newTracker(t, Config{}), cat([]framed{hs[0], hs[2]}, one(c.send(get("/y", "h.test"))), c.reply(okResponse("found"), 1448)))
		want := []evSummary{{Op: OpResponse, Obj: "http://h.test/y", Source: "fetch:h.test/y", Content: "found"}}
		if d := cmp.Diff(want, summarize(evs)); d != "" {
			t.Fatalf("-want +got\n%s", d)
		}
	})
	t.Run("no handshake, not at a response start: opaque", func(t *testing.T) {
		c := newConn(t, guest, server)
		evs := feedAll(t, newTracker(t, Config{}), cat(c.reply("middle of some body", 1448), one(c.send(get("/z", "h.test")))))
		if len(evs) != 1 || evs[0].Op != OpStream || !evs[0].Opaque {
			t.Fatalf("%+v", summarize(evs))
		}
	})
}

func TestTrackerMalformed(t *testing.T) {
	c := newConn(t, guest, server)
	evs := feedAll(t, newTracker(t, Config{}), cat(c.handshake(), one(c.send(get("/a", "h.test")+get("/b", "h.test"))),
		c.reply(okResponse("good")+"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 1448), one(c.ack())))
	want := []evSummary{
		{Op: OpResponse, Obj: "http://h.test/a", Source: "fetch:h.test/a", Content: "good"},
		{Op: OpResponse, Obj: "http://h.test/b", Source: "fetch:h.test/b", Opaque: true},
	}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	if why, _ := field(&evs[1], "opaque.reason"); !strings.Contains(why, "Content-Length") {
		t.Errorf("reason %q", why)
	}
}

func TestTrackerBounds(t *testing.T) {
	t.Run("body over MaxBodyBytes, next response still parsed", func(t *testing.T) {
		c := newConn(t, guest, server)
		big := strings.Repeat("x", 10000)
		evs := feedAll(t, newTracker(t, Config{MaxBodyBytes: 4096}), cat(c.handshake(), one(c.send(get("/big", "h.test")+get("/small", "h.test"))),
			c.reply(okResponse(big)+okResponse("small"), 1448), one(c.ack())))
		if len(evs) != 2 || len(evs[0].Content) != 4096 || !evs[0].Opaque || evs[1].Content != "small" || evs[1].Opaque {
			t.Fatalf("%d events", len(evs))
		}
		if n, _ := field(&evs[0], FieldBodyLen); n != "10000" {
			t.Errorf("body.len %q", n)
		}
	})
	t.Run("total memory", func(t *testing.T) {
		tr := newTracker(t, Config{MaxBufferBytes: 6000})
		c := newConn(t, guest, server)
		evs := feedAll(t, tr, cat(c.handshake(), one(c.send(get("/big", "h.test"))), c.reply(okResponse(strings.Repeat("y", 20000)), 1448)))
		if len(evs) != 1 || !evs[0].Opaque {
			t.Fatalf("%+v", summarize(evs))
		}
		if why, _ := field(&evs[0], "opaque.reason"); !strings.Contains(why, "memory") {
			t.Errorf("reason %q", why)
		}
		if tr.Stats().BufferBytes > 6000 {
			t.Errorf("buffered %d bytes", tr.Stats().BufferBytes)
		}
	})
	t.Run("out-of-order window", func(t *testing.T) {
		tr := newTracker(t, Config{MaxFlowBuffer: 3000})
		c := newConn(t, guest, server)
		hs := c.handshake()
		req := c.send(get("/w", "h.test"))
		segs := c.reply(okResponse(strings.Repeat("z", 9000)), 1000)
		// Everything but the first segment arrives first: only what fits
		// in the window is kept, the rest waits for its retransmission.
		evs := feedAll(t, tr, cat(hs, one(req), segs[1:], segs[:1], segs[3:]))
		if len(evs) != 1 || evs[0].Opaque || len(evs[0].Content) != 9000 {
			t.Fatalf("%+v", summarize(evs))
		}
		if tr.Stats().OOODropped == 0 {
			t.Error("no segment beyond the window was dropped")
		}
	})
	t.Run("flows", func(t *testing.T) {
		tr := newTracker(t, Config{MaxFlows: 2})
		var all []decide.Event
		for i, cli := range []string{"10.0.0.2:1001", "10.0.0.2:1002", "10.0.0.2:1003"} {
			c := newConn(t, cli, server)
			all = append(all, feedAll(t, tr, cat(c.handshake(), one(c.send(get("/f", "h.test"))),
				c.reply("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nstart"+num(i), 1448)))...)
		}
		if tr.Stats().Flows != 2 || tr.Stats().Evicted != 1 || len(all) != 1 || all[0].Content != "start0" {
			t.Fatalf("stats %+v events %+v", tr.Stats(), summarize(all))
		}
	})
	t.Run("pending requests", func(t *testing.T) {
		c := newConn(t, guest, server)
		var reqs, resps string
		for i := 0; i < 5; i++ {
			reqs += get("/p"+num(i), "h.test")
			resps += okResponse(num(i))
		}
		evs := feedAll(t, newTracker(t, Config{MaxPending: 3}), cat(c.handshake(), one(c.send(reqs)), c.reply(resps, 1448)))
		if len(evs) != 5 {
			t.Fatalf("%d events", len(evs))
		}
		for i, ev := range evs {
			if ev.Content != num(i) {
				t.Errorf("response %d content %q", i, ev.Content)
			}
			// The queued requests keep their responses; past the
			// overflow, responses are named by host only.
			wantObj, wantUnknown := "http://h.test/p"+num(i), false
			if i >= 3 {
				wantObj, wantUnknown = "http://h.test", true
			}
			if _, unknown := field(&ev, FieldRequest); ev.Obj != wantObj || unknown != wantUnknown {
				t.Errorf("response %d: obj %q unknown %v, want %q %v", i, ev.Obj, unknown, wantObj, wantUnknown)
			}
		}
	})
}

func num(i int) string { return itoa(i) }

func TestTrackerPartial(t *testing.T) {
	c := newConn(t, guest, server)
	tr := newTracker(t, Config{PendingTimeout: time.Second})
	t0 := time.Unix(1_700_000_000, 0)
	var evs []decide.Event
	for _, f := range cat(c.handshake(), one(c.send(get("/stream", "h.test"))),
		c.reply("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nevent1\r\n", 1448)) {
		evs = append(evs, tr.Feed(t0, f.data, f.dir).Events...)
	}
	if len(evs) != 0 {
		t.Fatalf("reported before the wait ran out: %+v", summarize(evs))
	}
	evs = append(evs, tr.Flush(t0.Add(500*time.Millisecond)).Events...)
	if len(evs) != 0 {
		t.Fatalf("reported before the wait ran out: %+v", summarize(evs))
	}
	evs = append(evs, tr.Flush(t0.Add(1100*time.Millisecond)).Events...)
	if len(evs) != 1 || evs[0].Content != "event1" || !evs[0].Opaque {
		t.Fatalf("partial: %+v", summarize(evs))
	}
	// The rest arrives: framed, not reported again, and the next
	// response is parsed.
	for _, f := range cat(c.reply("6\r\nevent2\r\n0\r\n\r\n", 1448), one(c.send(get("/next", "h.test"))), c.reply(okResponse("next"), 1448)) {
		evs = append(evs, tr.Feed(t0.Add(2*time.Second), f.data, f.dir).Events...)
	}
	if len(evs) != 2 || evs[1].Content != "next" || evs[1].Obj != "http://h.test/next" {
		t.Fatalf("%+v", summarize(evs))
	}
	// Idle flows are forgotten.
	tr.Flush(t0.Add(time.Hour))
	if st := tr.Stats(); st.Flows != 0 || st.BufferBytes != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestTrackerIPv6(t *testing.T) {
	c := newConn(t, "[fd00::2]:40000", "[2001:db8::80]:8080")
	evs := feedAll(t, newTracker(t, Config{}), cat(c.handshake(), one(c.send(get("/v6", "[2001:db8::80]:8080"))), c.reply(okResponse("six"), 1448)))
	want := []evSummary{{Op: OpResponse, Obj: "http://[2001:db8::80]:8080/v6", Source: "fetch:[2001:db8::80]:8080/v6", Content: "six"}}
	if d := cmp.Diff(want, summarize(evs)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	if evs[0].Dest.Host != "2001:db8::80" {
		t.Errorf("dest %+v", evs[0].Dest)
	}
}

func TestTrackerIgnoresOtherTraffic(t *testing.T) {
	tr := newTracker(t, Config{})
	for _, f := range []framed{{data: []byte{1, 2, 3}}, {data: make([]byte, 60)}} {
		if res := tr.Feed(time.Now(), f.data, f.dir); len(res.Events) != 0 {
			t.Fatal("events from garbage")
		}
	}
	if st := tr.Stats(); st.Undecoded != 1 || st.Other != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestTrackerGzipOverSegments(t *testing.T) {
	page := strings.Repeat("<p>Visit https://attacker.example/collect?d= now</p>\n", 300)
	c := newConn(t, guest, server)
	z := gz(t, page)
	chunked := "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
	for i := 0; i < len(z); i += 100 {
		part := z[i:min(i+100, len(z))]
		chunked += strings.ToLower(hex(len(part))) + "\r\n" + part + "\r\n"
	}
	chunked += "0\r\n\r\n"
	evs := feedAll(t, newTracker(t, Config{}), cat(c.handshake(), one(c.send(get("/page", "news.example"))), c.reply(chunked, 536)))
	if len(evs) != 1 || evs[0].Content != page || evs[0].Opaque {
		t.Fatalf("%d events", len(evs))
	}
	if e, _ := field(&evs[0], FieldEncoding); e != "gzip" {
		t.Errorf("encoding field %q", e)
	}
}

func hex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	s := ""
	for n > 0 {
		s = string(digits[n%16]) + s
		n /= 16
	}
	return s
}

// TestTrackerDecoderReuse: the tracker's decoders are reset between
// responses of every coding.
func TestTrackerDecoderReuse(t *testing.T) {
	texts := []string{"first zlib body", "raw deflate body", "gzip body", "second zlib", "second raw", "second gzip"}
	enc := []func(testing.TB, string) string{zlibData, deflateRaw, gz}
	names := []string{"deflate", "deflate", "gzip"}
	c := newConn(t, guest, server)
	var reqs, resps string
	for i, s := range texts {
		reqs += get("/"+num(i), "h.test")
		resps += okResponse(enc[i%3](t, s), "Content-Encoding: "+names[i%3])
	}
	evs := feedAll(t, newTracker(t, Config{}), cat(c.handshake(), one(c.send(reqs)), c.reply(resps, 1448)))
	if len(evs) != len(texts) {
		t.Fatalf("%d events", len(evs))
	}
	for i, ev := range evs {
		if ev.Content != texts[i] || ev.Opaque {
			t.Errorf("response %d: %q opaque %v", i, ev.Content, ev.Opaque)
		}
	}
}
