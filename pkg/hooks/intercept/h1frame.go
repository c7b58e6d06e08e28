package intercept

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
)

// h1Effect is one effect framed from the client's decrypted HTTP/1.x
// stream, copied out of the framer's views.
type h1Effect struct {
	ev decide.Event
	// start, end: the client stream bytes [start, end) it covers (stream
	// offsets); open: from start to the end of the connection (a tunnel,
	// a body with no known end, bytes that are not HTTP/1.x).
	start, end int64
	open       bool
	http       bool // an HTTP request (else an opaque stream)
	oversized  bool
	tunnel     bool
	// continueHead: the head of an Expect: 100-continue request; its
	// body follows as the next effect, which then covers the head too.
	continueHead bool
	// req is what the response tracker pairs the response with.
	req respwatch.Request
}

// h1Framer frames the client's decrypted byte stream with netparse's
// RequestStream: the verdict loop's HTTP/1.x framer on a byte stream, so
// that an intercepted request gives the same event fields and the same
// byte ranges as the same request in clear.
type h1Framer struct {
	rs          *netparse.RequestStream
	client, dst netip.AddrPort
	// headStart is where a pending 100-continue head starts.
	headStart int64
	headOpen  bool
	out       []h1Effect
}

func newH1Framer(client, dst netip.AddrPort, maxBody int) (*h1Framer, error) {
	rs, err := netparse.NewRequestStream(netparse.Config{MaxBodyBytes: maxBody})
	if err != nil {
		return nil, fmt.Errorf("intercept: request framer: %w", err)
	}
	return &h1Framer{rs: rs, client: client, dst: dst}, nil
}

// feed gives the framer the next client bytes (fin: the client closed
// its side after them) and returns the effects they completed, in order.
// The slice is valid until the next call.
func (f *h1Framer) feed(data []byte, fin bool) ([]h1Effect, error) {
	f.out = f.out[:0]
	for {
		n, err := f.rs.Write(data)
		data = data[n:]
		f.drain()
		if err == nil {
			break
		}
		if !errors.Is(err, netparse.ErrStreamBuffer) {
			return f.out, fmt.Errorf("intercept: request framer: %w", err)
		}
		if n == 0 && len(f.out) == 0 {
			return f.out, fmt.Errorf("intercept: request framer: %w", err)
		}
	}
	if fin {
		f.rs.Close()
		f.drain()
	}
	return f.out, nil
}

func (f *h1Framer) drain() {
	for {
		r := f.rs.Next()
		if r == nil {
			return
		}
		f.take(r)
	}
}

func (f *h1Framer) take(r *netparse.StreamRequest) {
	e := &r.Effect
	e.Time, e.Src, e.Dst, e.Proto = time.Now(), f.client, f.dst, 6
	e.Family = 6
	if f.dst.Addr().Unmap().Is4() {
		e.Family = 4
	}
	x := h1Effect{start: r.Start, end: r.End, open: r.End < 0}
	switch {
	case e.Kind == netparse.KindHTTP && e.HTTP.HeadOnly:
		// Expect: 100-continue. carbd answers 100 itself and decides the
		// request once its body is here: nothing goes upstream before.
		f.headStart, f.headOpen = r.Start, true
		x.continueHead, x.http = true, true
		f.out = append(f.out, x)
		return
	case e.Kind == netparse.KindHTTP && e.HTTP.BodyOnly && f.headOpen:
		x.start = f.headStart
		f.headOpen = false
		e.HTTP.BodyOnly = false // one event for the whole request, headers included
	}
	x.http = e.Kind == netparse.KindHTTP
	x.oversized = errors.Is(e.Opaque, netparse.ErrOversized)
	x.tunnel = e.HTTP.Tunnel
	origin := x.http && len(e.HTTP.Target) > 0 && e.HTTP.Target[0] == '/'
	x.ev = e.Event()
	x.req, _ = respwatch.RequestOf(e)
	if origin {
		httpsURL(&x.ev)
	}
	f.out = append(f.out, x)
}

// httpsURL rewrites the URL netparse built for an origin-form target
// ("http://host/path"): the request came over TLS.
func httpsURL(ev *decide.Event) {
	if s, ok := strings.CutPrefix(ev.Obj, "http://"); ok {
		ev.Obj = "https://" + s
	}
	for i := range ev.Fields {
		if ev.Fields[i].Name == netparse.FieldURL {
			if s, ok := strings.CutPrefix(ev.Fields[i].Value, "http://"); ok {
				ev.Fields[i].Value = "https://" + s
			}
		}
	}
}
