package respwatch

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// readStream reads a server stream of responses to the given methods,
// fed in parts cut at the given offsets, and describes every response
// (and how the stream ended).
func readStream(t testing.TB, stream []byte, methods []string, cuts []int) []string {
	cfg, err := fuzzConfig.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := newReader(&cfg, nil, &decoder{})
	var out []string
	next := 0
	begin := func() bool {
		if next >= len(methods) {
			return false
		}
		r.begin(methods[next])
		next++
		return true
	}
	begin()
	at := 0
	for _, end := range append(cuts, len(stream)) {
		if end <= at || end > len(stream) {
			continue
		}
		b := stream[at:end]
		at = end
		for len(b) > 0 {
			n, st, err := r.feed(b)
			b = b[n:]
			switch st {
			case stBad:
				kind := "other"
				for _, s := range []error{ErrHeadTooBig, ErrMemory, ErrHTTP} {
					if errors.Is(err, s) {
						kind = s.Error()
						break
					}
				}
				return append(out, "bad: "+kind)
			case stDone:
				resp := r.finish()
				out = append(out, fmt.Sprintf("%d %v body=%q wire=%d opaque=%v incomplete=%v", resp.Status, resp.Framing, resp.Body, resp.WireLen, resp.Opaque != nil, resp.Incomplete))
				if !begin() {
					return append(out, fmt.Sprintf("trailing %d bytes", len(b)+len(stream)-at))
				}
			case stInterim:
				out = append(out, "interim")
				r.begin(methods[next-1])
			case stTunnel:
				return append(out, "tunnel")
			case stMore:
				if n == 0 && len(b) > 0 {
					t.Fatalf("feed made no progress")
				}
			}
		}
	}
	if r.eof() {
		resp := r.finish()
		out = append(out, fmt.Sprintf("at eof: %d %v body=%q wire=%d incomplete=%v", resp.Status, resp.Framing, resp.Body, resp.WireLen, resp.Incomplete))
	}
	return out
}

var segmentResponses = []struct {
	name    string
	methods []string
	stream  string
}{
	{"keep-alive", []string{"GET", "HEAD", "GET"}, okResponse("one") + okResponse("") + okResponse("three")},
	{"chunked pipelined", []string{"GET", "GET"}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n" + okResponse("next")},
	{"lax line ends", []string{"GET", "GET"}, "HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n3 ;e\nabc\n0\n\n\r\nHTTP/1.1 204 No Content\r\n\r\n"},
	{"interim", []string{"PUT"}, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"},
	{"close delimited", []string{"GET"}, "HTTP/1.0 200 OK\r\n\r\nuntil the end"},
	{"bad chunk", []string{"GET"}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"},
	{"trailer too big", []string{"GET"}, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: " + strings.Repeat("v", 1100) + "\r\n\r\n"},
	{"head too big", []string{"GET"}, "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("h", 1100) + "\r\n\r\n"},
	{"gzip", []string{"GET"}, okResponse("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff\xcbH\xcd\xc9\xc9\x07\x00\x86\xa6\x106\x05\x00\x00\x00", "Content-Encoding: gzip")},
	{"switching", []string{"GET"}, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello"},
}

// TestResponseSegmentation: every single cut and random multi-cut
// segmentations of a server stream read as the whole stream does.
func TestResponseSegmentation(t *testing.T) {
	for _, tc := range segmentResponses {
		t.Run(tc.name, func(t *testing.T) {
			want := readStream(t, []byte(tc.stream), tc.methods, nil)
			for cut := 1; cut < len(tc.stream); cut++ {
				if got := readStream(t, []byte(tc.stream), tc.methods, []int{cut}); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("cut at %d:\n got %q\nwant %q", cut, got, want)
				}
			}
			rng := rand.New(rand.NewPCG(7, 15))
			for range 100 {
				var cuts []int
				for at := 0; at < len(tc.stream); at += 1 + rng.IntN(12) {
					cuts = append(cuts, at)
				}
				if got := readStream(t, []byte(tc.stream), tc.methods, cuts); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("cuts %v:\n got %q\nwant %q", cuts, got, want)
				}
			}
		})
	}
}

// FuzzResponseSegments: a stream of responses (to GET, or HEAD where the
// method byte says) reads the same in any segmentation.
func FuzzResponseSegments(f *testing.F) {
	for _, tc := range segmentResponses {
		f.Add([]byte(tc.stream), []byte{0, 1, 0}, []byte{3, 9, 27, 81})
	}
	f.Fuzz(func(t *testing.T, stream, methodBytes, cutBytes []byte) {
		if len(stream) > 8192 || len(methodBytes) > 16 {
			return
		}
		methods := []string{"GET"}
		for _, m := range methodBytes {
			methods = append(methods, []string{"GET", "HEAD", "PUT", "CONNECT"}[m%4])
		}
		var cuts []int
		at := 0
		for _, c := range cutBytes {
			at += 1 + int(c)
			cuts = append(cuts, at)
		}
		want := readStream(t, stream, methods, nil)
		if got := readStream(t, stream, methods, cuts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("cuts %v:\n got %q\nwant %q", cuts, got, want)
		}
	})
}
