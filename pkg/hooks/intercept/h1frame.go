package intercept

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// h1Effect is one effect framed from the client's decrypted HTTP/1.x
// stream, copied out of the parser's views.
type h1Effect struct {
	ev decide.Event
	// seq, end: the client bytes it covers; open: from seq to the end of
	// the connection (a tunnel, a body with no known end, bytes that are
	// not HTTP).
	seq, end  uint32
	open      bool
	http      bool // an HTTP request (else an opaque stream)
	oversized bool
	tunnel    bool
	method    string
	// continueHead: the head of an Expect: 100-continue request; its
	// body follows as the next effect, which covers the head too.
	continueHead bool
	why          error // for an opaque stream: why it is not HTTP
}

// h1Framer frames the client's decrypted byte stream with netparse's
// request parser (the verdict loop's HTTP/1 framer), fed with synthetic
// TCP segments of a connection between the real client and the original
// destination, so that an intercepted request gives the same event
// fields as the same request in clear.
type h1Framer struct {
	p    *netparse.Parser
	sg   *segmenter
	next uint32 // sequence number of the next client byte
	// headSeq is where a pending 100-continue head starts.
	headSeq  uint32
	headOpen bool
	out      []h1Effect
}

const clientISN = 0

func newH1Framer(sg *segmenter, maxBody int) (*h1Framer, error) {
	p, err := netparse.NewParser(netparse.Config{
		MaxBodyBytes:    maxBody,
		MaxStreamBytes:  2*maxBody + (1 << 20),
		MaxFlows:        1,
		IgnoreChecksums: true,
		// The stream is fed in order and never expired: the timeouts do
		// not apply (Expire is never called).
		PendingTimeout: time.Hour,
		FlowIdle:       24 * time.Hour,
	})
	if err != nil {
		return nil, fmt.Errorf("intercept: request parser: %w", err)
	}
	f := &h1Framer{p: p, sg: sg, next: clientISN + 1}
	res := p.Feed(sg.frame(true, clientISN, 0, tcpSYN, nil)[14:], netparse.Meta{Time: time.Now()})
	if res.Action != netparse.NoData {
		return nil, fmt.Errorf("intercept: request parser refused the stream start: %v", res.Err)
	}
	return f, nil
}

// feed gives the parser the next client bytes (fin: the client closed
// its side after them) and returns the effects they completed, in order.
// The slice is valid until the next call.
func (f *h1Framer) feed(data []byte, fin bool) ([]h1Effect, error) {
	f.out = f.out[:0]
	for first := true; first || len(data) > 0; first = false {
		n := min(len(data), maxSegment)
		flags := uint8(tcpACK | tcpPSH)
		last := n == len(data)
		if fin && last {
			flags |= tcpFIN
		}
		if n == 0 && flags&tcpFIN == 0 {
			break
		}
		res := f.p.Feed(f.sg.frame(true, f.next, 1, flags, data[:n])[14:], netparse.Meta{Time: time.Now()})
		f.next += uint32(n)
		data = data[n:]
		switch res.Action {
		case netparse.Refuse, netparse.Drop:
			return f.out, fmt.Errorf("intercept: request parser: %w", res.Err)
		}
		for i := range res.Effects {
			f.take(&res.Effects[i])
		}
	}
	return f.out, nil
}

func (f *h1Framer) take(e *netparse.Effect) {
	x := h1Effect{seq: e.Seq, end: e.End, open: e.Span != netparse.SpanBytes}
	switch {
	case e.Kind == netparse.KindHTTP && e.HTTP.HeadOnly:
		// Expect: 100-continue. carbd answers 100 itself and decides the
		// request once its body is here: nothing goes upstream before.
		f.headSeq, f.headOpen = e.Seq, true
		x.continueHead, x.http = true, true
		x.method = string(e.HTTP.Method)
		f.out = append(f.out, x)
		return
	case e.Kind == netparse.KindHTTP && e.HTTP.BodyOnly && f.headOpen:
		x.seq = f.headSeq
		f.headOpen = false
		e.HTTP.BodyOnly = false // one event for the whole request, headers included
	}
	x.http = e.Kind == netparse.KindHTTP
	x.method = string(e.HTTP.Method)
	x.oversized = errors.Is(e.Opaque, netparse.ErrOversized)
	x.tunnel = e.HTTP.Tunnel
	if !x.http {
		x.why = e.Opaque
	}
	origin := x.http && len(e.HTTP.Target) > 0 && e.HTTP.Target[0] == '/'
	x.ev = e.Event()
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
