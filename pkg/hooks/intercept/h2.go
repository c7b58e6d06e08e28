package intercept

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
)

// maxObservedBody bounds the response body an HTTP/2 response event
// carries (respwatch's default for HTTP/1.x).
const maxObservedBody = 1 << 20

// hopHeaders are connection-specific fields, never forwarded (RFC 9110
// §7.6.1; HTTP/2 forbids them).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Te", "Trailer"}

// serveH2 serves the client's HTTP/2 connection with net/http's HTTP/2
// server and sends each released stream upstream on one HTTP/2 client
// connection (the implementation golang.org/x/net/http2 now wraps and
// points to): each stream is its own effect, decided before its request
// is sent; a refused stream gets a 403 and the other streams go on.
func (c *conn) serveH2(ctx context.Context) error {
	h2 := new(http.Protocols)
	h2.SetHTTP2(true)
	up := c.up
	tr := &http.Transport{
		Protocols:      h2,
		DialTLSContext: func(context.Context, string, string) (net.Conn, error) { return up, nil },
		HTTP2:          h2Settings(),
	}
	cc, err := tr.NewClientConn(ctx, "https", c.dst.String())
	if err != nil {
		return fmt.Errorf("intercept: upstream http/2: %w", err)
	}
	defer cc.Close()
	var n atomic.Uint32
	serveOne(ctx, c.cliTLS, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.h2Stream(w, r, cc, n.Add(1))
	}))
	return nil
}

// h2Settings are the HTTP/2 settings of both legs, for throughput: the
// largest frame carbd reads is 1 MiB (net/http's client would take 16 KiB
// frames from the world), and what a peer may send ahead is 4 MiB per
// stream and 16 MiB per connection, so that neither a download nor an
// upload waits on window updates, while a connection's buffers stay
// bounded (net/http's client would allow 1 GiB per connection).
func h2Settings() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReadFrameSize:              1 << 20,
		MaxReceiveBufferPerStream:     4 << 20,
		MaxReceiveBufferPerConnection: 16 << 20,
	}
}

// serveOne serves one client connection (its TLS handshake done, "h2"
// agreed) with net/http's server until it ends or ctx does.
func serveOne(ctx context.Context, tc *tls.Conn, h http.Handler) {
	ln := &oneConnListener{conn: tc, done: make(chan struct{})}
	h2 := new(http.Protocols)
	h2.SetHTTP2(true)
	srv := &http.Server{
		Handler:   h,
		Protocols: h2,
		HTTP2:     h2Settings(),
		ErrorLog:  log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	srv.Serve(ln) //nolint:errcheck // it ends when the one connection does
}

// oneConnListener accepts one connection, then waits until closed.
type oneConnListener struct {
	conn net.Conn
	once sync.Once
	done chan struct{}
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if c := l.conn; c != nil {
		l.conn = nil
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConnListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return dummyAddr{} }

type dummyAddr struct{}

func (dummyAddr) Network() string { return "tcp" }
func (dummyAddr) String() string  { return "intercept" }

// h2Event builds the request's event with netparse's HTTP event code from
// an HTTP/2 request, so that its fields are those of HTTP/1.x.
func (c *conn) h2Event(r *http.Request, body []byte, oversized bool) decide.Event {
	e := netparse.Effect{Kind: netparse.KindHTTP, Time: time.Now(), Family: 6, Proto: 6, Src: c.client, Dst: c.dst, Span: netparse.SpanBytes}
	if c.dst.Addr().Unmap().Is4() {
		e.Family = 4
	}
	target := r.RequestURI
	h := &e.HTTP
	h.Method, h.Target, h.Version, h.Host = []byte(r.Method), []byte(target), []byte("HTTP/2"), []byte(r.Host)
	p, q, _ := strings.Cut(target, "?")
	h.Path = []byte(p)
	if strings.Contains(target, "?") {
		h.Query = []byte(q)
	}
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range r.Header[k] {
			h.Headers = append(h.Headers, netparse.Header{Name: []byte(strings.ToLower(k)), Value: []byte(v)})
		}
	}
	h.Body, h.BodyLen = body, int64(len(body))
	if r.ContentLength > 0 {
		h.BodyLen = r.ContentLength
	}
	e.Content = body
	if oversized {
		h.Truncated = true
		e.Opaque = netparse.ErrOversized
	}
	ev := e.Event()
	if strings.HasPrefix(target, "/") {
		httpsURL(&ev)
	}
	return ev
}

func (c *conn) h2Stream(w http.ResponseWriter, r *http.Request, cc *http.ClientConn, n uint32) {
	limit := c.p.cfg.MaxBodyBytes
	body, err := readBody(r, limit)
	if err != nil {
		http.Error(w, "carbd: reading the request body: "+err.Error(), http.StatusBadRequest)
		return
	}
	oversized := len(body) > limit
	req := c.request()
	req.Stream = n
	req.Event = c.h2Event(r, body[:min(len(body), limit)], oversized)
	req.Oversized = oversized
	if r.Method == http.MethodConnect {
		// Extended CONNECT (WebSocket over HTTP/2) is not relayed yet.
		writeRefusal(w, "CONNECT over HTTP/2 is not intercepted")
		return
	}
	var v Verdict
	if why := c.misdirected(eventHost(&req.Event)); why != "" {
		v.Notice = why
		c.refuse(&req, why)
	} else {
		v = c.p.cfg.Decider.Decide(r.Context(), &req)
	}
	if !v.Release {
		writeRefusal(w, v.Notice)
		return
	}
	var rd io.Reader = bytes.NewReader(body)
	if oversized {
		rd = io.MultiReader(bytes.NewReader(body), r.Body)
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, "https://"+r.Host+r.RequestURI, rd)
	if err != nil {
		http.Error(w, "carbd: "+err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	out.Host = r.Host
	out.ContentLength = r.ContentLength
	if len(body) == 0 && !oversized {
		out.Body, out.ContentLength = http.NoBody, 0
	}
	resp, err := cc.RoundTrip(out)
	if err != nil {
		http.Error(w, "carbd: upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vv := range resp.Header {
		w.Header()[k] = vv
	}
	for _, k := range hopHeaders {
		w.Header().Del(k)
	}
	for k := range resp.Trailer {
		w.Header().Add("Trailer", k)
	}
	w.WriteHeader(resp.StatusCode)
	if fl, ok := w.(http.Flusher); ok && resp.ContentLength < 0 && resp.Body != http.NoBody {
		fl.Flush() // a stream: its head goes now, its first bytes may be long in coming
	}
	streamBody(w, resp.Body, resp.ContentLength, func(seen []byte, wire int64, rerr error) {
		c.observeH2(&req, resp, seen, wire, rerr)
	})
	for k, vv := range resp.Trailer {
		w.Header()[http.TrailerPrefix+k] = vv
	}
}

// relayBufSize is the buffer a response body is copied through: large,
// so that a download takes few reads and writes; pooled, so that a small
// response on a kept-alive connection allocates none.
const relayBufSize = 64 << 10

// preallocBody bounds the buffer readBody allocates for a declared length.
const preallocBody = 1 << 20

var relayBufs = sync.Pool{New: func() any { b := make([]byte, relayBufSize); return &b }}

// readBody reads a request body whole, up to limit+1 bytes (one more
// says it is oversized), as io.ReadAll would, but allocates nothing for a
// stream that ended with its headers and once for a declared length up
// to preallocBody (a longer one grows as its bytes arrive: a declared
// length costs no memory before the bytes are sent).
func readBody(r *http.Request, limit int) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	lr := io.LimitReader(r.Body, int64(limit)+1)
	size := 512
	if r.ContentLength >= 0 {
		size = int(min(r.ContentLength, int64(limit), preallocBody)) + 1
	}
	b := make([]byte, 0, size)
	for {
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// streamBody copies a response body to the client as it arrives
// (through a pooled relayBufSize buffer, flushed whenever a read found
// nothing more waiting), and keeps its first maxObservedBody bytes. done is
// called once the body's end is known: when its length was declared,
// before its last bytes are written (the response is observed before
// the client holds all of it); otherwise (a stream) at its end.
func streamBody(w http.ResponseWriter, body io.Reader, length int64, done func(seen []byte, n int64, err error)) {
	fl, _ := w.(http.Flusher)
	var seen []byte
	var n int64
	called := false
	finish := func(err error) {
		if !called {
			called = true
			done(seen, n, err)
		}
	}
	bp := relayBufs.Get().(*[]byte)
	defer relayBufs.Put(bp)
	buf := *bp
	for {
		k, rerr := body.Read(buf)
		if k > 0 {
			if len(seen) < maxObservedBody {
				if seen == nil && length >= 0 {
					seen = make([]byte, 0, min(length, maxObservedBody))
				}
				seen = append(seen, buf[:min(k, maxObservedBody-len(seen))]...)
			}
			n += int64(k)
			if length >= 0 && n >= length {
				finish(nil)
			}
			if _, werr := w.Write(buf[:k]); werr != nil {
				finish(werr)
				return
			}
			// Flush when the read did not fill the buffer: nothing more
			// was waiting, so what was read must not wait for more (a
			// stream's events). A full read is followed by another at
			// once; the last bytes go with the end of the stream.
			if fl != nil && k < len(buf) && (length < 0 || n < length) {
				fl.Flush()
			}
		}
		if rerr == io.EOF {
			finish(nil)
			return
		}
		if rerr != nil {
			finish(rerr)
			return
		}
	}
}

// observeH2 reports an HTTP/2 response with the operation and fields
// respwatch gives an HTTP/1.x response.
func (c *conn) observeH2(req *Request, resp *http.Response, body []byte, wire int64, rerr error) {
	if c.p.cfg.Observe == nil {
		return
	}
	ev := decide.Event{Time: time.Now(), Ch: decide.ChanNet, Dir: decide.In, Op: respwatch.OpResponse,
		Dest: &decide.Dest{Addr: c.dst.Addr().Unmap(), Port: c.dst.Port(), Proto: "tcp"}}
	if req.Event.Dest != nil {
		ev.Dest.Host = req.Event.Dest.Host
	}
	ev.Obj = req.Event.Obj
	src := strings.TrimPrefix(ev.Obj, "https://")
	if i := strings.IndexByte(src, '?'); i >= 0 {
		src = src[:i]
	}
	ev.Source = "fetch:" + src
	add := func(name, v string) {
		ev.Fields = append(ev.Fields, decide.Field{Name: name, Role: decide.RoleControl, Value: v})
	}
	add(respwatch.FieldMethod, req.Event.Op[len("http:"):])
	add(respwatch.FieldStatus, strconv.Itoa(resp.StatusCode))
	if v := resp.Header.Get("Content-Type"); v != "" {
		add(respwatch.FieldContentType, v)
	}
	enc := resp.Header.Get("Content-Encoding")
	if enc != "" {
		add(respwatch.FieldEncoding, enc)
	}
	add(respwatch.FieldBodyLen, strconv.FormatInt(wire, 10))
	ev.Content = string(body)
	var why error
	switch {
	case rerr != nil:
		add(respwatch.FieldIncomplete, "true")
		why = fmt.Errorf("intercept: response cut short: %w", rerr)
	case wire > int64(len(body)):
		why = respwatch.ErrBodyTooBig
	case enc != "" && !strings.EqualFold(enc, "identity"):
		why = errors.New("intercept: http/2 response bodies are not decoded")
	}
	if why != nil {
		ev.Opaque = true
		ev.Fields = append(ev.Fields,
			decide.Field{Name: netparse.FieldOpaque, Role: decide.RoleContent},
			decide.Field{Name: netparse.FieldOpaqueReason, Role: decide.RoleControl, Value: why.Error()})
	}
	c.p.cfg.Observe(req, ev)
}

func writeRefusal(w http.ResponseWriter, notice string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Carbd-Verdict", "refuse")
	body := refusalBody(notice)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusForbidden)
	io.WriteString(w, body) //nolint:errcheck // the client may be gone
}

// refuseAll answers the client when upstream could not be reached or
// verified: every request gets a 403 saying why, nothing goes upstream.
func (c *conn) refuseAll(ctx context.Context) {
	notice := c.upErr.Error()
	req := c.request()
	c.refuse(&req, notice)
	if c.cliTLS.ConnectionState().NegotiatedProtocol == ProtoH2 {
		serveOne(ctx, c.cliTLS, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeRefusal(w, notice) }))
		return
	}
	// HTTP/1.x: wait for the request head (so the 403 answers it), then
	// answer and close.
	fr, err := newH1Framer(c.client, c.dst, 64<<10)
	if err != nil {
		return
	}
	buf := make([]byte, 16<<10)
	for {
		n, err := c.cliTLS.Read(buf)
		effs, ferr := fr.feed(buf[:n], err != nil)
		if len(effs) > 0 || err != nil || ferr != nil {
			break
		}
	}
	c.cliTLS.Write(http1Refusal(notice, true)) //nolint:errcheck // closing anyway
}
