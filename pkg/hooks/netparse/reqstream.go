package netparse

import (
	"errors"
	"fmt"

	"github.com/carbd/carbd/pkg/hooks/netparse/http1"
)

// httpFramer is the per-connection state of the HTTP/1.x request framer,
// shared by the packet parser's flows and RequestStream.
type httpFramer struct {
	req      reqScan
	headCopy []byte // the head of a request whose body is a later effect
	seen     bool   // a request of this connection was framed
}

// fillRequest fills e for the request the scan found complete: b holds
// its bytes from its start, n is its length (-1 when an oversized chunked
// body has no known end). It returns how many bytes from b's start the
// effect covers, -1 for the rest of the connection.
func (h *httpFramer) fillRequest(e *Effect, b []byte, n int64, big bool, cfg *Config) int64 {
	e.Kind = KindHTTP
	r := &e.HTTP
	s := &h.req
	var err error
	if s.bodyOnly {
		err = parseHead(h.headCopy, r)
		r.BodyOnly = true
	} else {
		err = parseHead(b[s.lead:s.headLen], r)
	}
	if err != nil { // it parsed when the scan saw it; a failure here is a bug
		e.Kind, e.Opaque = KindTCPOpaque, err
		e.Content = b[:min(len(b), cfg.MaxOpaqueBytes)]
		return -1
	}
	body := b[s.headLen:]
	switch s.framing {
	case frameLength:
		avail := min(int64(len(body)), s.length, int64(cfg.MaxBodyBytes))
		r.Body, r.BodyLen = body[:avail], s.length
		r.Truncated = s.length > int64(cfg.MaxBodyBytes)
	case frameChunked:
		var c http1.Chunked
		end, _, _ := chunkedBody(&c, body, &e.body, cfg)
		r.Body, r.BodyLen, r.Chunked = e.body, c.Decoded, true
		r.Truncated = big
		if end >= 0 {
			trailers(body[c.TrailerAt:end], r)
		}
	}
	e.Content = r.Body
	if big || r.Truncated {
		e.Opaque = ErrOversized
	}
	tunnel := s.tunnel
	h.req = reqScan{}
	h.seen = true
	switch {
	case tunnel:
		e.Opaque, r.Tunnel = ErrOpaqueTunnel, true
		return -1
	case n < 0:
		return -1
	}
	return n
}

// fillHead fills e with the head of the request in progress, whose body
// follows as another effect (Expect: 100-continue, or a late body). It
// returns how many bytes the head covers, -1 for the rest of the
// connection.
func (h *httpFramer) fillHead(e *Effect, b []byte, cfg *Config) int64 {
	s := &h.req
	e.Kind = KindHTTP
	r := &e.HTTP
	if err := parseHead(b[s.lead:s.headLen], r); err != nil {
		e.Kind, e.Opaque = KindTCPOpaque, err
		e.Content = b[:min(len(b), cfg.MaxOpaqueBytes)]
		return -1
	}
	r.HeadOnly = true
	r.BodyLen, r.Chunked = s.length, s.framing == frameChunked
	n := int64(s.headLen)
	h.headCopy = append(h.headCopy[:0], b[s.lead:s.headLen]...)
	s.bodyOnly, s.expect, s.headLen, s.lead, s.lineAt, s.seen, s.leadDone, s.prefixOK = true, false, 0, 0, 0, 0, false, false
	h.seen = true
	return n
}

// StreamRequest is one effect framed by a RequestStream: Effect holds the
// request (Kind KindHTTP) or, when the rest of the stream cannot be
// framed, an opaque effect (Kind KindTCPOpaque, Opaque says why). Its Seq
// and End are unused: Start and End are offsets in the stream. The
// caller sets Time, Src, Dst, Proto and Family before calling Event.
type StreamRequest struct {
	Effect
	// Start and End are the stream bytes [Start, End) the effect covers;
	// End is -1 when it covers the rest of the stream (Span SpanOpen).
	// End may exceed the bytes written so far (an oversized
	// Content-Length body): the caller forwards the bytes up to End under
	// this decision, and the stream skips them as they are written.
	Start, End int64
}

// RequestStream frames the HTTP/1.x requests of one client-to-server byte
// stream with the same framer, rules and bounds as the packet parser (an
// intercepting proxy feeds it the decrypted bytes of a connection). It
// is segmentation-invariant: how the bytes are cut into Write calls never
// changes the requests or their byte ranges.
//
// Use: Write the bytes as they arrive, then call Next until it returns
// nil; forward each request's bytes [Start, End) once it is released.
// A RequestStream is not safe for concurrent use. The slices of a
// returned request are views valid until the next Write or Next.
type RequestStream struct {
	cfg     Config
	framer  httpFramer
	scratch HTTPRequest
	buf     []byte // stream bytes from off not framed yet
	off     int64  // stream offset of buf[0]
	skip    int64  // bytes still to skip (covered by an earlier request)
	total   int64  // bytes written
	open    bool   // the rest of the stream is covered
	eof     bool
	cur     StreamRequest
	trimmed int // bytes of buf framed by the previous Next
}

// ErrStreamBuffer says a RequestStream was written more bytes than its
// bounds let it hold undecided (the caller kept writing without calling
// Next and forwarding what it returned).
var ErrStreamBuffer = errors.New("netparse: request stream buffer full")

// NewRequestStream returns a framer for one stream; cfg is as for
// NewParser (MaxHeaderBytes, MaxBodyBytes and MaxOpaqueBytes apply).
func NewRequestStream(cfg Config) (*RequestStream, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &RequestStream{cfg: c}, nil
}

// Write appends the next bytes of the stream (it copies them). Bytes a
// returned request already covers (an oversized body's rest, or anything
// after an open effect) are counted and dropped. It takes at most the
// bytes the framer may need undecided (2*MaxHeaderBytes+MaxBodyBytes);
// beyond that it returns how many it took and ErrStreamBuffer: call Next,
// then write the rest.
func (s *RequestStream) Write(b []byte) (int, error) {
	if s.eof {
		return 0, fmt.Errorf("netparse: request stream: write after close")
	}
	if s.open {
		s.total += int64(len(b))
		return len(b), nil
	}
	written := 0
	if s.skip > 0 {
		k := int(min(s.skip, int64(len(b))))
		s.skip -= int64(k)
		s.off += int64(k)
		b = b[k:]
		written += k
	}
	s.compact()
	room := 2*s.cfg.MaxHeaderBytes + s.cfg.MaxBodyBytes - len(s.buf)
	take := max(0, min(room, len(b)))
	s.buf = append(s.buf, b[:take]...)
	written += take
	s.total += int64(written)
	if take < len(b) {
		return written, fmt.Errorf("%w: %d bytes undecided", ErrStreamBuffer, len(s.buf))
	}
	return written, nil
}

// Close marks the end of the stream: an incomplete request becomes an
// opaque effect (ErrStreamEnded) at the next call to Next.
func (s *RequestStream) Close() { s.eof = true }

// Written is how many bytes were written.
func (s *RequestStream) Written() int64 { return s.total }

// compact drops the bytes the previous Next framed.
func (s *RequestStream) compact() {
	if s.trimmed > 0 {
		m := copy(s.buf, s.buf[s.trimmed:])
		s.buf = s.buf[:m]
		s.trimmed = 0
	}
}

// Next returns the next effect framed from the bytes written, or nil when
// more bytes are needed (or the stream is covered to its end).
func (s *RequestStream) Next() *StreamRequest {
	s.compact()
	if s.open || len(s.buf) == 0 {
		return nil
	}
	b := s.buf
	st, n, err := s.framer.req.advance(b, &s.cfg, &s.scratch)
	e := &s.cur
	body := e.body
	e.Effect.reset()
	e.body = body[:0]
	e.Start = s.off
	var covered int64
	switch st {
	case scanMore:
		if !s.eof {
			return nil
		}
		covered = s.opaque(b, ErrStreamEnded)
	case scanHeadDone:
		covered = s.framer.fillHead(&e.Effect, b, &s.cfg)
	case scanDone:
		covered = s.framer.fillRequest(&e.Effect, b, n, false, &s.cfg)
	case scanBodyBig:
		covered = s.framer.fillRequest(&e.Effect, b, n, true, &s.cfg)
	case scanHeadBig:
		covered = s.opaque(b, ErrOversized)
	default:
		if !s.framer.seen && errors.Is(err, errRequestLine) {
			err = fmt.Errorf("%w: %w", ErrOpaqueProto, err)
		}
		covered = s.opaque(b, err)
	}
	if covered < 0 {
		e.Span, e.End = SpanOpen, -1
		s.open = true
		return e
	}
	e.Span, e.End = SpanBytes, s.off+covered
	if covered > int64(len(b)) {
		s.skip = covered - int64(len(b))
		covered = int64(len(b))
	}
	s.trimmed = int(covered)
	s.off += covered
	return e
}

func (s *RequestStream) opaque(b []byte, why error) int64 {
	e := &s.cur.Effect
	e.Kind, e.Opaque = KindTCPOpaque, why
	e.Content = b[:min(len(b), s.cfg.MaxOpaqueBytes)]
	return -1
}
