package respwatch

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func deflateRaw(t testing.TB, s string) string {
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.DefaultCompression)
	w.Write([]byte(s))
	w.Close()
	return b.String()
}

func zlibData(t testing.TB, s string) string {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	w.Write([]byte(s))
	w.Close()
	return b.String()
}

func TestParseResponse(t *testing.T) {
	page := "<html><a href=\"http://evil.example/x\">x</a></html>"
	big := strings.Repeat("0123456789", 300) // 3000 bytes
	type want struct {
		Status     int
		Framing    Framing
		Body       string
		WireLen    int64
		Encodings  []string
		Incomplete bool
		N          int // bytes used; -1: all
	}
	cases := []struct {
		name    string
		in      string
		method  string
		eof     bool
		cfg     Config
		want    want
		err     error // a sentinel the error wraps
		opaque  error // a sentinel Response.Opaque wraps
		prefix  bool  // the body is a non-empty prefix of want.Body
		comment string
	}{
		{name: "content-length", in: okResponse(page), want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(page)), N: -1}},
		{name: "content-length followed by the next response",
			in:   okResponse("one") + okResponse("two"),
			want: want{Status: 200, Framing: FrameLength, Body: "one", WireLen: 3, N: len(okResponse("one"))}},
		{name: "zero length", in: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", want: want{Status: 200, Framing: FrameLength, N: -1}},
		{name: "bare LF line ends", in: "HTTP/1.1 200 OK\nContent-Length: 2\n\nhi", want: want{Status: 200, Framing: FrameLength, Body: "hi", WireLen: 2, N: -1}},
		{name: "status without reason", in: "HTTP/1.1 404\r\nContent-Length: 1\r\n\r\nx", want: want{Status: 404, Framing: FrameLength, Body: "x", WireLen: 1, N: -1}},
		{name: "stray CRLF before the status line", in: "\r\n" + okResponse("ok"), want: want{Status: 200, Framing: FrameLength, Body: "ok", WireLen: 2, N: -1}},
		{name: "chunked with extension and trailer",
			in:   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Checksum: abc\r\n\r\n",
			want: want{Status: 200, Framing: FrameChunked, Body: "hello, world", WireLen: 12, N: -1}},
		{name: "chunked overrides content-length",
			in:   "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			want: want{Status: 200, Framing: FrameChunked, Body: "abc", WireLen: 3, N: -1}},
		{name: "transfer-encoding not ending in chunked reads to close",
			in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nuntil the end", eof: true,
			want: want{Status: 200, Framing: FrameClose, Body: "until the end", WireLen: 13, N: -1}},
		{name: "close-delimited", in: "HTTP/1.0 200 OK\r\n\r\nall of it", eof: true,
			want: want{Status: 200, Framing: FrameClose, Body: "all of it", WireLen: 9, N: -1}},
		{name: "close-delimited needs the end", in: "HTTP/1.0 200 OK\r\n\r\nall of it", err: ErrNeedMore},
		{name: "HEAD has no body", method: "HEAD", in: "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n",
			want: want{Status: 200, Framing: FrameNone, N: -1}},
		{name: "204 has no body", in: "HTTP/1.1 204 No Content\r\nContent-Length: 50\r\n\r\n", want: want{Status: 204, Framing: FrameNone, N: -1}},
		{name: "304 has no body", in: "HTTP/1.1 304 Not Modified\r\n\r\n", want: want{Status: 304, Framing: FrameNone, N: -1}},
		{name: "100 continue is interim", in: "HTTP/1.1 100 Continue\r\n\r\n" + okResponse("x"),
			want: want{Status: 100, Framing: FrameNone, N: len("HTTP/1.1 100 Continue\r\n\r\n")}},
		{name: "101 switches protocols", in: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello",
			want: want{Status: 101, Framing: FrameTunnel, N: len("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")}},
		{name: "CONNECT 200 is a tunnel", method: "CONNECT", in: "HTTP/1.1 200 Connection established\r\n\r\n\x16\x03\x01",
			want: want{Status: 200, Framing: FrameTunnel, N: len("HTTP/1.1 200 Connection established\r\n\r\n")}},
		{name: "gzip", in: okResponse(gz(t, page), "Content-Encoding: gzip"),
			want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(gz(t, page))), Encodings: []string{"gzip"}, N: -1}},
		{name: "deflate (zlib)", in: okResponse(zlibData(t, page), "Content-Encoding: deflate"),
			want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(zlibData(t, page))), Encodings: []string{"deflate"}, N: -1}},
		{name: "deflate (raw, as some servers send it)", in: okResponse(deflateRaw(t, page), "Content-Encoding: deflate"),
			want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(deflateRaw(t, page))), Encodings: []string{"deflate"}, N: -1}},
		{name: "gzip twice", in: okResponse(gz(t, gz(t, page)), "Content-Encoding: gzip, gzip"),
			want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(gz(t, gz(t, page)))), Encodings: []string{"gzip", "gzip"}, N: -1}},
		{name: "identity is no coding", in: okResponse(page, "Content-Encoding: identity"),
			want: want{Status: 200, Framing: FrameLength, Body: page, WireLen: int64(len(page)), N: -1}},
		{name: "brotli kept raw", in: okResponse("\x1b\x03raw", "Content-Encoding: br"), opaque: ErrEncoding,
			want: want{Status: 200, Framing: FrameLength, Body: "\x1b\x03raw", WireLen: 5, Encodings: []string{"br"}, N: -1}},
		{name: "gzip that does not decode", in: okResponse("not gzip at all", "Content-Encoding: gzip"), opaque: ErrDecode,
			want: want{Status: 200, Framing: FrameLength, WireLen: 15, Encodings: []string{"gzip"}, N: -1}},
		{name: "body over the limit", in: okResponse(big), cfg: Config{MaxBodyBytes: 1000}, opaque: ErrBodyTooBig,
			want: want{Status: 200, Framing: FrameLength, Body: big[:1000], WireLen: 3000, N: -1}},
		{name: "decoded body over the limit (a bomb)", in: okResponse(gz(t, strings.Repeat("A", 100000)), "Content-Encoding: gzip"),
			cfg: Config{MaxBodyBytes: 4096}, opaque: ErrBodyTooBig,
			want: want{Status: 200, Framing: FrameLength, Body: strings.Repeat("A", 4096), WireLen: int64(len(gz(t, strings.Repeat("A", 100000)))), Encodings: []string{"gzip"}, N: -1}},
		{name: "stream ends inside the body", in: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", eof: true,
			want: want{Status: 200, Framing: FrameLength, Body: "abc", WireLen: 3, Incomplete: true, N: -1}},
		{name: "gzip cut short", in: "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1000\r\n\r\n" + gz(t, big)[:40], eof: true,
			want:   want{Status: 200, Framing: FrameLength, Body: big, WireLen: 40, Encodings: []string{"gzip"}, Incomplete: true, N: -1},
			prefix: true, comment: "what decodes of the prefix, not opaque: the guest got the same"},
		{name: "incomplete head", in: "HTTP/1.1 200 OK\r\nContent-", err: ErrNeedMore},
		{name: "not http", in: "SSH-2.0-OpenSSH_9.2\r\n", err: ErrHTTP},
		{name: "http/2 preface is not http/1", in: "HTTP/2 200\r\n\r\n", err: ErrHTTP},
		{name: "bad status code", in: "HTTP/1.1 2x0 OK\r\n\r\n", err: ErrHTTP},
		{name: "conflicting content-length", in: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", err: ErrHTTP},
		{name: "repeated equal content-length", in: "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nab",
			want: want{Status: 200, Framing: FrameLength, Body: "ab", WireLen: 2, N: -1}},
		{name: "negative content-length", in: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", err: ErrHTTP},
		{name: "obs-fold", in: "HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", err: ErrHTTP},
		{name: "header without colon", in: "HTTP/1.1 200 OK\r\nnocolon\r\n\r\n", err: ErrHTTP},
		{name: "bad chunk size", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", err: ErrHTTP},
		{name: "chunk data without CRLF", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX", err: ErrHTTP},
		{name: "chunk size line too long", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + strings.Repeat("e", 2000) + "\r\n", err: ErrHTTP},
		{name: "trailer over the limit", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: " + strings.Repeat("t", 2000) + "\r\n\r\n",
			cfg: Config{MaxHeaderBytes: 1024}, err: ErrHTTP},
		{name: "head over the limit", in: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 2000) + "\r\n\r\n", cfg: Config{MaxHeaderBytes: 1024}, err: ErrHeadTooBig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = "GET"
			}
			resp, n, err := ParseResponse([]byte(tc.in), method, tc.eof, tc.cfg)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("error %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			w := tc.want
			if w.N < 0 {
				w.N = len(tc.in)
			}
			got := want{Status: resp.Status, Framing: resp.Framing, Body: string(resp.Body), WireLen: resp.WireLen,
				Encodings: resp.Encodings, Incomplete: resp.Incomplete, N: n}
			if len(got.Encodings) == 0 {
				got.Encodings = nil
			}
			if tc.prefix && len(got.Body) > 0 && len(got.Body) < len(w.Body) && strings.HasPrefix(w.Body, got.Body) {
				got.Body = w.Body
			}
			if d := cmp.Diff(w, got); d != "" {
				t.Errorf("-want +got\n%s", d)
			}
			switch {
			case tc.opaque == nil && resp.Opaque != nil:
				t.Errorf("opaque: %v, want none", resp.Opaque)
			case tc.opaque != nil && !errors.Is(resp.Opaque, tc.opaque):
				t.Errorf("opaque: %v, want %v", resp.Opaque, tc.opaque)
			}
		})
	}
}

// TestReaderSplits feeds responses in two parts at every split point:
// the result must not depend on where the segments end.
func TestReaderSplits(t *testing.T) {
	inputs := []string{
		okResponse("hello world", "Set-Cookie: sid=1"),
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n6\r\n world\r\n0\r\nT: v\r\n\r\n",
		"\r\nHTTP/1.1 200 OK\nContent-Length: 3\n\nabc",
		"HTTP/1.1 100 Continue\r\n\r\n",
		okResponse(gz(t, "compressed text"), "Content-Encoding: gzip"),
	}
	cfg, _ := Config{}.withDefaults()
	for _, in := range inputs {
		whole, nw, errw := ParseResponse([]byte(in), "GET", false, Config{})
		if errw != nil {
			t.Fatalf("%q: %v", in, errw)
		}
		for i := 0; i <= len(in); i++ {
			r := newReader(&cfg, nil, &decoder{})
			r.begin("GET")
			n1, st1, err := r.feed([]byte(in[:i]))
			switch {
			case st1 == stDone || st1 == stInterim:
				// Complete within the first part: only when it holds it all.
				if n1 != nw || i != len(in) {
					t.Fatalf("%q split %d: done after %d bytes, want %d", in, i, n1, nw)
				}
			case err != nil || n1 != i:
				t.Fatalf("%q split %d: first part: n=%d st=%d err=%v", in, i, n1, st1, err)
			default:
				n2, st2, err := r.feed([]byte(in[i:]))
				if err != nil || (st2 != stDone && st2 != stInterim) || n1+n2 != nw {
					t.Fatalf("%q split %d: second part: n=%d st=%d err=%v", in, i, n2, st2, err)
				}
			}
			got := r.finish()
			if got.Status != whole.Status || string(got.Body) != string(whole.Body) || got.WireLen != whole.WireLen {
				t.Fatalf("%q split %d: %d %q %d, whole gives %d %q %d", in, i, got.Status, got.Body, got.WireLen, whole.Status, whole.Body, whole.WireLen)
			}
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{{MaxBodyBytes: -1}, {MaxHeaderBytes: 100}, {PendingTimeout: -1}, {HeaderValues: []string{"Bad Name"}}, {MaxWireBytes: 2 << 30}} {
		if _, err := NewTracker(c); err == nil || !strings.HasPrefix(err.Error(), "respwatch: config ") {
			t.Errorf("%+v: error %v, want a respwatch: config error", c, err)
		}
	}
}
