package respwatch

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// fuzzConfig has small limits so that inputs reach them.
var fuzzConfig = Config{MaxHeaderBytes: 1024, MaxBodyBytes: 2048, MaxWireBytes: 1024, MaxOpaqueBytes: 64, MaxFlowBuffer: 4096, MaxBufferBytes: 64 << 10}

// FuzzParseResponse: any bytes parse without panic within the bounds, and
// the result does not depend on where the segments end.
func FuzzParseResponse(f *testing.F) {
	f.Add([]byte(okResponse("hello")), false, uint16(10))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\n"), false, uint16(50))
	f.Add([]byte(okResponse(gz(f, "compressed body"), "Content-Encoding: gzip")), false, uint16(70))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"), false, uint16(3))
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\nto the end"), true, uint16(0))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Encoding: deflate, gzip\r\nContent-Length: 4\r\n\r\nabcd"), false, uint16(9))
	f.Fuzz(func(t *testing.T, data []byte, head bool, split uint16) {
		method := "GET"
		if head {
			method = "HEAD"
		}
		cfg, _ := fuzzConfig.withDefaults()
		orig := append([]byte(nil), data...)
		resp, n, err := ParseResponse(data, method, true, fuzzConfig)
		if !bytes.Equal(data, orig) {
			t.Fatal("ParseResponse modified its input")
		}
		if err == nil {
			if n < 0 || n > len(data) {
				t.Fatalf("used %d of %d bytes", n, len(data))
			}
			if len(resp.Body) > cfg.MaxBodyBytes {
				t.Fatalf("body of %d bytes over the %d limit", len(resp.Body), cfg.MaxBodyBytes)
			}
			if resp.Status < 100 || resp.Status > 599 {
				t.Fatalf("status %d", resp.Status)
			}
			if resp.Framing == FrameLength && !resp.Incomplete && resp.WireLen != resp.ContentLength {
				t.Fatalf("complete body of %d bytes, Content-Length %d", resp.WireLen, resp.ContentLength)
			}
		} else if !errors.Is(err, ErrHTTP) && !errors.Is(err, ErrHeadTooBig) && !errors.Is(err, ErrNeedMore) {
			t.Fatalf("error %v wraps no sentinel", err)
		}
		// Two parts give what one gives.
		k := int(split) % (len(data) + 1)
		one := newReader(&cfg, nil, &decoder{})
		one.begin(method)
		n1, st1, _ := one.feed(data)
		two := newReader(&cfg, nil, &decoder{})
		two.begin(method)
		m, st2, _ := two.feed(data[:k])
		if st2 == stMore && m == k {
			var m2 int
			m2, st2, _ = two.feed(data[k:])
			m += m2
		}
		if (st1 == stBad) != (st2 == stBad) {
			t.Fatalf("split at %d: status %d, whole: %d", k, st2, st1)
		}
		if st1 != stBad && (st1 != st2 || n1 != m) {
			t.Fatalf("split at %d: status %d after %d bytes, whole: %d after %d", k, st2, m, st1, n1)
		}
		if st1 == stDone {
			a, b := one.finish(), two.finish()
			if a.Status != b.Status || !bytes.Equal(a.Body, b.Body) || a.WireLen != b.WireLen {
				t.Fatalf("split at %d: %d %q %d, whole: %d %q %d", k, b.Status, b.Body, b.WireLen, a.Status, a.Body, a.WireLen)
			}
		}
	})
}

// FuzzTracker: a server stream cut into segments delivered in any order,
// duplicated, acknowledged or lost never crashes the tracker, keeps its
// bounds, frees all its memory at the end, and without loss gives the
// events an in-order delivery gives.
func FuzzTracker(f *testing.F) {
	f.Add([]byte(okResponse("one")+okResponse("two")), []byte{0, 1, 1, 0, 2, 3, 0}, uint8(40), false)
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+okResponse("x")), []byte{1, 1, 1, 1, 3}, uint8(7), true)
	f.Add([]byte("\x16\x03\x03\x00\x02ab"), []byte{0}, uint8(3), false)
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\nclose-delimited"), []byte{2, 0, 1}, uint8(5), false)
	f.Fuzz(func(t *testing.T, stream, schedule []byte, mss uint8, lossy bool) {
		if len(stream) > 8192 || len(schedule) > 256 {
			return
		}
		size := int(mss%200) + 1
		run := func(sched []byte, lossy, frameless bool) ([]decide.Event, Stats) {
			tr := newTracker(t, fuzzConfig)
			c := newConn(t, guest, server)
			reqs := get("/a", "h.test") + get("/b", "h.test") + get("/c", "h.test")
			frames := cat(c.handshake(), one(c.send(reqs)))
			segs := c.reply(string(stream), size)
			fin := c.serverFin()
			var held []framed
			i := 0
			for _, op := range sched {
				if i >= len(segs) {
					break
				}
				switch op % 4 {
				case 0:
					frames = append(frames, segs[i])
					i++
				case 1:
					held = append(held, segs[i])
					i++
				case 2:
					if i > 0 {
						frames = append(frames, segs[i-1])
					}
				case 3:
					for j := len(held) - 1; j >= 0; j-- {
						frames = append(frames, held[j])
					}
					held = held[:0]
				}
			}
			for j := len(held) - 1; j >= 0; j-- {
				frames = append(frames, held[j])
			}
			frames = append(frames, segs[i:]...)
			if lossy {
				kept := frames[:4]
				for j, fr := range frames[4:] {
					if j%5 != 2 {
						kept = append(kept, fr)
					}
				}
				frames = kept
			}
			frames = append(frames, c.ack(), fin)
			var evs []decide.Event
			if frameless {
				evs = feedServer(t, tr, frames)
			} else {
				evs = feedAll(t, tr, frames)
			}
			evs = append(evs, tr.Flush(time.Unix(1<<40, 0)).Events...)
			evs = append(evs, tr.Close(time.Unix(1<<40, 0)).Events...)
			for _, ev := range evs {
				if len(ev.Content) > max(fuzzConfig.MaxBodyBytes, fuzzConfig.MaxOpaqueBytes, 4096) {
					t.Fatalf("content of %d bytes", len(ev.Content))
				}
				if ev.Dir != decide.In || ev.Ch != decide.ChanNet || ev.Op == "" || ev.Obj == "" || ev.Dest == nil {
					t.Fatalf("malformed event %+v", ev)
				}
			}
			st := tr.Stats()
			if st.Flows != 0 || st.BufferBytes != 0 {
				t.Fatalf("after Close: %+v", st)
			}
			return evs, st
		}
		got, st := run(schedule, lossy, false)
		if seg, sst := run(schedule, lossy, true); !sameEvents(seg, got) || sst != st {
			t.Fatalf("FeedServer:\n%+v\n%+v\nFeed:\n%+v\n%+v", summarize(seg), sst, summarize(got), st)
		}
		if lossy || st.OOODropped > 0 {
			// Segments beyond the reassembly bounds are lost, by design.
			return
		}
		want, _ := run(nil, false, false)
		if len(got) != len(want) {
			t.Fatalf("reordered: %d events, in order: %d\n%+v\n%+v", len(got), len(want), summarize(got), summarize(want))
		}
		for i := range got {
			if got[i].Op != want[i].Op || got[i].Obj != want[i].Obj || got[i].Content != want[i].Content || got[i].Opaque != want[i].Opaque {
				t.Fatalf("event %d reordered: %+v, in order: %+v", i, summarize(got[i:i+1]), summarize(want[i:i+1]))
			}
		}
	})
}
