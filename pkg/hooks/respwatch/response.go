package respwatch

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unsafe"

	"github.com/carbd/carbd/pkg/hooks/netparse/http1"
)

// Header is one response header field, as received (the value trimmed of
// surrounding blanks).
type Header struct {
	Name, Value string
}

// Framing says how a response's body is delimited (RFC 9112 §6.3).
type Framing uint8

const (
	FrameNone    Framing = iota // no body: HEAD, 1xx, 204, 304
	FrameLength                 // Content-Length
	FrameChunked                // Transfer-Encoding ending in chunked
	FrameClose                  // until the server closes the connection
	FrameTunnel                 // 101, or 2xx to CONNECT: another protocol follows
)

var framingNames = [...]string{FrameNone: "none", FrameLength: "length", FrameChunked: "chunked", FrameClose: "close", FrameTunnel: "tunnel"}

func (f Framing) String() string {
	if int(f) < len(framingNames) {
		return framingNames[f]
	}
	return "framing(" + strconv.Itoa(int(f)) + ")"
}

// Response is one HTTP/1.x response.
type Response struct {
	Version string // "HTTP/1.1" or "HTTP/1.0"
	Status  int
	Reason  string
	Headers []Header
	Framing Framing
	// ContentLength is the declared length, -1 without one.
	ContentLength int64
	// Encodings are the Content-Encoding codings in the order applied,
	// lowercased, "identity" left out.
	Encodings []string
	// WireLen is how many body bytes the response carried (after
	// dechunking, before decoding), lost ones included.
	WireLen int64
	// Body is the decoded body, at most Config.MaxBodyBytes. It is only
	// valid until the parser's next call.
	Body []byte
	// Opaque says why Body is not all the response carried, nil when it
	// is.
	Opaque error
	// Incomplete: the stream ended (or was given up) before the response
	// did; Body is what had arrived.
	Incomplete bool
}

// Get returns the value of the first header field named name (case
// insensitive).
func (r *Response) Get(name string) string {
	for _, h := range r.Headers {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// reader states.
type rstate uint8

const (
	rsIdle    rstate = iota // between responses
	rsHead                  // reading the head
	rsBody                  // a Content-Length body
	rsChunked               // a chunked body (http1.Chunked)
	rsClose                 // a body that ends with the connection
	rsDone                  // complete; take it with finish
)

// status is what feed says about the bytes it consumed.
type status uint8

const (
	stMore    status = iota // everything consumed, the response is not complete
	stDone                  // a response is complete (finish it)
	stInterim               // a 1xx response ended; the final one follows
	stTunnel                // the head of a 101 or CONNECT 2xx ended; another protocol follows
	stBad                   // the bytes are not an HTTP response: err says why
)

const (
	maxLeadBlank  = 8   // stray CR/LF bytes accepted before a status line
	maxHeaderN    = 256 // header fields in one head
	maxEncodings  = 4
	minWireBuffer = 4096
	// keepBuffer: a body buffer up to this size is kept for the
	// connection's next response.
	keepBuffer = 64 << 10
)

// budget is the memory shared by every buffer of a Tracker.
type budget struct {
	used, max int
}

func (b *budget) take(n int) bool {
	if b == nil {
		return true
	}
	if n > 0 && b.used+n > b.max {
		return false
	}
	b.used += n
	return true
}

func (b *budget) give(n int) {
	if b != nil {
		b.used -= n
	}
}

// reader follows one server-to-client stream, one response at a time, as
// its bytes arrive in order. It copies the head (bounded) and the body's
// first bytes (bounded); nothing else is kept, so the caller may pass
// views into packets.
type reader struct {
	cfg *Config
	mem *budget
	// dec decodes bodies; shared by the readers of one Tracker (one
	// goroutine).
	dec *decoder

	st     rstate
	method string
	lead   int   // stray CR/LF bytes skipped before the status line
	nl     uint8 // end-of-head scan: 1 after LF, 2 after LF CR
	head   []byte
	resp   Response
	remain int64 // body bytes left (length)
	chunk  http1.Chunked
	wire   []byte
	wmax   int
	acct   int   // bytes of head and wire counted in mem
	stop   error // why collection stopped
	// started: bytes of this response were seen; emitted: it was
	// reported early (ErrPartial) and must not be reported again.
	started, emitted bool
}

func newReader(cfg *Config, mem *budget, dec *decoder) *reader {
	return &reader{cfg: cfg, mem: mem, dec: dec}
}

// begin prepares for the response to a request with the given method.
func (r *reader) begin(method string) {
	r.reset()
	r.method = method
	r.st = rsHead
}

// reset forgets the response in progress, keeping buffers (their memory
// stays accounted while they are kept).
func (r *reader) reset() {
	hs := r.resp.Headers[:0]
	enc := r.resp.Encodings[:0]
	r.resp = Response{Headers: hs, Encodings: enc, ContentLength: -1}
	r.st, r.method, r.lead, r.nl = rsIdle, "", 0, 0
	r.head, r.wire = r.head[:0], r.wire[:0]
	r.remain, r.wmax, r.chunk = 0, 0, http1.Chunked{}
	r.stop, r.started, r.emitted = nil, false, false
}

// release frees the buffers and their accounting.
func (r *reader) release() {
	r.reset()
	r.mem.give(r.acct)
	r.acct = 0
	r.head, r.wire = nil, nil
}

// trimBuffers drops buffers that grew large, so an idle kept-alive
// connection does not hold a megabyte.
func (r *reader) trimBuffers() {
	if cap(r.wire) > keepBuffer {
		r.mem.give(cap(r.wire))
		r.acct -= cap(r.wire)
		r.wire = nil
	}
	if cap(r.head) > 16<<10 {
		r.mem.give(cap(r.head))
		r.acct -= cap(r.head)
		r.head = nil
	}
}

// headParsed reports whether the head of the response in progress is
// complete.
func (r *reader) headParsed() bool { return r.st > rsHead }

// feed consumes the bytes b of the stream. It returns how many it used
// and what they completed; after stDone the caller takes the response
// with finish, after stInterim it calls begin again, after stTunnel the
// rest of the stream is not HTTP.
func (r *reader) feed(b []byte) (int, status, error) {
	n := 0
	for {
		switch r.st {
		case rsIdle, rsDone:
			return n, stMore, nil
		case rsHead:
			if n == len(b) {
				return n, stMore, nil
			}
			k, done, err := r.headBytes(b[n:])
			n += k
			if err != nil {
				return n, stBad, err
			}
			if !done {
				return n, stMore, nil
			}
			if err := r.parseHead(); err != nil {
				return n, stBad, err
			}
			switch r.resp.Framing {
			case FrameNone:
				if r.resp.Status >= 100 && r.resp.Status < 200 {
					return n, stInterim, nil
				}
				r.st = rsDone
				return n, stDone, nil
			case FrameTunnel:
				r.st = rsDone
				return n, stTunnel, nil
			case FrameLength:
				r.st, r.remain = rsBody, r.resp.ContentLength
				if r.remain == 0 {
					r.st = rsDone
					return n, stDone, nil
				}
				r.reserve(int(min(r.remain, int64(r.wmax))))
			case FrameChunked:
				// Lenient line ends, as clients read responses; the
				// trailer section is bounded like a head.
				r.st = rsChunked
				r.chunk = http1.Chunked{Lax: true, MaxTrailer: int64(r.cfg.MaxHeaderBytes)}
			case FrameClose:
				r.st = rsClose
			}
		case rsBody:
			if n == len(b) {
				return n, stMore, nil
			}
			k := int(min(r.remain, int64(len(b)-n)))
			r.collect(b[n : n+k])
			n += k
			r.remain -= int64(k)
			if r.remain == 0 {
				r.st = rsDone
				return n, stDone, nil
			}
		case rsChunked:
			if n == len(b) {
				return n, stMore, nil
			}
			k, data, st, err := r.chunk.Next(b[n:])
			r.collect(data)
			n += k
			if err != nil {
				return n, stBad, fmt.Errorf("%w: %w", ErrHTTP, err)
			}
			if st == http1.ChunkDone {
				r.st = rsDone
				return n, stDone, nil
			}
		case rsClose:
			r.collect(b[n:])
			return len(b), stMore, nil
		}
	}
}

// headBytes scans b for the end of the head (an empty line), copying the
// head's bytes. It returns how many bytes of b belong to the head.
func (r *reader) headBytes(b []byte) (int, bool, error) {
	i := 0
	if len(r.head) == 0 {
		// Stray line ends before a status line (some servers send a CRLF
		// after a body): skip a few.
		for i < len(b) && (b[i] == '\r' || b[i] == '\n') {
			if r.lead++; r.lead > maxLeadBlank {
				return i, false, fmt.Errorf("%w: more than %d line-end bytes before the status line", ErrHTTP, maxLeadBlank)
			}
			i++
		}
		if i == len(b) {
			return i, false, nil
		}
		r.started = true
	}
	start := i
	done := false
	for i < len(b) && !done {
		if r.nl == 0 {
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				i = len(b)
				break
			}
			i += j + 1
			r.nl = 1
			continue
		}
		c := b[i]
		i++
		switch {
		case c == '\n':
			done = true
		case c == '\r' && r.nl == 1:
			r.nl = 2
		default:
			r.nl = 0
			i-- // rescan c as the start of a line
		}
	}
	if len(r.head) < len("HTTP/1.") {
		// The status line's start is checked before the size, so that
		// the verdict on a long head does not depend on its segments.
		var p [len("HTTP/1.")]byte
		k := copy(p[:], r.head)
		k += copy(p[k:], b[start:i])
		if !httpPrefix(p[:k]) {
			return i, false, fmt.Errorf("%w: status line %q", ErrHTTP, p[:k])
		}
	}
	if len(r.head)+i-start > r.cfg.MaxHeaderBytes {
		return i, false, fmt.Errorf("%w: more than %d bytes", ErrHeadTooBig, r.cfg.MaxHeaderBytes)
	}
	if !r.grow(&r.head, i-start) {
		return i, false, fmt.Errorf("%w: response head", ErrMemory)
	}
	r.head = append(r.head, b[start:i]...)
	if !httpPrefix(r.head) {
		return i, false, fmt.Errorf("%w: status line %q", ErrHTTP, clip(r.head, 32))
	}
	return i, done, nil
}

// grow makes room for n more bytes in *buf, within the memory budget.
func (r *reader) grow(buf *[]byte, n int) bool {
	b := *buf
	if len(b)+n <= cap(b) {
		return true
	}
	c := max(2*cap(b), len(b)+n, 512)
	if !r.mem.take(c - cap(b)) {
		return false
	}
	r.acct += c - cap(b)
	nb := make([]byte, len(b), c)
	copy(nb, b)
	*buf = nb
	return true
}

// reserve gives the body buffer room for n bytes: a body of known length
// is kept in one allocation of its final size. Without the memory for
// it, the buffer grows as the bytes come, as far as the budget allows.
func (r *reader) reserve(n int) {
	if cap(r.wire) >= n || !r.mem.take(n-cap(r.wire)) {
		return
	}
	r.acct += n - cap(r.wire)
	nb := make([]byte, len(r.wire), n)
	copy(nb, r.wire)
	r.wire = nb
}

// content returns the body of the response finish returned, as an
// event's content. A buffer the body fills exactly (a body of known
// length, see reserve) or one too large to be kept for the next
// response (over keepBuffer) and more than half full is handed over
// without a copy: the string owns it from then on, the reader (or the
// decoder) lets go of it and never writes to it again (collection of
// this response has ended: it completed, or was reported early and
// stopped). Otherwise the body is copied and its buffer kept for the
// next response.
func (r *reader) content() string {
	b := r.resp.Body
	if len(b) == 0 {
		return ""
	}
	if len(b) <= cap(b)/2 || (len(b) < cap(b) && cap(b) <= keepBuffer) {
		return string(b)
	}
	switch {
	case len(r.wire) > 0 && &r.wire[0] == &b[0]:
		r.mem.give(cap(r.wire))
		r.acct -= cap(r.wire)
		r.wire = nil
	case len(r.dec.out[0]) > 0 && &r.dec.out[0][0] == &b[0]:
		r.dec.out[0] = nil
	default:
		return string(b)
	}
	r.resp.Body = nil
	return unsafe.String(&b[0], len(b))
}

// collect keeps the body bytes p, up to the response's limit.
func (r *reader) collect(p []byte) {
	r.resp.WireLen += int64(len(p))
	if r.stop != nil || len(p) == 0 {
		return
	}
	room := r.wmax - len(r.wire)
	take := min(room, len(p))
	if take < len(p) {
		r.stop = fmt.Errorf("%w: more than %d bytes", ErrBodyTooBig, r.wmax)
	}
	if take <= 0 {
		return
	}
	if len(r.wire)+take > cap(r.wire) {
		c := min(max(2*cap(r.wire), len(r.wire)+take, minWireBuffer), r.wmax)
		if !r.mem.take(c - cap(r.wire)) {
			r.stop = fmt.Errorf("%w: response body", ErrMemory)
			return
		}
		r.acct += c - cap(r.wire)
		nb := make([]byte, len(r.wire), c)
		copy(nb, r.wire)
		r.wire = nb
	}
	r.wire = append(r.wire, p[:take]...)
}

// lose accounts for n bytes of the stream that will never arrive. ok
// says the response's framing survives (the bytes were inside a
// Content-Length body, one chunk's data, or a close-delimited body);
// done says they ended the response.
func (r *reader) lose(n int64) (ok, done bool) {
	switch r.st {
	case rsBody:
		if n > r.remain {
			return false, false
		}
		r.remain -= n
		r.resp.WireLen += n
		r.stopLost()
		if r.remain == 0 {
			r.st = rsDone
			return true, true
		}
		return true, false
	case rsChunked:
		if !r.chunk.LoseData(n) {
			return false, false
		}
		r.resp.WireLen += n
		r.stopLost()
		return true, false
	case rsClose:
		r.resp.WireLen += n
		r.stopLost()
		return true, false
	}
	return false, false
}

func (r *reader) stopLost() {
	if r.stop == nil || errors.Is(r.stop, ErrBodyTooBig) {
		r.stop = fmt.Errorf("%w: inside the body", ErrLost)
	}
}

// eof ends the stream: a close-delimited body is complete; a response
// whose head was read is incomplete. It reports whether there is a
// response to finish.
func (r *reader) eof() bool {
	switch r.st {
	case rsClose:
		r.st = rsDone
		return true
	case rsBody, rsChunked:
		r.resp.Incomplete = true
		r.st = rsDone
		return true
	}
	return false
}

// finish returns the response that feed completed (or eof or a partial
// report cut short), with its body decoded. The response and its body
// are valid until the reader's next call.
func (r *reader) finish() *Response {
	resp := &r.resp
	resp.Body, resp.Opaque = r.wire, r.stop
	if len(resp.Encodings) > 0 && resp.Framing != FrameNone && resp.Framing != FrameTunnel {
		body, err := r.dec.decode(resp.Encodings, r.wire, r.cfg.MaxBodyBytes)
		resp.Body = body
		switch {
		case err == nil:
		case resp.Opaque != nil:
			// The body was cut short already: that is the reason.
		case errors.Is(err, io.ErrUnexpectedEOF) && resp.Incomplete:
			// The server stopped mid-stream: the guest got the same
			// prefix, nothing is hidden.
		default:
			resp.Opaque = err
		}
	}
	return resp
}

// parseHead parses r.head: the status line and the header fields, and
// decides the framing.
func (r *reader) parseHead() error {
	resp := &r.resp
	head := string(r.head) // one copy: the header strings share it
	line, rest, _ := strings.Cut(head, "\n")
	line = strings.TrimSuffix(line, "\r")
	if len(line) < 12 || (line[:8] != "HTTP/1.1" && line[:8] != "HTTP/1.0") || line[8] != ' ' {
		return fmt.Errorf("%w: status line %q", ErrHTTP, clipS(line, 64))
	}
	code := line[9:12]
	if code[0] < '1' || code[0] > '5' || code[1] < '0' || code[1] > '9' || code[2] < '0' || code[2] > '9' {
		return fmt.Errorf("%w: status code %q", ErrHTTP, code)
	}
	if len(line) > 12 && line[12] != ' ' {
		return fmt.Errorf("%w: status line %q", ErrHTTP, clipS(line, 64))
	}
	resp.Version = line[:8]
	resp.Status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if len(line) > 13 {
		resp.Reason = line[13:]
	}
	var cl int64 = -1
	var te string
	tes := 0
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\n")
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			break
		}
		if strings.IndexByte(line, '\r') >= 0 {
			return fmt.Errorf("%w: bare CR in %q", ErrHTTP, clipS(line, 64))
		}
		name, value, err := http1.ParseField(line)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrHTTP, err)
		}
		if len(resp.Headers) >= maxHeaderN {
			return fmt.Errorf("%w: more than %d header fields", ErrHTTP, maxHeaderN)
		}
		resp.Headers = append(resp.Headers, Header{Name: name, Value: value})
		switch {
		case strings.EqualFold(name, "content-length"):
			n, err := http1.ContentLength(value)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrHTTP, err)
			}
			if cl >= 0 && n != cl {
				return fmt.Errorf("%w: conflicting Content-Length values %d and %d", ErrHTTP, cl, n)
			}
			cl = n
		case strings.EqualFold(name, "transfer-encoding"):
			tes++
			if te != "" {
				te += ","
			}
			te += value
		case strings.EqualFold(name, "content-encoding"):
			for c := range strings.SplitSeq(value, ",") {
				c = strings.ToLower(strings.Trim(c, " \t"))
				if c == "" || c == "identity" {
					continue
				}
				if len(resp.Encodings) >= maxEncodings {
					return fmt.Errorf("%w: more than %d content codings", ErrHTTP, maxEncodings)
				}
				resp.Encodings = append(resp.Encodings, c)
			}
		}
	}
	resp.ContentLength = cl
	st := resp.Status
	switch {
	case st == 101:
		resp.Framing = FrameTunnel
	case st >= 100 && st < 200, r.method == "HEAD", st == 204, st == 304:
		resp.Framing = FrameNone
	case r.method == "CONNECT" && st >= 200 && st < 300:
		resp.Framing = FrameTunnel
	case tes > 0:
		// Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
		resp.Framing = FrameClose
		if last, _, _ := http1.TransferCodings(te); last {
			resp.Framing = FrameChunked
		}
	case cl >= 0:
		resp.Framing = FrameLength
	default:
		resp.Framing = FrameClose
	}
	r.wmax = r.cfg.MaxBodyBytes
	if len(resp.Encodings) > 0 {
		r.wmax = r.cfg.MaxWireBytes
	}
	return nil
}

// httpPrefix reports whether b can start a status line.
func httpPrefix(b []byte) bool {
	const want = "HTTP/1."
	n := min(len(b), len(want))
	return string(b[:n]) == want[:n]
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func clipS(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// decoder decodes gzip and deflate bodies with a bound on the output,
// reusing its readers and output buffer.
type decoder struct {
	gz  *gzip.Reader
	zl  io.ReadCloser
	fl  io.ReadCloser
	src bytes.Reader
	out [2][]byte
}

// decode undoes the codings (applied in the order given) of in, writing
// at most limit bytes. On error it returns what decoded before it. The
// result is valid until the next call.
func (d *decoder) decode(codings []string, in []byte, limit int) ([]byte, error) {
	for _, c := range codings {
		switch c {
		case "gzip", "x-gzip", "deflate":
		default:
			return in, fmt.Errorf("%w: %s", ErrEncoding, clipS(c, 32))
		}
	}
	data := in
	for i := len(codings) - 1; i >= 0; i-- {
		buf := &d.out[i%2]
		out, err := d.one(codings[i], data, limit, (*buf)[:0])
		*buf = out
		if err != nil {
			if i > 0 {
				// An outer layer failed: the inner bytes are not content.
				return in, err
			}
			return out, err
		}
		data = out
	}
	return data, nil
}

func (d *decoder) one(coding string, in []byte, limit int, out []byte) ([]byte, error) {
	d.src.Reset(in)
	var rd io.Reader
	switch coding {
	case "gzip", "x-gzip":
		var err error
		if d.gz == nil {
			d.gz, err = gzip.NewReader(&d.src)
		} else {
			err = d.gz.Reset(&d.src)
		}
		if err != nil {
			return out, fmt.Errorf("%w: gzip: %v", ErrDecode, err)
		}
		rd = d.gz
	case "deflate":
		// RFC 9110 says zlib (RFC 1950); some servers send raw deflate.
		if len(in) >= 2 && in[0]&0x0f == 8 && (uint16(in[0])<<8|uint16(in[1]))%31 == 0 {
			var err error
			if d.zl == nil {
				d.zl, err = zlib.NewReader(&d.src)
			} else {
				err = d.zl.(zlib.Resetter).Reset(&d.src, nil)
			}
			if err != nil {
				return out, fmt.Errorf("%w: deflate: %v", ErrDecode, err)
			}
			rd = d.zl
		} else {
			if d.fl == nil {
				d.fl = flate.NewReader(&d.src)
			} else {
				_ = d.fl.(flate.Resetter).Reset(&d.src, nil)
			}
			rd = d.fl
		}
	}
	for {
		if len(out) == cap(out) {
			if len(out) > limit {
				return out[:limit], fmt.Errorf("%w: decoded body larger than %d bytes", ErrBodyTooBig, limit)
			}
			// Read one byte past the limit to tell a body of exactly
			// limit bytes from a longer one.
			c := min(max(2*cap(out), 32<<10), limit+1)
			nb := make([]byte, len(out), c)
			copy(nb, out)
			out = nb
		}
		k, err := rd.Read(out[len(out):cap(out)])
		out = out[:len(out)+k]
		if len(out) > limit {
			return out[:limit], fmt.Errorf("%w: decoded body larger than %d bytes", ErrBodyTooBig, limit)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return out, fmt.Errorf("%w: %s: %w", ErrDecode, coding, io.ErrUnexpectedEOF)
			}
			return out, fmt.Errorf("%w: %s: %v", ErrDecode, coding, err)
		}
	}
}

// ParseResponse parses the HTTP/1.x response at the start of b, as the
// client of a request with the given method reads it (a response to HEAD
// has no body). eof says the stream ends with b: a body delimited by the
// connection's end ends there, and a response cut short is returned with
// Incomplete set. It returns the response and how many bytes it used;
// ErrNeedMore when b holds only the start of a response (and eof is
// false); a parse error wrapping ErrHTTP or ErrHeadTooBig when b is not
// a response carbd can frame. A 1xx interim response is returned as it
// is (the final response follows it in b). The body is bounded as cfg
// says; zero fields of cfg take their defaults.
func ParseResponse(b []byte, method string, eof bool, cfg Config) (*Response, int, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, 0, err
	}
	r := newReader(&c, nil, &decoder{})
	r.begin(method)
	n, st, err := r.feed(b)
	switch st {
	case stBad:
		return nil, n, err
	case stDone, stInterim, stTunnel:
		r.st = rsDone
	case stMore:
		if !eof {
			return nil, n, ErrNeedMore
		}
		if !r.eof() {
			return nil, n, fmt.Errorf("%w: the stream ends inside the head", ErrNeedMore)
		}
	}
	resp := r.finish()
	out := *resp
	out.Body = append([]byte(nil), resp.Body...)
	out.Headers = append([]Header(nil), resp.Headers...)
	out.Encodings = append([]string(nil), resp.Encodings...)
	return &out, n, nil
}
