package netparse

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// flowKey is a TCP (or UDP) 4-tuple, client to server.
type flowKey struct {
	src, dst netip.AddrPort
}

// Stream modes: what the bytes at f.next are.
const (
	modeDetect uint8 = iota // the first bytes of the connection
	modeHTTP                // HTTP/1.x requests
	modeTLS                 // a TLS ClientHello in progress
	modeDNS                 // DNS over TCP
	modeOpen                // an open effect covers the rest
)

// span32 is a received byte range relative to flow.base.
type span32 struct{ lo, hi int }

// maxHoles bounds the out-of-order ranges a flow keeps.
const maxHoles = 32

// flow is the client-to-server stream of one TCP connection.
//
// buf holds bytes from sequence number base. [base, next) is bytes of
// effects already returned, retained to compare retransmissions with;
// [next, ...) is bytes not decided yet, possibly with holes. have lists
// the ranges received.
type flow struct {
	key     flowKey
	synSeen bool
	isn     uint32
	refused error
	base    uint32
	next    uint32
	buf     []byte
	acct    int // bytes of buf counted in Parser.streamBytes
	have    []span32
	mode    uint8
	// all: the stream's start was not seen; one effect covers it all.
	all bool
	// skip: [skipFrom, skipTo) was covered by an oversized request whose
	// end carbd did not buffer.
	skipping         bool
	skipFrom, skipTo uint32
	http             httpFramer
	hello            helloScan
	fin              bool
	finSeq           uint32
	last, progress   time.Time
	inTrims, dead    bool
}

func (f *flow) rel(seq uint32) int { return int(int32(seq - f.base)) }

// contigEnd is the end (relative) of the bytes received without a hole
// from next.
func (f *flow) contigEnd() int {
	n := f.rel(f.next)
	if len(f.have) == 0 || f.have[0].lo > n {
		return n
	}
	return max(n, f.have[0].hi)
}

// pending reports whether undecided bytes are waiting with no hole before
// them.
func (f *flow) pending() bool {
	return f.refused == nil && !f.all && f.mode != modeOpen && f.contigEnd() > f.rel(f.next)
}

func (p *Parser) newFlow(k flowKey, start uint32, now time.Time) *flow {
	f := &flow{key: k, base: start, next: start, last: now, progress: now}
	if n := len(p.free); n > 0 {
		f.buf, p.free = p.free[n-1], p.free[:n-1]
		p.streamBytes += cap(f.buf)
		f.acct = cap(f.buf)
	}
	p.flows[k] = f
	return f
}

// dropFlow forgets a flow; its buffer is recycled at the next call, since
// effects returned now may point into it.
func (p *Parser) dropFlow(k flowKey, f *flow) {
	if p.flows[k] == f {
		delete(p.flows, k)
	}
	if !f.dead {
		f.dead = true
		p.dead = append(p.dead, f)
	}
}

// maintain runs the work deferred from the previous call: trimming
// retained bytes and recycling buffers of forgotten flows.
func (p *Parser) maintain() {
	for _, f := range p.trims {
		f.inTrims = false
		if !f.dead {
			p.trim(f)
		}
	}
	clear(p.trims)
	p.trims = p.trims[:0]
	for _, f := range p.dead {
		p.streamBytes -= f.acct
		if f.buf != nil && len(p.free) < 64 {
			p.free = append(p.free, f.buf[:0])
		}
		f.buf, f.acct, f.have = nil, 0, nil
	}
	clear(p.dead)
	p.dead = p.dead[:0]
}

func (p *Parser) scheduleTrim(f *flow) {
	if !f.inTrims {
		f.inTrims = true
		p.trims = append(p.trims, f)
	}
}

// trim drops retained bytes beyond RetainBytes (when there are twice as
// many, so that copying stays linear), or everything before next after a
// skip left a hole.
func (p *Parser) trim(f *flow) {
	n := f.rel(f.next)
	drop := 0
	switch {
	case n <= 0:
		return
	case len(f.have) == 0 || f.have[0].lo > 0 || f.have[0].hi < n:
		drop = n // a skip: nothing before next is contiguous
	case n > 2*p.cfg.RetainBytes:
		drop = n - p.cfg.RetainBytes
	default:
		return
	}
	if drop >= len(f.buf) {
		f.buf = f.buf[:0]
	} else {
		m := copy(f.buf, f.buf[drop:])
		f.buf = f.buf[:m]
	}
	w := 0
	for _, r := range f.have {
		r.lo, r.hi = max(r.lo-drop, 0), r.hi-drop
		if r.hi > 0 {
			f.have[w] = r
			w++
		}
	}
	f.have = f.have[:w]
	f.base += uint32(drop)
}

// refuseFlow refuses everything the flow sends from now on.
func (p *Parser) refuseFlow(f *flow, err error) {
	f.refused = err
	f.mode = modeOpen
}

// window is how far beyond next a segment may reach.
func (p *Parser) window() int { return 2*p.cfg.MaxHeaderBytes + p.cfg.MaxBodyBytes }

func (p *Parser) sweepIdle(now time.Time) {
	for k, f := range p.flows {
		if now.Sub(f.last) >= p.cfg.FlowIdle {
			p.dropFlow(k, f)
		}
	}
}

func (p *Parser) tcp(pk *Packet, now time.Time, res *Result) {
	k := flowKey{pk.SrcAddrPort(), pk.DstAddrPort()}
	f := p.flows[k]
	data, seq, fl := pk.Payload, pk.Seq, pk.Flags
	if f != nil && f.refused != nil {
		// A refused 4-tuple stays refused until it has been idle for
		// FlowIdle, whatever it sends (a new SYN, a reset).
		f.last = now
		res.Err = f.refused
		return
	}
	if fl&FlagRST != 0 {
		if len(data) > 0 {
			res.Err = ErrRSTData
			return
		}
		if f != nil {
			p.dropFlow(k, f)
		}
		res.Action = NoData
		return
	}
	if fl&FlagSYN != 0 {
		if f == nil || !f.synSeen || f.isn != seq {
			if f != nil {
				p.dropFlow(k, f)
			}
			if !p.roomForFlow(now) {
				res.Err = fmt.Errorf("%w: %d flows", ErrFlowsFull, len(p.flows))
				return
			}
			f = p.newFlow(k, seq+1, now)
			f.synSeen, f.isn = true, seq
		}
		seq++ // the SYN takes one sequence number
	}
	if f == nil {
		if len(data) == 0 {
			res.Action = NoData
			return
		}
		// Data of a connection whose start carbd did not see: it cannot
		// know where requests begin, so the whole connection is one
		// opaque effect.
		if !p.roomForFlow(now) {
			res.Err = fmt.Errorf("%w: %d flows", ErrFlowsFull, len(p.flows))
			return
		}
		f = p.newFlow(k, seq, now)
		f.all = true
		e := p.streamEffect(f, KindTCPOpaque, now, res)
		e.Span, e.Seq = SpanFlow, seq
		e.Content = data[:min(len(data), p.cfg.MaxOpaqueBytes)]
		e.Opaque = ErrNoSYN
		res.Action = Decide
		return
	}
	f.last = now
	if fl&FlagURG != 0 && len(data) > 0 {
		// Receivers may take the urgent byte out of the stream, so the
		// server would read other bytes than carbd.
		p.refuseFlow(f, fmt.Errorf("%w: seq %d", ErrTCPUrgent, seq))
		res.Err = f.refused
		return
	}
	if f.all {
		res.Action = Covered
		if len(data) == 0 {
			res.Action = NoData
		}
		return
	}
	if fl&FlagFIN != 0 && !f.fin {
		f.fin, f.finSeq = true, seq+uint32(len(data))
	}
	if len(data) == 0 {
		res.Action = NoData
		if f.fin {
			p.advance(f, now, res)
		}
		return
	}
	p.segment(f, seq, data, now, res)
}

func (p *Parser) roomForFlow(now time.Time) bool {
	if len(p.flows) < p.cfg.MaxFlows {
		return true
	}
	p.sweepIdle(now)
	return len(p.flows) < p.cfg.MaxFlows
}

// segment adds the data of one segment to the flow and parses what it
// completes.
func (p *Parser) segment(f *flow, seq uint32, data []byte, now time.Time, res *Result) {
	segEnd := seq + uint32(len(data))
	lo := f.rel(seq)
	hi := lo + len(data)
	if lo < 0 {
		// Bytes before the retained ones: acceptable only inside a range
		// an oversized request covered without buffering.
		inSkip := f.skipping && int32(seq-f.skipFrom) >= 0 && int32(f.base-f.skipTo) <= 0
		if !inSkip {
			res.Action, res.Err = Drop, fmt.Errorf("%w: seq %d, retained from %d", ErrTCPStale, seq, f.base)
			return
		}
		if hi <= 0 {
			res.Action = Covered
			return
		}
		data, lo = data[-lo:], 0
	}
	nextRel := f.rel(f.next)
	if lo < nextRel {
		// Bytes of effects already returned: a retransmission must carry
		// the same bytes.
		e := min(hi, nextRel)
		if !bytes.Equal(f.buf[lo:e], data[:e-lo]) {
			p.refuseFlow(f, fmt.Errorf("%w: seq %d-%d", ErrTCPConflict, f.base+uint32(lo), f.base+uint32(e)))
			res.Err = f.refused
			return
		}
		if hi <= nextRel {
			res.Action = Covered
			return
		}
		data, lo = data[nextRel-lo:], nextRel
	}
	if f.mode == modeOpen {
		res.Action = Covered
		return
	}
	if hi-nextRel > p.window() {
		res.Action, res.Err = Drop, fmt.Errorf("%w: %d bytes past the undecided start", ErrTCPWindow, hi-nextRel)
		return
	}
	added, err := p.insert(f, lo, data)
	if err != nil {
		if f.refused != nil {
			res.Err = f.refused
			return
		}
		res.Action, res.Err = Drop, err
		return
	}
	if added {
		f.progress = now
	}
	p.advance(f, now, res)
	if f.refused != nil {
		res.Action, res.Err = Refuse, f.refused
		return
	}
	covered := f.mode == modeOpen || int32(segEnd-f.next) <= 0
	switch {
	case len(res.Effects) > 0:
		res.Action, res.Tail = Decide, !covered
	case covered:
		res.Action = Covered
	default:
		res.Action = Hold
	}
}

// insert copies data at relative offset lo into the buffer, checking
// bytes already received for conflicts.
func (p *Parser) insert(f *flow, lo int, data []byte) (bool, error) {
	hi := lo + len(data)
	touches := false
	for _, r := range f.have {
		if r.lo > hi {
			break
		}
		if r.hi < lo {
			continue
		}
		touches = true
		a, b := max(lo, r.lo), min(hi, r.hi)
		if a < b && !bytes.Equal(f.buf[a:b], data[a-lo:b-lo]) {
			p.refuseFlow(f, fmt.Errorf("%w: seq %d-%d", ErrTCPConflict, f.base+uint32(a), f.base+uint32(b)))
			return false, f.refused
		}
	}
	if !touches && len(f.have) >= maxHoles {
		return false, fmt.Errorf("%w: more than %d out-of-order ranges", ErrTCPWindow, maxHoles)
	}
	if hi > len(f.buf) {
		if err := p.grow(f, hi); err != nil {
			return false, err
		}
	}
	copy(f.buf[lo:hi], data)
	// Merge [lo, hi) into have.
	added := true
	i := 0
	for i < len(f.have) && f.have[i].hi < lo {
		i++
	}
	j := i
	nlo, nhi := lo, hi
	for j < len(f.have) && f.have[j].lo <= hi {
		if f.have[j].lo <= lo && f.have[j].hi >= hi {
			added = false
		}
		nlo, nhi = min(nlo, f.have[j].lo), max(nhi, f.have[j].hi)
		j++
	}
	if j == i {
		f.have = append(f.have, span32{})
		copy(f.have[i+1:], f.have[i:])
	} else if j > i+1 {
		f.have = append(f.have[:i+1], f.have[j:]...)
	}
	f.have[i] = span32{nlo, nhi}
	return added, nil
}

// grow makes the buffer n bytes long.
func (p *Parser) grow(f *flow, n int) error {
	if n <= cap(f.buf) {
		f.buf = f.buf[:n]
		return nil
	}
	limit := 2*p.cfg.RetainBytes + p.window()
	c := min(max(n, 2*cap(f.buf), 4096), limit)
	if c < n {
		return fmt.Errorf("%w: flow needs %d bytes", ErrTCPMemory, n)
	}
	if p.streamBytes-f.acct+c > p.cfg.MaxStreamBytes {
		return fmt.Errorf("%w: %d bytes buffered", ErrTCPMemory, p.streamBytes)
	}
	var nb []byte
	for i := len(p.free) - 1; i >= 0; i-- {
		if cap(p.free[i]) >= c {
			nb = p.free[i][:n]
			p.free[i] = p.free[len(p.free)-1]
			p.free = p.free[:len(p.free)-1]
			break
		}
	}
	if nb == nil {
		nb = make([]byte, n, c)
	}
	copy(nb, f.buf)
	p.streamBytes += cap(nb) - f.acct
	f.acct = cap(nb)
	f.buf = nb
	return nil
}

// streamEffect adds an effect of the flow's connection.
func (p *Parser) streamEffect(f *flow, k Kind, now time.Time, res *Result) *Effect {
	e := res.add()
	e.Kind, e.Time, e.Proto = k, now, ProtoTCP
	e.Family = 6
	if f.key.src.Addr().Is4() {
		e.Family = 4
	}
	e.Src, e.Dst = f.key.src, f.key.dst
	e.Seq = f.next
	return e
}

// advance parses the undecided bytes from next as far as they go.
func (p *Parser) advance(f *flow, now time.Time, res *Result) {
	for f.refused == nil {
		n, ce := f.rel(f.next), f.contigEnd()
		if ce <= n {
			return
		}
		b := f.buf[n:ce]
		atFin := f.fin && int32(f.finSeq-(f.base+uint32(ce))) <= 0
		if !p.step(f, b, atFin, now, res) {
			return
		}
	}
}

// step parses b, the undecided bytes; it returns true when it consumed
// some and more may follow.
func (p *Parser) step(f *flow, b []byte, atFin bool, now time.Time, res *Result) bool {
	switch f.mode {
	case modeDetect:
		switch {
		case f.key.dst.Port() == 53:
			f.mode = modeDNS
		case b[0] == 22:
			if !looksTLS(b) {
				p.opaque(f, b, ErrOpaqueProto, now, res)
				return false
			}
			f.mode = modeTLS
		case requestPrefixOK(b):
			f.mode = modeHTTP
		default:
			p.opaque(f, b, ErrOpaqueProto, now, res)
			return false
		}
		return true
	case modeHTTP:
		st, n, err := f.http.req.advance(b, &p.cfg, &p.scratch)
		switch st {
		case scanMore:
			if atFin {
				p.opaque(f, b, ErrStreamEnded, now, res)
			}
			return false
		case scanHeadDone:
			p.emitHead(f, b, now, res)
			return f.mode != modeOpen
		case scanDone:
			p.emitHTTP(f, b, n, false, now, res)
			return f.mode != modeOpen
		case scanBodyBig:
			p.emitHTTP(f, b, n, true, now, res)
			return f.mode != modeOpen
		case scanHeadBig:
			p.opaque(f, b, ErrOversized, now, res)
			return false
		}
		if !f.http.seen && errors.Is(err, errRequestLine) {
			// The connection's first bytes looked like the start of a
			// request and turned out not to be one: another protocol,
			// as when all of them arrive at once.
			err = fmt.Errorf("%w: %w", ErrOpaqueProto, err)
		}
		p.opaque(f, b, err, now, res)
		return false
	case modeTLS:
		if !looksTLS(b) {
			// Detected on its first byte(s); the bytes that followed
			// show it is not a TLS record after all: as when they all
			// arrive at once (segmentation invariance).
			p.opaque(f, b, ErrOpaqueProto, now, res)
			return false
		}
		msg, st, err := f.hello.next(b, p.cfg.MaxHeaderBytes, &p.tlsScratch)
		switch st {
		case tlsMore:
			if atFin {
				p.opaque(f, b, ErrStreamEnded, now, res)
			}
		case tlsDone:
			e := p.streamEffect(f, KindTLS, now, res)
			e.Span = SpanOpen
			if err := parseClientHelloMsg(msg, &e.TLS); err != nil {
				e.Kind, e.Opaque = KindTCPOpaque, err
				e.Content = b[:min(len(b), p.cfg.MaxOpaqueBytes)]
			} else {
				e.Opaque = ErrOpaqueTLS
			}
			f.mode = modeOpen
		case tlsBig:
			p.opaque(f, b, ErrOversized, now, res)
		default:
			p.opaque(f, b, err, now, res)
		}
		return false
	case modeDNS:
		if len(b) < 2 {
			if atFin {
				p.opaque(f, b, ErrStreamEnded, now, res)
			}
			return false
		}
		l := int(binary.BigEndian.Uint16(b))
		if l == 0 {
			p.opaque(f, b, fmt.Errorf("%w: zero-length message over tcp", ErrDNS), now, res)
			return false
		}
		if len(b) < 2+l {
			if atFin {
				p.opaque(f, b, ErrStreamEnded, now, res)
			}
			return false
		}
		e := p.streamEffect(f, KindDNS, now, res)
		e.Span, e.End = SpanBytes, f.next+uint32(2+l)
		e.Content = b[2 : 2+l]
		if err := parseDNSQuery(e.Content, &e.DNS); err != nil {
			e.Opaque = err
		}
		f.next = e.End
		p.scheduleTrim(f)
		return true
	}
	return false
}

// opaque returns one effect for the rest of the connection, with its
// first bytes as content.
func (p *Parser) opaque(f *flow, b []byte, why error, now time.Time, res *Result) {
	e := p.streamEffect(f, KindTCPOpaque, now, res)
	e.Span = SpanOpen
	e.Content = b[:min(len(b), p.cfg.MaxOpaqueBytes)]
	e.Opaque = why
	f.mode = modeOpen
	p.scheduleTrim(f)
}

// emitHTTP returns the request that the scan found complete (n bytes; -1
// when an oversized chunked body has no known end).
func (p *Parser) emitHTTP(f *flow, b []byte, n int64, big bool, now time.Time, res *Result) {
	e := p.streamEffect(f, KindHTTP, now, res)
	p.cover(f, e, b, f.http.fillRequest(e, b, n, big, &p.cfg))
}

// emitHead returns a request's head as its own effect; its body follows as
// another (Expect: 100-continue, or a body late past PendingTimeout).
func (p *Parser) emitHead(f *flow, b []byte, now time.Time, res *Result) {
	e := p.streamEffect(f, KindHTTP, now, res)
	p.cover(f, e, b, f.http.fillHead(e, b, &p.cfg))
}

// cover gives e the bytes it covers: n from next, or the rest of the
// connection when n < 0.
func (p *Parser) cover(f *flow, e *Effect, b []byte, n int64) {
	if n < 0 {
		e.Span = SpanOpen
		f.mode = modeOpen
	} else {
		e.Span, e.End = SpanBytes, f.next+uint32(n)
		if n > int64(len(b)) {
			f.skipping, f.skipFrom, f.skipTo = true, f.next, e.End
		}
		f.next = e.End
	}
	p.scheduleTrim(f)
}

// flush decides the undecided bytes of a flow that waited too long.
func (p *Parser) flush(f *flow, now time.Time, res *Result, why error) {
	n, ce := f.rel(f.next), f.contigEnd()
	if ce <= n {
		return
	}
	b := f.buf[n:ce]
	if f.mode == modeHTTP && f.http.req.headLen > 0 && !f.http.req.bodyOnly {
		p.emitHead(f, b, now, res)
	} else {
		p.opaque(f, b, why, now, res)
	}
	f.progress = now
}
