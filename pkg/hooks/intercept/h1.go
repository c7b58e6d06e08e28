package intercept

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
)

const readBufSize = 64 << 10

// h1Conn is the HTTP/1.x side of one intercepted connection: one
// goroutine reads the client's requests, decides them in order and
// relays each released request's response before taking the next
// (pipelined requests wait in the client's stream; the 403 of a refused
// one therefore comes in its place).
type h1Conn struct {
	c   *conn
	fr  *h1Framer
	rw  *respTap
	buf []byte
	// pend holds client bytes not yet forwarded or discarded; pendAt is
	// the stream offset of pend[0].
	pend   []byte
	pendAt int64
	queue  []h1Effect
	eof    bool
	// served counts the responses the current upstream connection
	// carried; sent keeps the bytes of the request in flight (up to
	// maxRetryBytes; keep says they are all there) so that it can be
	// sent again on a new connection when the server closed the kept
	// alive one before answering; upDead, upErr: a write upstream failed.
	served int
	sent   []byte
	keep   bool
	upDead bool
	upErr  error
}

// maxRetryBytes bounds the request kept for a retry on a new connection.
const maxRetryBytes = 1 << 20

func (c *conn) serveH1(ctx context.Context) error {
	fr, err := newH1Framer(c.client, c.dst, c.p.cfg.MaxBodyBytes)
	if err != nil {
		return err
	}
	rw, err := newRespTap(newSegmenter(c.client, c.dst))
	if err != nil {
		return err
	}
	h := &h1Conn{c: c, fr: fr, rw: rw, buf: make([]byte, readBufSize)}
	for {
		for len(h.queue) == 0 {
			if h.eof {
				return nil
			}
			if err := h.readMore(); err != nil {
				return err
			}
		}
		e := h.queue[0]
		h.queue = h.queue[1:]
		if e.continueHead {
			if _, err := c.cliTLS.Write([]byte("HTTP/1.1 100 Continue\r\n\r\n")); err != nil {
				return fmt.Errorf("intercept: write to client: %w", err)
			}
			continue
		}
		req := c.request()
		req.Event, req.Oversized, req.Open = e.ev, e.oversized, e.open
		var v Verdict
		if why := c.misdirected(eventHost(&req.Event)); why != "" {
			v.Notice = why
			c.refuse(&req, why)
		} else {
			v = c.p.cfg.Decider.Decide(ctx, &req)
		}
		if e.open {
			if !v.Release {
				c.cliTLS.Write(http1Refusal(v.Notice, true)) //nolint:errcheck // closing anyway
				return nil
			}
			if isWebSocketUpgrade(&req.Event) {
				return h.websocket(ctx, e.start, &req)
			}
			return h.tunnel(e.start)
		}
		if !v.Release {
			if err := h.consume(e.start, e.end, nil); err != nil {
				return err
			}
			if _, err := c.cliTLS.Write(http1Refusal(v.Notice, false)); err != nil {
				return fmt.Errorf("intercept: write to client: %w", err)
			}
			continue
		}
		h.sent, h.keep = h.sent[:0], h.served > 0 && idempotent(req.Event.Op)
		h.rw.pair(e.req)
		if err := h.consume(e.start, e.end, h.forward); err != nil {
			return err
		}
		more, err := h.relayResponse(ctx, &req)
		if err != nil || !more {
			return err
		}
		h.served++
	}
}

// readMore reads the client's next bytes and frames them.
func (h *h1Conn) readMore() error {
	n, err := h.c.cliTLS.Read(h.buf)
	if n > 0 {
		h.pend = append(h.pend, h.buf[:n]...)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("intercept: read from client: %w", err)
	}
	h.eof = err != nil
	effs, ferr := h.fr.feed(h.buf[:n], h.eof)
	h.queue = append(h.queue, effs...)
	if ferr != nil {
		return ferr
	}
	return nil
}

// consume takes the client bytes [start, end) out of pend, reading more
// when they have not all arrived, and hands them to use (nil: they are
// discarded). Bytes before start belong to no effect: dropped.
func (h *h1Conn) consume(start, end int64, use func([]byte) error) error {
	if d := start - h.pendAt; d > 0 {
		h.trim(int(min(d, int64(len(h.pend)))))
	}
	for end > h.pendAt {
		if len(h.pend) == 0 {
			if h.eof {
				return fmt.Errorf("intercept: client closed inside a request")
			}
			if err := h.readMore(); err != nil {
				return err
			}
			continue
		}
		k := int(min(end-h.pendAt, int64(len(h.pend))))
		if use != nil {
			if err := use(h.pend[:k]); err != nil {
				return err
			}
		}
		h.trim(k)
	}
	return nil
}

func (h *h1Conn) trim(k int) {
	n := copy(h.pend, h.pend[k:])
	h.pend = h.pend[:n]
	h.pendAt += int64(k)
}

// forward writes released client bytes upstream. (The response tap is
// given the request as the framer parsed it, respTap's Pair: it does not
// parse the bytes again.)
func (h *h1Conn) forward(b []byte) error {
	if h.keep {
		if len(h.sent)+len(b) > maxRetryBytes {
			h.keep = false
		} else {
			h.sent = append(h.sent, b...)
		}
	}
	if !h.upDead {
		if _, err := h.c.up.Write(b); err != nil {
			if !h.keep {
				return fmt.Errorf("intercept: write upstream: %w", err)
			}
			h.upDead, h.upErr = true, err // sent again on a new connection
		}
	}
	return nil
}

// idempotent reports whether a request may be sent again (RFC 9110
// §9.2.2) after its connection closed before any answer.
func idempotent(op string) bool {
	switch op {
	case "http:GET", "http:HEAD", "http:OPTIONS", "http:TRACE", "http:PUT", "http:DELETE":
		return true
	}
	return false
}

// redial replaces an upstream connection the server closed while it was
// idle and sends the request in flight again: the same released bytes,
// to the same server, verified again.
func (h *h1Conn) redial(ctx context.Context) error {
	c := h.c
	c.up.Close()
	c.up = nil
	name := c.sni
	if name == "" {
		name = c.dst.Addr().Unmap().String()
	}
	hctx, cancel := context.WithTimeout(ctx, c.p.cfg.HandshakeTimeout)
	defer cancel()
	c.dialUpstream(hctx, name)
	if c.upErr != nil {
		return c.upErr
	}
	if p := c.up.ConnectionState().NegotiatedProtocol; p == ProtoH2 {
		return fmt.Errorf("intercept: upstream %s now speaks %s", c.dst, p)
	}
	h.served, h.upDead, h.upErr = 0, false, nil
	if _, err := c.up.Write(h.sent); err != nil {
		return fmt.Errorf("intercept: write upstream: %w", err)
	}
	return nil
}

// relayResponse streams upstream bytes to the client until the tap has
// seen the whole response to the request just forwarded (1xx interim
// responses pass through). It reports whether the connection goes on.
// After pipeAfterReads reads, the rest of a response is relayed through
// a clientPipe: reading and decrypting the world's next bytes overlaps
// encrypting and writing the previous ones. Each read is shown to the
// tap (and so observed) before it is handed to the client.
func (h *h1Conn) relayResponse(ctx context.Context, req *Request) (bool, error) {
	c := h.c
	want := h.rw.responses + 1
	desyncs := h.rw.t.Stats().Desyncs
	got := false
	reads := 0
	var pipe *clientPipe
	// toClient writes b (h.buf or a pooled chunk) to the client, through
	// the pipe once there is one.
	toClient := func(b []byte) error {
		if pipe == nil {
			if _, err := c.cliTLS.Write(b); err != nil {
				return fmt.Errorf("intercept: write to client: %w", err)
			}
			return nil
		}
		return pipe.send(b)
	}
	end := func(err error) error {
		if pipe != nil {
			if perr := pipe.close(); err == nil {
				err = perr
			}
		}
		return err
	}
	for h.rw.responses < want {
		buf := h.buf
		if pipe != nil {
			buf = getChunk()
		}
		var n int
		err := h.upErr
		if !h.upDead {
			n, err = c.up.Read(buf)
		}
		if err != nil && n == 0 && !got && h.keep {
			// The server closed the kept-alive connection before it
			// answered (an idle timeout): once, on a new connection.
			h.keep = false
			if rerr := h.redial(ctx); rerr != nil {
				return false, rerr
			}
			continue
		}
		got = got || n > 0
		if n > 0 {
			// Observe first: a response is reported before the client
			// holds all of it, so a request it prompts is decided after.
			h.rw.ingress(buf[:n], false, c.observer(req))
			if werr := toClient(buf[:n]); werr != nil {
				return false, end(werr)
			}
		} else if pipe != nil {
			putChunk(buf)
		}
		if err != nil {
			h.rw.ingress(nil, true, c.observer(req))
			if errors.Is(err, io.EOF) {
				return false, end(nil) // the server closed: so does carbd
			}
			return false, end(fmt.Errorf("intercept: read upstream: %w", err))
		}
		if h.rw.t.Stats().Desyncs != desyncs {
			// The response cannot be framed: relay it until the server
			// closes, take no further request on this connection.
			if err := end(nil); err != nil {
				return false, err
			}
			_, err := io.Copy(c.cliTLS, c.up)
			return false, err
		}
		if n > 0 {
			reads++
		}
		if pipe == nil && reads >= pipeAfterReads && h.rw.responses < want {
			pipe = startClientPipe(c.cliTLS)
		}
	}
	return true, end(nil)
}

// chunkSize is a relayed read's buffer: a TLS record's plaintext is at
// most 16 KiB, and crypto/tls returns one record per Read.
const chunkSize = 16 << 10

// pipeAfterReads is how many reads of a response are relayed in turn
// before the rest goes through a clientPipe: a small or middling response
// costs no goroutine, a download overlaps its reads and writes.
const pipeAfterReads = 4

// pipeDepth is how many chunks a clientPipe holds: reading runs at most
// this far ahead of the client.
const pipeDepth = 8

var chunks = sync.Pool{New: func() any { return new([chunkSize]byte) }}

func getChunk() []byte { return chunks.Get().(*[chunkSize]byte)[:] }

func putChunk(b []byte) {
	if cap(b) == chunkSize {
		chunks.Put((*[chunkSize]byte)(b[:chunkSize]))
	}
}

// clientPipe writes chunks to the client on a goroutine of its own.
type clientPipe struct {
	ch     chan []byte
	failed chan struct{} // closed when a write failed
	done   chan struct{} // closed when the writer has ended
	err    error         // the failed write's error; read after failed or done
}

func startClientPipe(w io.Writer) *clientPipe {
	p := &clientPipe{ch: make(chan []byte, pipeDepth), failed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for b := range p.ch {
			if p.err == nil {
				if _, err := w.Write(b); err != nil {
					p.err = fmt.Errorf("intercept: write to client: %w", err)
					close(p.failed)
				}
			}
			putChunk(b)
		}
	}()
	return p
}

// send hands b (a pooled chunk, which the pipe returns) to the writer.
func (p *clientPipe) send(b []byte) error {
	select {
	case p.ch <- b:
		return nil
	case <-p.failed:
		putChunk(b)
		return p.err
	}
}

// close waits until every chunk sent is written; it returns the first
// write error.
func (p *clientPipe) close() error {
	close(p.ch)
	<-p.done
	return p.err
}

// tunnel relays the rest of the connection both ways as it is, from the
// client stream offset start on (a released open effect).
func (h *h1Conn) tunnel(start int64) error {
	c := h.c
	if err := h.consume(start, h.pendAt+int64(len(h.pend)), h.forward); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(c.up, c.cliTLS)
		c.up.CloseWrite() //nolint:errcheck // best effort
		done <- err
	}()
	_, err := io.Copy(c.cliTLS, c.up)
	c.cliTLS.Close()
	if err2 := <-done; err == nil {
		err = err2
	}
	return err
}

// respTap feeds the decrypted exchange of one connection to respwatch's
// tracker, which frames the responses (streaming: it keeps only what the
// event needs) and builds the provenance events. The requests are not
// fed: the tracker is given each released request as h1Framer parsed it
// (Tracker.Pair, before its bytes go upstream), so the client's stream
// is framed once, by one parser.
type respTap struct {
	t         *respwatch.Tracker
	sg        *segmenter
	sseq      uint32
	responses int
}

func newRespTap(sg *segmenter) (*respTap, error) {
	t, err := respwatch.NewTracker(respwatch.Config{MaxFlows: 1, PendingTimeout: time.Hour, FlowIdle: 24 * time.Hour})
	if err != nil {
		return nil, fmt.Errorf("intercept: response tracker: %w", err)
	}
	r := &respTap{t: t, sg: sg, sseq: 1}
	now := time.Now()
	t.Feed(now, sg.frame(true, 0, 0, tcpSYN, nil), capture.Egress)
	t.Feed(now, sg.frame(false, 0, 1, tcpSYN|tcpACK, nil), capture.Ingress)
	return r, nil
}

// pair tells the tracker the request about to be forwarded: the next
// response answers it.
func (r *respTap) pair(q respwatch.Request) {
	r.t.Pair(r.sg.client, r.sg.server, q)
}

// ingress shows the tracker the server's next bytes b (fin: the server
// closed after them) as one segment without a frame (FeedServer): no
// copy of b is made, so the body bytes past what the event keeps are
// framed by the response's length or chunks and counted, nothing more.
func (r *respTap) ingress(b []byte, fin bool, emit func(ev *respwatch.Result)) {
	if len(b) == 0 && !fin {
		return
	}
	res := r.t.FeedServer(time.Now(), r.sg.client, r.sg.server, r.sseq, b, fin)
	r.sseq += uint32(len(b))
	for _, ev := range res.Events {
		if ev.Op == respwatch.OpResponse {
			r.responses++
		}
	}
	emit(res)
}

// observer returns the function that hands a tracker result's events to
// Config.Observe.
func (c *conn) observer(req *Request) func(*respwatch.Result) {
	return func(res *respwatch.Result) {
		if c.p.cfg.Observe == nil {
			return
		}
		for _, ev := range res.Events {
			httpsURL(&ev)
			c.p.cfg.Observe(req, ev)
		}
	}
}

func eventHost(ev *decide.Event) string {
	if ev.Dest == nil {
		return ""
	}
	return ev.Dest.Host
}
