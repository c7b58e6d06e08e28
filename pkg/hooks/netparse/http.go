package netparse

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/carbd/carbd/pkg/hooks/netparse/http1"
)

// ErrHTTP marks a request carbd cannot frame unambiguously; the rest of
// the connection is then one opaque effect.
var ErrHTTP = errors.New("netparse: malformed http request")

// Header is one header (or trailer) field; both slices are views.
type Header struct {
	Name, Value []byte
}

// HTTPRequest is one HTTP/1.x request. Its slices are views into the
// flow's buffer or the parser's body buffer.
type HTTPRequest struct {
	Method, Target, Version []byte
	// Host is the authority of the absolute-form target, else the Host
	// header, as sent (it may carry a port).
	Host []byte
	// UserInfo is the userinfo of an absolute-form target ("user:pass").
	UserInfo []byte
	// Path and Query split an origin-form or absolute-form target; Query
	// excludes the '?'.
	Path, Query []byte
	Headers     []Header
	Trailers    []Header
	// Body is the body after dechunking, at most Config.MaxBodyBytes.
	Body []byte
	// BodyLen is the declared Content-Length, or for a chunked body the
	// length decoded (up to where carbd stopped reading).
	BodyLen int64
	Chunked bool
	// Truncated says the body exceeded MaxBodyBytes: Body holds its start.
	Truncated bool
	// Tunnel says what follows the request is not HTTP (CONNECT, or an
	// Upgrade the server may accept).
	Tunnel bool
	// HeadOnly says this effect is the head alone: its body comes as a
	// later effect (Expect: 100-continue, or the body was late).
	HeadOnly bool
	// BodyOnly says this effect is the body of a request whose head was an
	// earlier effect; the head fields are copied from it.
	BodyOnly bool
}

func (r *HTTPRequest) reset() {
	h, t := r.Headers[:0], r.Trailers[:0]
	*r = HTTPRequest{Headers: h, Trailers: t}
}

const (
	maxMethodLen  = 32
	maxHeaderN    = 128
	maxLeadBlanks = 4
)

// methodChar is what carbd accepts in a method: the registered methods
// use uppercase letters and '-'. Other tokens (legal but unused) make the
// stream opaque, which also tells other protocols apart early ("SSH-2.0").
var methodChar = func() (t [256]bool) {
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	t['-'], t['_'] = true, true
	return
}()

// skipBlankLines returns how many leading bytes are empty lines (CRLF or
// LF) a server ignores before a request line (RFC 9112 §2.2), or -1 if
// there are too many. complete is false while b ends inside those empty
// lines: more of them may follow, so the count is not final.
func skipBlankLines(b []byte) (n int, complete bool) {
	for i := 0; i < maxLeadBlanks; i++ {
		switch {
		case bytes.HasPrefix(b[n:], []byte("\r\n")):
			n += 2
		case bytes.HasPrefix(b[n:], []byte("\n")):
			n++
		default:
			return n, len(b) > n && !(len(b) == n+1 && b[n] == '\r')
		}
	}
	if bytes.HasPrefix(b[n:], []byte("\n")) || bytes.HasPrefix(b[n:], []byte("\r\n")) {
		return -1, true
	}
	return n, len(b) > n && !(len(b) == n+1 && b[n] == '\r')
}

// httpPrefixOK reports whether b can be the start of an HTTP/1.x request
// (b may end anywhere, even before the end of the request line).
func httpPrefixOK(b []byte) bool {
	lead, _ := skipBlankLines(b)
	if lead < 0 {
		return false
	}
	b = b[lead:]
	if len(b) == 0 || len(b) == 1 && b[0] == '\r' {
		return true // nothing yet, or half of an empty line
	}
	i := 0
	for i < len(b) && methodChar[b[i]] {
		i++
	}
	if i == len(b) {
		return i <= maxMethodLen
	}
	if i == 0 || i > maxMethodLen || b[i] != ' ' {
		return false
	}
	i++
	j := i
	for j < len(b) && b[j] > ' ' && b[j] != 0x7f {
		j++
	}
	if j == len(b) {
		return true
	}
	if j == i || b[j] != ' ' {
		return false
	}
	v := b[j+1:]
	const want = "HTTP/1."
	n := min(len(v), len(want))
	if string(v[:n]) != want[:n] {
		return false
	}
	if len(v) <= len(want) {
		return true
	}
	if v[7] != '0' && v[7] != '1' {
		return false
	}
	rest := v[8:]
	switch {
	case len(rest) == 0, rest[0] == '\n':
		return true
	case rest[0] == '\r':
		return len(rest) == 1 || rest[1] == '\n'
	}
	return false
}

// Request framing.
const (
	frameNone    = iota // no body
	frameLength         // Content-Length
	frameChunked        // Transfer-Encoding: chunked
)

// reqScan follows one request as its bytes arrive, without keeping views:
// offsets only, so the flow's buffer may move between packets.
//
// Every outcome is a function of a bounded prefix of the request's bytes
// (the first MaxHeaderBytes for the head; for a chunked body, the bytes up
// to where MaxBodyBytes of data or MaxBodyBytes+MaxHeaderBytes of wire were
// passed), never of where the segments were cut: a check that needs more
// bytes waits for them rather than guessing.
type reqScan struct {
	lead     int  // empty lines before the request line
	leadDone bool // lead is final
	lineAt   int  // start of the head line not complete yet
	seen     int  // bytes from lineAt already known to hold no LF
	// prefixOK: the request line's first prefixCheckMax bytes passed
	// requestPrefixOK.
	prefixOK bool
	headLen  int // 0 until the head is complete; includes lead
	framing  uint8
	length   int64
	expect   bool // Expect: 100-continue
	tunnel   bool
	chunk    http1.Chunked
	// bodyOnly: the head was emitted as its own effect; the scan continues
	// over the body, which starts at offset 0.
	bodyOnly bool
}

type scanStatus uint8

const (
	scanMore     scanStatus = iota // need more bytes
	scanDone                       // n is the request's length
	scanBad                        // malformed: err says why
	scanHeadBig                    // the head exceeds MaxHeaderBytes
	scanBodyBig                    // the body exceeds the limits; n is the request's length or -1 if unknown
	scanHeadDone                   // head complete and Expect: 100-continue: n is the head's length, the body follows as its own effect
)

// errRequestLine marks bytes that cannot start a request; at the start of
// a connection they are another protocol.
var errRequestLine = fmt.Errorf("%w: request line", ErrHTTP)

// prefixCheckMax bounds the bytes of a partial request line that
// requestPrefixOK looks at (after the empty lines before it): the whole
// line is checked once it is complete, so that a slowly sent long line
// costs linear time.
const prefixCheckMax = 256

// requestPrefixOK is httpPrefixOK on the first prefixCheckMax bytes of
// the request line: its answer depends only on those bytes, never on how
// many more arrived with them.
func requestPrefixOK(b []byte) bool {
	lead, _ := skipBlankLines(b)
	return httpPrefixOK(b[:min(len(b), max(lead, 0)+prefixCheckMax)])
}

// advance looks at b, the request's bytes received so far (contiguous from
// its start), and says whether the request is complete.
func (s *reqScan) advance(b []byte, cfg *Config, req *HTTPRequest) (scanStatus, int64, error) {
	if s.headLen == 0 && !s.bodyOnly {
		// Only the first MaxHeaderBytes can hold the head: what follows
		// them never changes the outcome.
		view := b[:min(len(b), cfg.MaxHeaderBytes)]
		if !s.leadDone {
			lead, complete := skipBlankLines(view)
			if lead < 0 {
				return scanBad, 0, fmt.Errorf("%w: more than %d empty lines before it", errRequestLine, maxLeadBlanks)
			}
			if !complete {
				return scanMore, 0, nil
			}
			s.lead, s.lineAt, s.seen, s.leadDone = lead, lead, 0, true
		}
		for s.headLen == 0 {
			j := bytes.IndexByte(view[s.lineAt+s.seen:], '\n')
			if j < 0 {
				s.seen = len(view) - s.lineAt
				final := len(b) >= cfg.MaxHeaderBytes
				if s.lineAt == s.lead && (final && !httpPrefixOK(view) || !s.prefixOK && !requestPrefixOK(view)) {
					return scanBad, 0, fmt.Errorf("%w %q", errRequestLine, clip(view[s.lead:], 64))
				}
				// Once its first prefixCheckMax bytes passed, the partial
				// check cannot change its answer.
				s.prefixOK = s.prefixOK || s.lineAt == s.lead && len(view)-s.lead >= prefixCheckMax
				if final {
					return scanHeadBig, 0, nil
				}
				return scanMore, 0, nil
			}
			j += s.seen
			s.seen = 0
			line := view[s.lineAt : s.lineAt+j]
			if s.lineAt == s.lead && !httpPrefixOK(view[:s.lineAt+j+1]) {
				return scanBad, 0, fmt.Errorf("%w %q", errRequestLine, clip(line, 64))
			}
			if s.lineAt > s.lead && (len(line) == 0 || (len(line) == 1 && line[0] == '\r')) {
				s.headLen = s.lineAt + j + 1
				break
			}
			s.lineAt += j + 1
		}
		req.reset()
		if err := parseHead(b[s.lead:s.headLen], req); err != nil {
			return scanBad, 0, err
		}
		s.framing, s.length, s.expect, s.tunnel = headFraming(req)
		if s.expect {
			// The client waits for 100 Continue before sending the body:
			// the head is decided alone, whether or not the body came
			// with it.
			return scanHeadDone, int64(s.headLen), nil
		}
	}
	if s.tunnel {
		return scanDone, int64(s.headLen), nil
	}
	body := b[s.headLen:]
	switch s.framing {
	case frameNone:
		return scanDone, int64(s.headLen), nil
	case frameLength:
		total := int64(s.headLen) + s.length
		if int64(len(body)) >= s.length {
			return scanDone, total, nil
		}
		if s.length > int64(cfg.MaxBodyBytes) && len(body) >= cfg.MaxBodyBytes {
			return scanBodyBig, total, nil
		}
		return scanMore, 0, nil
	case frameChunked:
		end, big, err := chunkedBody(&s.chunk, body, nil, cfg)
		switch {
		case err != nil:
			return scanBad, 0, err
		case big:
			return scanBodyBig, -1, nil
		case end >= 0:
			return scanDone, int64(s.headLen + end), nil
		}
		return scanMore, 0, nil
	}
	return scanBad, 0, fmt.Errorf("%w: unknown framing", ErrHTTP)
}

// headFraming reads how the body is framed from a parsed head.
func headFraming(req *HTTPRequest) (framing uint8, length int64, expect, tunnel bool) {
	if req.Tunnel {
		return frameNone, 0, false, true
	}
	for _, h := range req.Headers {
		if bytes.EqualFold(h.Name, []byte("expect")) && bytes.EqualFold(bytes.TrimSpace(h.Value), []byte("100-continue")) {
			expect = true
		}
	}
	switch {
	case req.Chunked:
		return frameChunked, 0, expect, false
	case req.BodyLen > 0:
		return frameLength, req.BodyLen, expect, false
	}
	return frameNone, 0, false, false
}

// parseHead parses a request head (request line, header fields, the empty
// line) into req. It refuses what servers may read differently: bare CR,
// obs-fold, whitespace before a colon, several Host headers, conflicting
// Content-Length values, Content-Length with Transfer-Encoding, a
// transfer coding that does not end in chunked.
func parseHead(head []byte, req *HTTPRequest) error {
	line, rest, err := nextLine(head)
	if err != nil {
		return err
	}
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return fmt.Errorf("%w: request line %q", ErrHTTP, clip(line, 64))
	}
	sp2 := bytes.IndexByte(line[sp1+1:], ' ')
	if sp2 <= 0 {
		return fmt.Errorf("%w: request line %q", ErrHTTP, clip(line, 64))
	}
	sp2 += sp1 + 1
	req.Method, req.Target, req.Version = line[:sp1], line[sp1+1:sp2], line[sp2+1:]
	for _, c := range req.Method {
		if !methodChar[c] {
			return fmt.Errorf("%w: method %q", ErrHTTP, clip(req.Method, 32))
		}
	}
	if len(req.Method) > maxMethodLen {
		return fmt.Errorf("%w: method longer than %d bytes", ErrHTTP, maxMethodLen)
	}
	if string(req.Version) != "HTTP/1.1" && string(req.Version) != "HTTP/1.0" {
		return fmt.Errorf("%w: version %q", ErrHTTP, clip(req.Version, 32))
	}
	for _, c := range req.Target {
		if c <= ' ' || c == 0x7f || c == '#' {
			return fmt.Errorf("%w: request target %q", ErrHTTP, clip(req.Target, 64))
		}
	}
	if err := splitTarget(req); err != nil {
		return err
	}
	var hosts, cls, tes int
	var te, hostHeader []byte
	var upgrade, connUpgrade bool
	for len(rest) > 0 {
		line, rest, err = nextLine(rest)
		if err != nil {
			return err
		}
		if len(line) == 0 {
			if len(rest) != 0 {
				return fmt.Errorf("%w: bytes after the end of the head", ErrHTTP)
			}
			break
		}
		h, err := parseField(line)
		if err != nil {
			return err
		}
		if len(req.Headers) >= maxHeaderN {
			return fmt.Errorf("%w: more than %d header fields", ErrHTTP, maxHeaderN)
		}
		req.Headers = append(req.Headers, h)
		switch {
		case bytes.EqualFold(h.Name, []byte("host")):
			hosts++
			hostHeader = h.Value
		case bytes.EqualFold(h.Name, []byte("content-length")):
			n, err := parseContentLength(h.Value)
			if err != nil {
				return err
			}
			if cls > 0 && n != req.BodyLen {
				return fmt.Errorf("%w: conflicting Content-Length values %d and %d", ErrHTTP, req.BodyLen, n)
			}
			req.BodyLen = n
			cls++
		case bytes.EqualFold(h.Name, []byte("transfer-encoding")):
			tes++
			te = h.Value
		case bytes.EqualFold(h.Name, []byte("upgrade")):
			upgrade = true
		case bytes.EqualFold(h.Name, []byte("connection")):
			if http1.HasToken(h.Value, "upgrade") {
				connUpgrade = true
			}
		}
	}
	if hosts > 1 {
		return fmt.Errorf("%w: %d Host header fields", ErrHTTP, hosts)
	}
	if req.Host == nil {
		// Origin-form: the Host header names the target. An absolute-form
		// or CONNECT target overrides it (RFC 9112 §3.2.2).
		req.Host = hostHeader
	}
	if tes > 0 {
		switch {
		case tes > 1:
			return fmt.Errorf("%w: several Transfer-Encoding fields", ErrHTTP)
		case cls > 0:
			return fmt.Errorf("%w: both Content-Length and Transfer-Encoding", ErrHTTP)
		case string(req.Version) == "HTTP/1.0":
			return fmt.Errorf("%w: Transfer-Encoding in an HTTP/1.0 request", ErrHTTP)
		}
		if err := checkChunkedLast(te); err != nil {
			return err
		}
		req.Chunked = true
	}
	if string(req.Method) == "CONNECT" {
		if cls > 0 && req.BodyLen > 0 || tes > 0 {
			return fmt.Errorf("%w: CONNECT with a body", ErrHTTP)
		}
		req.Tunnel = true
	}
	if upgrade && connUpgrade {
		req.Tunnel = true
	}
	return nil
}

// nextLine splits off one line ending in CRLF or LF; a CR elsewhere is an
// error.
func nextLine(b []byte) (line, rest []byte, err error) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, nil, fmt.Errorf("%w: line without end", ErrHTTP)
	}
	line, rest = b[:i], b[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if bytes.IndexByte(line, '\r') >= 0 {
		return nil, nil, fmt.Errorf("%w: bare CR in %q", ErrHTTP, clip(line, 64))
	}
	return line, rest, nil
}

// parseField parses "name: value" with the shared framer's rules.
func parseField(line []byte) (Header, error) {
	name, value, err := http1.ParseField(line)
	if err != nil {
		return Header{}, fmt.Errorf("%w: %w", ErrHTTP, err)
	}
	return Header{Name: name, Value: value}, nil
}

func parseContentLength(v []byte) (int64, error) {
	n, err := http1.ContentLength(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrHTTP, err)
	}
	return n, nil
}

// checkChunkedLast accepts a transfer-coding list whose last coding is
// chunked, that has chunked only once and no empty element.
func checkChunkedLast(v []byte) error {
	last, count, empty := http1.TransferCodings(v)
	if !last || count != 1 || empty {
		return fmt.Errorf("%w: Transfer-Encoding %q does not end in chunked", ErrHTTP, clip(v, 64))
	}
	return nil
}

// splitTarget fills Path, Query, Host and UserInfo from the request
// target (RFC 9112 §3.2).
func splitTarget(req *HTTPRequest) error {
	t := req.Target
	switch {
	case string(req.Method) == "CONNECT":
		if bytes.IndexByte(t, '/') >= 0 || bytes.IndexByte(t, ':') < 0 {
			return fmt.Errorf("%w: CONNECT target %q is not host:port", ErrHTTP, clip(t, 64))
		}
		req.Host = t
		return nil
	case t[0] == '/':
		req.Path, req.Query = splitQuery(t)
		return nil
	case len(t) == 1 && t[0] == '*':
		if string(req.Method) != "OPTIONS" {
			return fmt.Errorf("%w: target * with method %q", ErrHTTP, req.Method)
		}
		req.Path = t
		return nil
	}
	i := bytes.Index(t, []byte("://"))
	if i <= 0 {
		return fmt.Errorf("%w: request target %q", ErrHTTP, clip(t, 64))
	}
	for _, c := range t[:i] {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return fmt.Errorf("%w: scheme %q", ErrHTTP, clip(t[:i], 32))
		}
	}
	auth := t[i+3:]
	end := len(auth)
	if j := bytes.IndexAny(auth, "/?"); j >= 0 {
		end = j
	}
	auth, rest := auth[:end], auth[end:]
	if at := bytes.LastIndexByte(auth, '@'); at >= 0 {
		req.UserInfo, auth = auth[:at], auth[at+1:]
	}
	if len(auth) == 0 {
		return fmt.Errorf("%w: absolute target %q without a host", ErrHTTP, clip(t, 64))
	}
	req.Host = auth
	if len(rest) == 0 {
		req.Path = []byte("/")
		return nil
	}
	if rest[0] == '?' {
		req.Path = []byte("/")
		req.Query = rest[1:]
		return nil
	}
	req.Path, req.Query = splitQuery(rest)
	return nil
}

func splitQuery(t []byte) (path, query []byte) {
	if i := bytes.IndexByte(t, '?'); i >= 0 {
		return t[:i], t[i+1:]
	}
	return t, nil
}

// chunkedBody advances c over body (the body's bytes so far, from its
// start). It returns the body's length once it is complete, -1 while
// more bytes are needed; big says it passed MaxBodyBytes of data or
// MaxBodyBytes+MaxHeaderBytes of wire, where decoding stops at an exact
// byte whatever arrived beyond it. With dst, it appends the decoded data,
// up to MaxBodyBytes.
func chunkedBody(c *http1.Chunked, body []byte, dst *[]byte, cfg *Config) (end int, big bool, err error) {
	c.MaxData, c.MaxWire = int64(cfg.MaxBodyBytes), int64(cfg.MaxBodyBytes+cfg.MaxHeaderBytes)
	for {
		switch {
		case c.Done():
			return int(c.Wire), false, nil
		case c.Over():
			return -1, true, nil
		case int(c.Wire) >= len(body):
			return -1, false, nil
		}
		_, data, _, err := c.Next(body[c.Wire:])
		if err != nil {
			return 0, false, fmt.Errorf("%w: %w", ErrHTTP, err)
		}
		if dst != nil {
			if room := cfg.MaxBodyBytes - len(*dst); room > 0 {
				*dst = append(*dst, data[:min(len(data), room)]...)
			}
		}
	}
}

// trailers parses the trailer section (body[from:]) of a complete
// chunked body into req.Trailers.
func trailers(section []byte, req *HTTPRequest) {
	for {
		line, r, err := nextLine(section)
		if err != nil || len(line) == 0 {
			return
		}
		if h, err := parseField(line); err == nil {
			req.Trailers = append(req.Trailers, h)
		}
		section = r
	}
}

// clip shortens b for an error message.
func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
