package respwatch

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// Operations of the events the watcher emits.
const (
	OpResponse        = "http:response"         // an HTTP response: Content is its decoded body
	OpResponseHeaders = "http:response-headers" // values of Config.HeaderValues: "Name: value" lines
	OpTLS             = "tls:response"          // the server side of a TLS connection: no content
	OpStream          = "tcp:response"          // a server stream carbd does not parse: its first bytes
)

// Field names of the events (channel net, direction in). Opaque events
// carry netparse's "opaque" (content, empty) and "opaque.reason"
// (control) fields too.
const (
	FieldStatus      = "status"                  // control: the status code
	FieldMethod      = "method"                  // control: the request's method
	FieldContentType = "header.content-type"     // control
	FieldEncoding    = "header.content-encoding" // control
	FieldBodyLen     = "body.len"                // control: body bytes on the wire (dechunked, before decoding)
	FieldRequest     = "request"                 // control: "unknown" when the response could not be paired
	FieldIncomplete  = "incomplete"              // control: "true" when the stream ended inside the response
	FieldClaimedHost = "host.claimed"            // control: a Host (or SNI) the resolver did not give for this address
	FieldSNI         = "sni"                     // control
)

// Server-side stream modes.
const (
	mWait   uint8 = iota // nothing from the server yet
	mHTTP                // HTTP/1.x responses
	mTLS                 // TLS: reported once, nothing more
	mOpaque              // another protocol: its first bytes are reported
	mTunnel              // after CONNECT or 101: TLS or opaque, decided by the next bytes
	mDone                // nothing more to report on this connection
)

// maxSegments bounds the out-of-order segments one flow keeps.
const maxSegments = 64

type flowKey struct {
	client, server netip.AddrPort
}

// reqInfo is what a response needs of its request.
type reqInfo struct {
	method  string
	url     string // the request's Obj
	host    string // Dest.Host of the request: the Host header without port
	hostRaw string // the authority as sent (may carry a port)
	path    string // the path (without query)
	target  string // path and query
}

type seg struct {
	seq  uint32
	data []byte
}

// flow is one TCP connection: the requests the guest sent on it, waiting
// for their responses, and the server-to-client stream.
type flow struct {
	key       flowKey
	clientSYN bool
	clientISN uint32
	// synced: next is the server's next sequence number.
	synced bool
	next   uint32
	ooo    []seg
	oooLen int
	fin    bool
	finSeq uint32
	mode   uint8
	rd     *reader
	// cur is the request of the response in progress (known says it was
	// paired); reqs wait for their responses.
	cur      reqInfo
	known    bool
	reqs     []reqInfo
	debt     int
	unpaired bool
	last     reqInfo // the latest request, for naming an unpaired response
	haveLast bool
	tls      bool
	sni      string
	opq      []byte
	opqWhy   error
	opqSent  bool
	seen     time.Time // last packet
	progress time.Time // last server byte of the response in progress
}

// Result is what one frame produced. It is valid until the Tracker's
// next call.
type Result struct {
	// Events are the incoming events the frame completed.
	Events []decide.Event
	// Egress: the frame is a TCP segment the guest sent, of the flow
	// Client -> Server; SeqEnd is the sequence number just past it (SYN,
	// data, FIN), for Watcher.WaitSeen.
	Egress         bool
	Client, Server netip.AddrPort
	SeqEnd         uint32
}

// Stats counts what the tracker saw and did.
type Stats struct {
	Frames      uint64 `json:"frames"`
	Dropped     uint64 `json:"dropped"`      // frames the Watcher's full queue refused
	Undecoded   uint64 `json:"undecoded"`    // malformed frames
	Truncated   uint64 `json:"truncated"`    // frames shorter than their IP datagram (capture snaplen)
	Other       uint64 `json:"other"`        // ARP, UDP, ICMP, fragments, other protocols: not watched
	Responses   uint64 `json:"responses"`    // HTTP responses reported
	Events      uint64 `json:"events"`       // events emitted
	Opaque      uint64 `json:"opaque"`       // events flagged opaque
	Unpaired    uint64 `json:"unpaired"`     // responses without a known request
	LostBytes   uint64 `json:"lost_bytes"`   // server bytes the guest acknowledged but carbd never saw
	Desyncs     uint64 `json:"desyncs"`      // connections whose rest could not be parsed
	OOODropped  uint64 `json:"ooo_dropped"`  // out-of-order segments not kept
	Evicted     uint64 `json:"evicted"`      // flows ended to make room
	Flows       int    `json:"flows"`        // flows tracked now
	BufferBytes int    `json:"buffer_bytes"` // bytes buffered now
}

// Tracker turns captured frames into incoming events. It is not safe for
// concurrent use; Watcher runs one on its own goroutine. It never reads
// the clock: timeouts run on the frame times and on Flush's argument.
type Tracker struct {
	cfg   Config
	req   *netparse.Parser
	flows map[flowKey]*flow
	mem   budget
	dec   decoder
	stats Stats
	res   Result
	pk    pkt
}

// NewTracker returns a tracker; zero Config fields take their defaults.
func NewTracker(cfg Config) (*Tracker, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p, err := netparse.NewParser(c.Requests)
	if err != nil {
		return nil, fmt.Errorf("respwatch: request parser: %w", err)
	}
	return &Tracker{cfg: c, req: p, flows: map[flowKey]*flow{}, mem: budget{max: c.MaxBufferBytes}}, nil
}

// Config returns the configuration in use (defaults filled in).
func (t *Tracker) Config() Config { return t.cfg }

// Stats returns the counters.
func (t *Tracker) Stats() Stats {
	s := t.stats
	s.Flows, s.BufferBytes = len(t.flows), t.mem.used
	return s
}

// Feed takes one frame as captured on the host side of the sandbox's
// interface (Ethernet), with its direction: capture.Egress for what the
// guest sent, capture.Ingress for what it receives. The frame is not
// modified nor kept.
func (t *Tracker) Feed(ts time.Time, frame []byte, dir capture.Direction) *Result {
	res := &t.res
	clear(res.Events)
	*res = Result{Events: res.Events[:0]}
	t.stats.Frames++
	p := &t.pk
	if err := decodeFrame(frame, p); err != nil {
		if err == errNotIP {
			t.stats.Other++ // ARP and other link-layer traffic
		} else {
			t.stats.Undecoded++
		}
		return res
	}
	if p.truncatedIP {
		t.stats.Truncated++
	}
	if p.proto != protoTCP || p.frag {
		t.stats.Other++
		return res
	}
	switch dir {
	case capture.Egress:
		t.egress(ts, p)
	case capture.Ingress:
		t.ingress(ts, p)
	default:
		t.stats.Other++
	}
	return res
}

// FeedServer takes a segment of the server's stream of the connection
// client -> server without a frame: data starting at sequence number
// seq, the server's FIN after it when fin is set. It is what Feed does
// with an ingress frame carrying that segment (ACK set), without
// building and decoding the frame: for byte streams carbd holds in
// process (pkg/hooks/intercept's decrypted exchanges), whose bytes past
// what an event keeps then cost no copy. The addresses must be the ones
// of the connection's frames (the same family for both). data is not
// modified nor kept.
func (t *Tracker) FeedServer(ts time.Time, client, server netip.AddrPort, seq uint32, data []byte, fin bool) *Result {
	res := &t.res
	clear(res.Events)
	*res = Result{Events: res.Events[:0]}
	t.stats.Frames++
	p := &t.pk
	*p = pkt{src: server, dst: client, proto: protoTCP, seq: seq, flags: flagACK, payload: data}
	if fin {
		p.flags |= flagFIN
	}
	t.ingress(ts, p)
	return res
}

// Flush advances the tracker's clock: a response that has received
// nothing for PendingTimeout is reported with what it has, an opaque
// stream's first bytes are reported, flows idle for FlowIdle are ended,
// and requests the request parser gave up waiting for are taken. Call
// it periodically (Watcher does, every 100 ms).
func (t *Tracker) Flush(now time.Time) *Result {
	res := &t.res
	clear(res.Events)
	*res = Result{Events: res.Events[:0]}
	t.requests(t.req.Expire(now))
	for _, f := range t.flows {
		if now.Sub(f.seen) >= t.cfg.FlowIdle {
			t.endFlow(f, now)
			continue
		}
		if now.Sub(f.progress) < t.cfg.PendingTimeout {
			continue
		}
		switch {
		case f.mode == mHTTP && f.rd.headParsed() && f.rd.st != rsDone && !f.rd.emitted:
			resp := f.rd.finish()
			if resp.Opaque == nil {
				resp.Opaque = ErrPartial
			}
			resp.Incomplete = true
			t.emitHTTP(f, resp, now)
			resp.Incomplete = false
			f.rd.emitted = true
			if f.rd.stop == nil {
				f.rd.stop = ErrPartial
			}
		case f.mode == mOpaque && len(f.opq) > 0 && !f.opqSent:
			t.emitOpaque(f, now)
		}
	}
	return res
}

// nextFlush is the delay before Flush may have something to do, 0 when
// it has nothing until the next frame: flushEvery while a flow saw a frame
// less than PendingTimeout (and a flush) ago, since a response or a
// request in progress may be reported when that runs out (progress is
// never after seen); otherwise until the first flow is idle for FlowIdle
// (the request parser's flows go with the tracker's, or at most FlowIdle
// later).
func (t *Tracker) nextFlush(now time.Time) time.Duration {
	var d time.Duration
	for _, f := range t.flows {
		if now.Sub(f.seen) < t.cfg.PendingTimeout+flushEvery {
			return flushEvery
		}
		if df := max(f.seen.Add(t.cfg.FlowIdle).Sub(now), flushEvery); d == 0 || df < d {
			d = df
		}
	}
	if d == 0 && t.req.Flows() > 0 {
		d = t.cfg.FlowIdle
	}
	return d
}

// Close ends every flow, reporting the responses in progress as they are.
func (t *Tracker) Close(now time.Time) *Result {
	res := &t.res
	clear(res.Events)
	*res = Result{Events: res.Events[:0]}
	for _, f := range t.flows {
		t.endFlow(f, now)
	}
	return res
}

// egress handles a segment the guest sent: its requests, its SYN, and
// its acknowledgement of the server's bytes.
func (t *Tracker) egress(ts time.Time, p *pkt) {
	k := flowKey{p.src, p.dst}
	f := t.flows[k]
	res := &t.res
	res.Egress, res.Client, res.Server = true, p.src, p.dst
	res.SeqEnd = p.seq + uint32(len(p.payload)+p.missing)
	if p.flags&flagSYN != 0 {
		res.SeqEnd++
		if p.flags&flagACK == 0 {
			if f != nil && (!f.clientSYN || f.clientISN != p.seq) {
				t.endFlow(f, ts) // a new connection on the same 4-tuple
				f = nil
			}
			if f == nil {
				f = t.newFlow(k, ts)
			}
			f.clientSYN, f.clientISN = true, p.seq
		}
	}
	if p.flags&flagFIN != 0 {
		res.SeqEnd++
	}
	if f == nil && len(p.payload) > 0 {
		f = t.newFlow(k, ts)
	}
	if !p.truncatedIP {
		t.requests(t.req.Feed(p.ip, netparse.Meta{Time: ts}))
	}
	if f == nil {
		return
	}
	f.seen = ts
	if p.flags&flagRST != 0 {
		t.endFlow(f, ts)
		return
	}
	if p.flags&flagACK != 0 && !t.clientAck(f, p.ack, ts) {
		return // the flow ended
	}
	if len(p.payload) > 0 && f.mode == mOpaque && len(f.opq) > 0 && !f.opqSent {
		// The client's turn: what the server sent so far is one answer.
		t.emitOpaque(f, ts)
	}
}

// requests takes the requests the request parser completed.
func (t *Tracker) requests(r *netparse.Result) {
	for i := range r.Effects {
		e := &r.Effects[i]
		if e.Proto != netparse.ProtoTCP {
			continue
		}
		f := t.flows[flowKey{e.Src, e.Dst}]
		if f == nil {
			continue
		}
		switch e.Kind {
		case netparse.KindHTTP:
			if !e.HTTP.BodyOnly {
				t.pushRequest(f, requestInfo(e))
			}
		case netparse.KindTLS:
			f.tls, f.sni = true, string(e.TLS.SNI)
		}
	}
}

// requestInfo is what the tracker keeps of the HTTP request e.
func requestInfo(e *netparse.Effect) reqInfo {
	ev := e.Event()
	r := &e.HTTP
	ri := reqInfo{method: string(r.Method), url: ev.Obj, host: ev.Dest.Host, hostRaw: string(r.Host), path: string(r.Path)}
	ri.target = ri.path
	if len(r.Query) > 0 {
		ri.target += "?" + string(r.Query)
	}
	return ri
}

// Request is what the tracker keeps of a request: its method (how its
// response is framed) and its names (how the response is named). See
// Tracker.Pair.
type Request struct {
	ri reqInfo
	ok bool
}

// RequestOf returns what the tracker keeps of e, an HTTP request that
// netparse framed (its RequestStream, as pkg/hooks/intercept frames a
// decrypted client stream): the same the tracker keeps of the requests
// its own netparse parser frames from the guest's segments. ok is false
// when e is not the head of an HTTP request (another kind of effect, or
// the body of a request whose head came as an effect of its own).
func RequestOf(e *netparse.Effect) (Request, bool) {
	if e.Kind != netparse.KindHTTP || e.HTTP.BodyOnly {
		return Request{}, false
	}
	return Request{ri: requestInfo(e), ok: true}, true
}

// Pair hands the tracker a request the guest sent on the connection
// client -> server, framed by the caller: the connection's next
// response is paired with it and named by it, as with a request the
// tracker frames itself. It is for a caller that frames the guest's
// stream with netparse already and feeds the server's side with
// FeedServer (pkg/hooks/intercept): the guest's request bytes are then
// not fed at all, so they are framed once. The connection must have
// been opened by Feed (its handshake); a zero Request or an unknown
// connection is ignored.
func (t *Tracker) Pair(client, server netip.AddrPort, r Request) {
	if f := t.flows[flowKey{client, server}]; f != nil && r.ok {
		t.pushRequest(f, r.ri)
	}
}

func (t *Tracker) pushRequest(f *flow, ri reqInfo) {
	f.last, f.haveLast = ri, true
	switch {
	case f.unpaired:
		// Pairing was given up on this connection.
	case f.debt > 0:
		// Its response started before the request was complete here.
		f.debt--
	case len(f.reqs) >= t.cfg.MaxPending:
		f.unpaired = true
	default:
		f.reqs = append(f.reqs, ri)
	}
}

// ingress handles a segment the server sent.
func (t *Tracker) ingress(ts time.Time, p *pkt) {
	k := flowKey{p.dst, p.src}
	f := t.flows[k]
	if p.flags&flagRST != 0 {
		if f != nil {
			t.endFlow(f, ts)
		}
		return
	}
	seq := p.seq
	if p.flags&flagSYN != 0 {
		if f == nil {
			f = t.newFlow(k, ts)
		}
		if !f.synced || f.next != p.seq+1 {
			f.synced, f.next = true, p.seq+1
		}
		seq++
	}
	if f == nil {
		if len(p.payload) == 0 {
			return
		}
		f = t.newFlow(k, ts)
	}
	f.seen = ts
	t.serverSegment(f, seq, p.payload, p.missing, p.flags&flagFIN != 0, ts)
}

func (t *Tracker) newFlow(k flowKey, ts time.Time) *flow {
	if len(t.flows) >= t.cfg.MaxFlows {
		var old *flow
		for _, f := range t.flows {
			if old == nil || f.seen.Before(old.seen) {
				old = f
			}
		}
		t.stats.Evicted++
		t.endFlow(old, ts)
	}
	f := &flow{key: k, seen: ts, progress: ts, rd: newReader(&t.cfg, &t.mem, &t.dec)}
	t.flows[k] = f
	return f
}

// serverSegment takes server bytes [seq, seq+len(data)+missing); the
// frame lacked the last missing bytes.
func (t *Tracker) serverSegment(f *flow, seq uint32, data []byte, missing int, fin bool, ts time.Time) {
	if fin && !f.fin {
		f.fin, f.finSeq = true, seq+uint32(len(data)+missing)
	}
	if f.mode == mDone {
		if f.fin {
			t.dropFlow(f)
		}
		return
	}
	if !f.synced {
		if len(data) == 0 {
			return
		}
		t.unsynced(f, seq, data)
	}
	if len(data) > 0 {
		d := int32(seq - f.next)
		end := seq + uint32(len(data))
		switch {
		case seqLEQ(end, f.next):
			// A retransmission of bytes already taken.
		case d <= 0:
			t.deliver(f, data[-d:], ts)
			t.drain(f, ts)
		default:
			t.store(f, seq, data)
		}
	}
	t.checkFin(f, ts)
}

// unsynced starts the server stream of a connection whose handshake
// carbd did not see: a response starts at a segment boundary as often as
// not, so HTTP is tried; otherwise the stream is opaque.
func (t *Tracker) unsynced(f *flow, seq uint32, data []byte) {
	f.synced, f.next = true, seq
	switch {
	case f.tls || looksTLS(data):
		f.mode = mTLS
	case len(data) >= 8 && httpPrefix(data):
		f.mode = mHTTP
		f.unpaired = true
	default:
		f.mode, f.opqWhy = mOpaque, ErrNoStart
	}
}

// looksTLS reports whether b starts like a TLS record (handshake or
// alert, version 3.x).
func looksTLS(b []byte) bool {
	return len(b) >= 3 && (b[0] == 22 || b[0] == 21) && b[1] == 3 && b[2] <= 4
}

// store keeps an out-of-order segment.
func (t *Tracker) store(f *flow, seq uint32, data []byte) {
	if int(seq-f.next)+len(data) > t.cfg.MaxFlowBuffer || len(f.ooo) >= maxSegments || !t.mem.take(len(data)) {
		t.stats.OOODropped++
		return
	}
	s := seg{seq: seq, data: append([]byte(nil), data...)}
	i := len(f.ooo)
	for i > 0 && seqGT(f.ooo[i-1].seq, seq) {
		i--
	}
	f.ooo = append(f.ooo, seg{})
	copy(f.ooo[i+1:], f.ooo[i:])
	f.ooo[i] = s
	f.oooLen += len(data)
}

// drain delivers the stored segments that are now in order.
func (t *Tracker) drain(f *flow, ts time.Time) {
	for len(f.ooo) > 0 && f.mode != mDone {
		s := f.ooo[0]
		if seqGT(s.seq, f.next) {
			return
		}
		f.ooo = f.ooo[1:]
		f.oooLen -= len(s.data)
		t.mem.give(len(s.data))
		if end := s.seq + uint32(len(s.data)); seqGT(end, f.next) {
			t.deliver(f, s.data[f.next-s.seq:], ts)
		}
	}
}

// checkFin ends the flow once the server's stream is complete up to its
// FIN. It reports whether the flow ended.
func (t *Tracker) checkFin(f *flow, ts time.Time) bool {
	if !f.fin || f.next != f.finSeq || !f.synced {
		return false
	}
	if f.mode == mHTTP && f.rd.st != rsIdle && f.rd.eof() {
		t.complete(f, ts)
	}
	t.endFlow(f, ts)
	return true
}

// clientAck learns from the guest's acknowledgement: before the server's
// SYN-ACK was seen, where the server's stream starts; after, which server
// bytes the guest received that carbd never saw (lost: the rest of that
// response is opaque). It reports false when the flow ended.
func (t *Tracker) clientAck(f *flow, ack uint32, ts time.Time) bool {
	if !f.synced {
		if f.clientSYN {
			// The handshake's ACK acknowledges the server's ISN + 1.
			f.synced, f.next = true, ack
		}
		return true
	}
	for f.mode != mDone && seqGT(ack, f.next) {
		limit := ack
		if f.fin && seqLT(f.finSeq, limit) {
			limit = f.finSeq
		}
		if len(f.ooo) > 0 && seqLT(f.ooo[0].seq, limit) {
			limit = f.ooo[0].seq
		}
		if limit == f.next {
			break
		}
		n := limit - f.next
		t.stats.LostBytes += uint64(n)
		f.next = limit
		t.lost(f, int64(n), ts)
		t.drain(f, ts)
		if t.checkFin(f, ts) {
			return false
		}
	}
	return true
}

// lost accounts for n server bytes before f.next that will never be seen.
func (t *Tracker) lost(f *flow, n int64, ts time.Time) {
	switch f.mode {
	case mWait, mTunnel:
		if f.tls {
			f.mode = mTLS
			return
		}
		f.mode, f.opqWhy = mOpaque, ErrLost
	case mHTTP:
		if f.rd.st == rsIdle {
			t.desync(f, fmt.Errorf("%w: the start of a response", ErrLost), ts)
			return
		}
		ok, done := f.rd.lose(n)
		switch {
		case !ok:
			t.desync(f, fmt.Errorf("%w: %d bytes in the response's head or framing", ErrLost, n), ts)
		case done:
			t.complete(f, ts)
		}
	case mTLS:
		t.emitTLS(f, ts)
		f.mode = mDone
	case mOpaque:
		if f.opqWhy == nil {
			f.opqWhy = ErrLost
		}
	}
}

// deliver hands in-order server bytes to the stream's parser.
func (t *Tracker) deliver(f *flow, data []byte, ts time.Time) {
	f.next += uint32(len(data))
	for len(data) > 0 {
		switch f.mode {
		case mWait:
			switch {
			case f.tls:
				f.mode = mTLS
			case httpPrefix(data):
				f.mode = mHTTP
			case looksTLS(data):
				f.mode = mTLS
			default:
				f.mode, f.opqWhy = mOpaque, ErrNotHTTP
			}
		case mTunnel:
			if looksTLS(data) {
				f.mode = mTLS
			} else {
				f.mode, f.opqWhy = mOpaque, ErrTunnel
			}
		case mHTTP:
			data = t.httpData(f, data, ts)
		case mTLS:
			t.emitTLS(f, ts)
			f.mode = mDone
			return
		case mOpaque:
			if f.opq == nil {
				if !t.mem.take(t.cfg.MaxOpaqueBytes) {
					f.mode = mDone
					return
				}
				f.opq = make([]byte, 0, t.cfg.MaxOpaqueBytes)
			}
			take := min(t.cfg.MaxOpaqueBytes-len(f.opq), len(data))
			f.opq = append(f.opq, data[:take]...)
			f.progress = ts
			if len(f.opq) >= t.cfg.MaxOpaqueBytes {
				t.emitOpaque(f, ts)
			}
			return
		default:
			return
		}
	}
}

// httpData parses responses from data; it returns the bytes that belong
// to another protocol (after a tunnel's head), if any.
func (t *Tracker) httpData(f *flow, data []byte, ts time.Time) []byte {
	for len(data) > 0 {
		if f.rd.st == rsIdle {
			t.startResponse(f)
		}
		n, st, err := f.rd.feed(data)
		data = data[n:]
		f.progress = ts
		switch st {
		case stDone:
			t.complete(f, ts)
		case stInterim:
			f.rd.begin(f.cur.method)
		case stTunnel:
			t.complete(f, ts)
			f.mode = mTunnel
			return data
		case stBad:
			t.desync(f, err, ts)
			return nil
		}
	}
	return nil
}

// startResponse pairs the response that starts now with the oldest
// request waiting.
func (t *Tracker) startResponse(f *flow) {
	if len(f.reqs) > 0 {
		f.cur, f.known = f.reqs[0], true
		f.reqs = append(f.reqs[:0], f.reqs[1:]...)
	} else {
		if !f.unpaired {
			f.debt++
		}
		f.cur, f.known = reqInfo{}, false
	}
	f.rd.begin(f.cur.method)
}

// complete reports the response the reader finished.
func (t *Tracker) complete(f *flow, ts time.Time) {
	resp := f.rd.finish()
	if !f.rd.emitted {
		t.emitHTTP(f, resp, ts)
	}
	f.rd.reset()
	f.rd.trimBuffers()
}

// desync ends parsing of the connection's server stream: the response in
// progress is reported with what it had, flagged opaque.
func (t *Tracker) desync(f *flow, why error, ts time.Time) {
	t.stats.Desyncs++
	if f.rd.headParsed() {
		if !f.rd.emitted {
			resp := f.rd.finish()
			resp.Opaque = fmt.Errorf("the rest of the connection is not parsed: %w", why)
			t.emitHTTP(f, resp, ts)
		}
	} else {
		ev := t.httpBase(f, ts)
		ev.Op = OpResponse
		t.opaque(&ev, fmt.Errorf("the rest of the connection is not parsed: %w", why))
		t.emit(ev)
	}
	f.rd.release()
	f.mode = mDone
}

// endFlow reports what is in progress and forgets the flow.
func (t *Tracker) endFlow(f *flow, ts time.Time) {
	switch f.mode {
	case mHTTP:
		if f.rd.headParsed() && f.rd.st != rsDone && !f.rd.emitted {
			f.rd.resp.Incomplete = true
			f.rd.st = rsDone
			t.emitHTTP(f, f.rd.finish(), ts)
		}
	case mOpaque:
		if len(f.opq) > 0 && !f.opqSent {
			t.emitOpaque(f, ts)
		}
	}
	t.dropFlow(f)
}

func (t *Tracker) dropFlow(f *flow) {
	f.rd.release()
	for _, s := range f.ooo {
		t.mem.give(len(s.data))
	}
	f.ooo, f.oooLen = nil, 0
	if f.opq != nil {
		t.mem.give(t.cfg.MaxOpaqueBytes)
		f.opq = nil
	}
	f.mode = mDone
	if t.flows[f.key] == f {
		delete(t.flows, f.key)
		t.req.Forget(f.key.client, f.key.server)
	}
}

// Naming.

func addrHost(a netip.Addr) string {
	if a.Is6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

// authority is how a URL names the server by address.
func authority(ap netip.AddrPort) string {
	a := ap.Addr().Unmap()
	if ap.Port() == 80 {
		return addrHost(a)
	}
	return addrHost(a) + ":" + strconv.Itoa(int(ap.Port()))
}

func netJoin(host string, port uint16) string {
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + strconv.Itoa(int(port))
	}
	return host + ":" + strconv.Itoa(int(port))
}

// hostOK reports whether the guest's claim that host is at addr holds.
func (t *Tracker) hostOK(host string, addr netip.Addr) bool {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return a.Unmap() == addr
	}
	return t.cfg.Resolved == nil || t.cfg.Resolved(host, addr)
}

// httpBase is an HTTP event of the flow's response in progress, with its
// Obj, Source and Dest.
func (t *Tracker) httpBase(f *flow, ts time.Time) decide.Event {
	srv := f.key.server
	d := &decide.Dest{Addr: srv.Addr().Unmap(), Port: srv.Port(), Proto: "tcp"}
	ev := decide.Event{Time: ts, Ch: decide.ChanNet, Dir: decide.In, Dest: d}
	ri := &f.cur
	if !f.known {
		ri = &f.last
		if !f.haveLast {
			ri = &reqInfo{}
		}
	}
	claimed := ri.host
	if claimed != "" && t.hostOK(claimed, d.Addr) {
		d.Host = claimed
		claimed = ""
	}
	auth := authority(srv)
	if d.Host != "" && ri.hostRaw != "" {
		auth = ri.hostRaw
	}
	switch {
	case !f.known:
		ev.Obj = "http://" + auth
		ev.Source = "fetch:" + auth
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldRequest, Role: decide.RoleControl, Value: "unknown"})
	case ri.method == "CONNECT":
		ev.Obj = ri.url
		if d.Host == "" {
			ev.Obj = auth
		}
		ev.Source = "fetch:" + ev.Obj
	case d.Host != "":
		ev.Obj = ri.url
		ev.Source = "fetch:" + auth + ri.path
	default:
		ev.Obj = "http://" + auth + ri.target
		ev.Source = "fetch:" + auth + ri.path
	}
	if f.known {
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldMethod, Role: decide.RoleControl, Value: ri.method})
	}
	if claimed != "" {
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldClaimedHost, Role: decide.RoleControl, Value: claimed})
	}
	return ev
}

func (t *Tracker) emitHTTP(f *flow, resp *Response, ts time.Time) {
	base := t.httpBase(f, ts)
	if !f.known {
		t.stats.Unpaired++
	}
	// Values a client acts on without reading the body.
	var hv strings.Builder
	for _, h := range resp.Headers {
		for _, want := range t.cfg.HeaderValues {
			if strings.EqualFold(h.Name, want) {
				hv.WriteString(h.Name)
				hv.WriteString(": ")
				hv.WriteString(h.Value)
				hv.WriteByte('\n')
				break
			}
		}
	}
	if hv.Len() > 0 {
		ev := base
		ev.Fields = append([]decide.Field(nil), base.Fields...)
		ev.Op = OpResponseHeaders
		ev.Content = hv.String()
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldStatus, Role: decide.RoleControl, Value: strconv.Itoa(resp.Status)})
		t.emit(ev)
	}
	ev := base
	ev.Op = OpResponse
	ev.Content = f.rd.content() // resp is f.rd's response
	ev.Fields = append(ev.Fields, decide.Field{Name: FieldStatus, Role: decide.RoleControl, Value: strconv.Itoa(resp.Status)})
	if v := resp.Get("Content-Type"); v != "" {
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldContentType, Role: decide.RoleControl, Value: v})
	}
	if len(resp.Encodings) > 0 {
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldEncoding, Role: decide.RoleControl, Value: strings.Join(resp.Encodings, ", ")})
	}
	ev.Fields = append(ev.Fields, decide.Field{Name: FieldBodyLen, Role: decide.RoleControl, Value: strconv.FormatInt(resp.WireLen, 10)})
	if resp.Incomplete {
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldIncomplete, Role: decide.RoleControl, Value: "true"})
	}
	if resp.Opaque != nil {
		t.opaque(&ev, resp.Opaque)
	}
	t.stats.Responses++
	t.emit(ev)
}

func (t *Tracker) emitTLS(f *flow, ts time.Time) {
	srv := f.key.server
	d := &decide.Dest{Host: f.sni, Addr: srv.Addr().Unmap(), Port: srv.Port(), Proto: "tcp"}
	ev := decide.Event{Time: ts, Ch: decide.ChanNet, Dir: decide.In, Op: OpTLS, Dest: d}
	if f.sni != "" {
		// The SNI is the guest's claim; with no content, believing it can
		// only raise the label (a sensitive name), never add to T.
		ev.Obj = netJoin(f.sni, srv.Port())
		ev.Fields = append(ev.Fields, decide.Field{Name: FieldSNI, Role: decide.RoleControl, Value: f.sni})
	} else {
		ev.Obj = netJoin(srv.Addr().Unmap().String(), srv.Port())
	}
	ev.Source = "fetch:" + ev.Obj
	t.opaque(&ev, ErrTLS)
	t.emit(ev)
}

func (t *Tracker) emitOpaque(f *flow, ts time.Time) {
	srv := f.key.server
	d := &decide.Dest{Addr: srv.Addr().Unmap(), Port: srv.Port(), Proto: "tcp"}
	ev := decide.Event{Time: ts, Ch: decide.ChanNet, Dir: decide.In, Op: OpStream, Dest: d,
		Obj: netJoin(srv.Addr().Unmap().String(), srv.Port()), Content: string(f.opq)}
	ev.Source = "fetch:" + ev.Obj
	why := f.opqWhy
	if why == nil {
		why = ErrNotHTTP
	}
	t.opaque(&ev, why)
	f.opqSent = true
	t.emit(ev)
	f.mode = mDone
}

func (t *Tracker) opaque(ev *decide.Event, why error) {
	ev.Opaque = true
	ev.Fields = append(ev.Fields,
		decide.Field{Name: netparse.FieldOpaque, Role: decide.RoleContent},
		decide.Field{Name: netparse.FieldOpaqueReason, Role: decide.RoleControl, Value: why.Error()})
}

func (t *Tracker) emit(ev decide.Event) {
	t.stats.Events++
	if ev.Opaque {
		t.stats.Opaque++
	}
	t.res.Events = append(t.res.Events, ev)
}
