package respwatch

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// Config bounds the watcher's memory and says how long it waits. The
// zero value of a field selects its default; negative values are
// invalid.
type Config struct {
	// MaxHeaderBytes bounds a response head (status line and header
	// fields) and a chunked body's trailer section. A longer head makes
	// the rest of the connection opaque. Default 64 KiB.
	MaxHeaderBytes int
	// MaxBodyBytes bounds Event.Content: the decoded body. A longer body
	// is reported with its first MaxBodyBytes and flagged opaque
	// (ErrBodyTooBig); its end is still framed, so the next response on
	// the connection is parsed. Default 1 MiB.
	MaxBodyBytes int
	// MaxWireBytes bounds the encoded (gzip, deflate) body kept for
	// decoding. Default 1 MiB.
	MaxWireBytes int
	// MaxOpaqueBytes bounds the content kept from a stream carbd does not
	// parse (its first bytes). Default 4 KiB.
	MaxOpaqueBytes int
	// MaxFlows bounds the TCP connections tracked; beyond it the least
	// recently active one is ended (its response in progress reported as
	// it is). Default 4096.
	MaxFlows int
	// MaxFlowBuffer bounds the out-of-order bytes one connection keeps
	// while it waits for a missing segment; segments beyond it are not
	// kept (their bytes count as lost once the guest acknowledges them).
	// Default 1 MiB.
	MaxFlowBuffer int
	// MaxBufferBytes bounds every buffer together: heads, bodies and
	// out-of-order segments of all connections. A response that does not
	// fit is reported with what it had (ErrMemory). Default 64 MiB.
	MaxBufferBytes int
	// MaxPending bounds the requests of one connection waiting for their
	// responses (pipelining); past it, responses on that connection are
	// no longer paired with their requests. Default 64.
	MaxPending int
	// PendingTimeout: a response that has received nothing new for this
	// long is reported with what it has (ErrPartial); the rest of it is
	// framed but not inspected. Default 2 s.
	PendingTimeout time.Duration
	// FlowIdle is how long a connection with no packets is kept.
	// Default 5 min.
	FlowIdle time.Duration
	// QueueLen bounds the frames waiting for the Watcher's goroutine;
	// a frame that finds the queue full is dropped and counted (the
	// capture never blocks). Default 8192.
	QueueLen int
	// HeaderValues names the response header fields whose values are
	// reported in an "http:response-headers" event (nil: Location,
	// Content-Location, Refresh, Set-Cookie; empty non-nil: none). These
	// are values a client acts on without reading the body: a redirect
	// target, a cookie it sends back.
	HeaderValues []string
	// Resolved reports whether the guest's resolver answered host with
	// addr. The Host header is the guest's claim: when Resolved says no,
	// the event names the server by address only (Dest.Host empty, Obj
	// and Source with the address), so a request to an untrusted address
	// with a trusted name in its Host header cannot make the answer
	// trusted. nil: the Host header is believed. An IP-literal host equal
	// to the server's address is always believed.
	Resolved func(host string, addr netip.Addr) bool
	// Requests configures the parser of the guest's requests (the same
	// parser the verdict loop uses, so a response's Obj is its request's
	// Obj); it has its own memory bound, MaxStreamBytes. Zero fields take
	// netparse's defaults, except MaxBodyBytes (64 KiB here: only the
	// request's framing matters), MaxStreamBytes (16 MiB), MaxFlows
	// (this Config's MaxFlows) and IgnoreChecksums (always set: captured
	// frames may carry offloaded, unfinished checksums).
	Requests netparse.Config
}

// DefaultHeaderValues are the header fields reported when
// Config.HeaderValues is nil.
var DefaultHeaderValues = []string{"Location", "Content-Location", "Refresh", "Set-Cookie"}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		MaxHeaderBytes: 64 << 10,
		MaxBodyBytes:   1 << 20,
		MaxWireBytes:   1 << 20,
		MaxOpaqueBytes: 4 << 10,
		MaxFlows:       4096,
		MaxFlowBuffer:  1 << 20,
		MaxBufferBytes: 64 << 20,
		MaxPending:     64,
		PendingTimeout: 2 * time.Second,
		FlowIdle:       5 * time.Minute,
		QueueLen:       8192,
	}
}

// withDefaults fills zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"MaxHeaderBytes", &c.MaxHeaderBytes, d.MaxHeaderBytes},
		{"MaxBodyBytes", &c.MaxBodyBytes, d.MaxBodyBytes},
		{"MaxWireBytes", &c.MaxWireBytes, d.MaxWireBytes},
		{"MaxOpaqueBytes", &c.MaxOpaqueBytes, d.MaxOpaqueBytes},
		{"MaxFlows", &c.MaxFlows, d.MaxFlows},
		{"MaxFlowBuffer", &c.MaxFlowBuffer, d.MaxFlowBuffer},
		{"MaxBufferBytes", &c.MaxBufferBytes, d.MaxBufferBytes},
		{"MaxPending", &c.MaxPending, d.MaxPending},
		{"QueueLen", &c.QueueLen, d.QueueLen},
	}
	for _, f := range ints {
		if *f.v < 0 {
			return c, fmt.Errorf("respwatch: config %s is negative (%d)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"PendingTimeout", &c.PendingTimeout, d.PendingTimeout},
		{"FlowIdle", &c.FlowIdle, d.FlowIdle},
	}
	for _, f := range durs {
		if *f.v < 0 {
			return c, fmt.Errorf("respwatch: config %s is negative (%s)", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.MaxHeaderBytes < 1024 {
		return c, fmt.Errorf("respwatch: config MaxHeaderBytes %d is below 1024", c.MaxHeaderBytes)
	}
	if c.MaxBodyBytes > 1<<30 || c.MaxWireBytes > 1<<30 || c.MaxHeaderBytes > 1<<24 {
		return c, fmt.Errorf("respwatch: config MaxHeaderBytes/MaxBodyBytes/MaxWireBytes too large (%d/%d/%d)",
			c.MaxHeaderBytes, c.MaxBodyBytes, c.MaxWireBytes)
	}
	if c.HeaderValues == nil {
		c.HeaderValues = DefaultHeaderValues
	}
	hv := make([]string, 0, len(c.HeaderValues))
	for i, h := range c.HeaderValues {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" || strings.ContainsAny(h, ": \t\r\n") {
			return c, fmt.Errorf("respwatch: config HeaderValues[%d] %q is not a header name", i, c.HeaderValues[i])
		}
		hv = append(hv, h)
	}
	c.HeaderValues = hv
	if c.Requests.MaxBodyBytes == 0 {
		c.Requests.MaxBodyBytes = 64 << 10
	}
	if c.Requests.MaxStreamBytes == 0 {
		c.Requests.MaxStreamBytes = 16 << 20
	}
	if c.Requests.MaxFlows == 0 {
		c.Requests.MaxFlows = c.MaxFlows
	}
	c.Requests.IgnoreChecksums = true
	return c, nil
}
