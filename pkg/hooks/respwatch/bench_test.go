package respwatch

import (
	"strings"
	"testing"
	"time"
)

// benchConn builds one kept-alive connection carrying n request/response
// exchanges whose responses are resp; the guest acknowledges every
// second segment. It returns the frames and the server bytes.
func benchConn(b *testing.B, n int, resp string, reorder bool) ([]framed, int) {
	c := newConn(b, guest, server)
	frames := c.handshake()
	total := 0
	for i := 0; i < n; i++ {
		frames = append(frames, c.send(get("/item/"+itoa(i), "bench.test")))
		segs := c.reply(resp, 1448)
		total += len(resp)
		if reorder {
			// Swap neighbours: every other segment arrives out of order.
			for j := 0; j+1 < len(segs); j += 2 {
				segs[j], segs[j+1] = segs[j+1], segs[j]
			}
		}
		for j, s := range segs {
			frames = append(frames, s)
			if j%2 == 1 {
				frames = append(frames, c.frame(true, c.cseq, c.sseq-uint32(len(resp)-min(len(resp), (j+1)*1448)), false, false, false, nil))
			}
		}
		frames = append(frames, c.ack())
	}
	return frames, total
}

// benchTracker feeds the connection; with decoded > 0 the throughput is
// counted in decoded body bytes (for compressed responses).
func benchTracker(b *testing.B, resp string, reorder bool, decoded int) {
	frames, total := benchConn(b, 64, resp, reorder)
	ts := time.Unix(1_700_000_000, 0)
	if decoded > 0 {
		total = 64 * decoded
	}
	b.SetBytes(int64(total))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tr, _ := NewTracker(Config{})
		n := 0
		for _, f := range frames {
			n += len(tr.Feed(ts, f.data, f.dir).Events)
		}
		if n != 64 {
			b.Fatalf("%d events", n)
		}
	}
}

var benchBody = strings.Repeat("<p>the quick brown fox jumps over the lazy dog, https://example.com/a?b=c</p>\n", 210) // 16 KiB

// BenchmarkTracker measures the whole path for 16 KiB responses on a
// kept-alive connection (frame decoding, request pairing with netparse,
// reassembly, HTTP parsing, event building); MB/s of response bytes.
func BenchmarkTracker(b *testing.B) {
	b.Run("content-length", func(b *testing.B) { benchTracker(b, okResponse(benchBody), false, 0) })
	b.Run("reordered", func(b *testing.B) { benchTracker(b, okResponse(benchBody), true, 0) })
	chunked := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
	for i := 0; i < len(benchBody); i += 4096 {
		part := benchBody[i:min(i+4096, len(benchBody))]
		chunked += hex(len(part)) + "\r\n" + part + "\r\n"
	}
	chunked += "0\r\n\r\n"
	b.Run("chunked", func(b *testing.B) { benchTracker(b, chunked, false, 0) })
	// gzip: MB/s of decoded body.
	b.Run("gzip", func(b *testing.B) {
		benchTracker(b, okResponse(gz(b, benchBody), "Content-Encoding: gzip"), false, len(benchBody))
	})
}

// BenchmarkParseResponse measures the response parser alone.
func BenchmarkParseResponse(b *testing.B) {
	in := []byte(okResponse(benchBody, "Set-Cookie: a=b", "Cache-Control: no-cache", "Server: bench"))
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := ParseResponse(in, "GET", false, Config{}); err != nil {
			b.Fatal(err)
		}
	}
}
