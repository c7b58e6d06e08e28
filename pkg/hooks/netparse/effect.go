package netparse

import (
	"bytes"
	"errors"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// Why an effect's content is not (fully) visible. Effect.Opaque holds one
// of these or a parse error.
var (
	ErrOpaqueTLS      = errors.New("netparse: tls: the content is encrypted")
	ErrOpaqueQUIC     = errors.New("netparse: quic: the content is encrypted")
	ErrOpaqueProto    = errors.New("netparse: not a protocol carbd parses")
	ErrOpaqueTunnel   = errors.New("netparse: the connection becomes a tunnel or another protocol")
	ErrOversized      = errors.New("netparse: request larger than the parser's limits")
	ErrNoSYN          = errors.New("netparse: stream start not seen")
	ErrPendingTimeout = errors.New("netparse: request incomplete when its wait ran out")
	ErrStreamEnded    = errors.New("netparse: stream ended inside a request")
)

// Kind says what an effect is.
type Kind uint8

const (
	KindHTTP      Kind = iota + 1 // an HTTP/1.x request (or its head, or its body)
	KindTLS                       // a TLS ClientHello; the rest of the connection is opaque
	KindDNS                       // a DNS query over UDP or TCP
	KindQUIC                      // a QUIC Initial; the rest of the connection is opaque
	KindICMPEcho                  // an ICMP or ICMPv6 echo request or reply
	KindICMPOther                 // another ICMP or ICMPv6 message
	KindUDP                       // another UDP datagram
	KindTCPOpaque                 // TCP bytes carbd does not parse
	KindIPOpaque                  // a packet of another IP protocol
)

var kindOps = [...]string{
	KindTLS: "tls:clienthello", KindDNS: "dns:query", KindQUIC: "quic:initial",
	KindICMPEcho: "icmp:echo", KindICMPOther: "icmp:other", KindUDP: "udp:datagram",
	KindTCPOpaque: "tcp:opaque", KindIPOpaque: "ip:opaque",
}

// Span says which TCP bytes an effect covers.
type Span uint8

const (
	SpanNone  Span = iota // not a TCP stream effect: the packet (or datagram) itself
	SpanBytes             // the sequence range [Seq, End)
	SpanOpen              // from Seq to the end of the connection
	SpanFlow              // the whole connection (its start was not seen)
)

func (s Span) String() string {
	switch s {
	case SpanNone:
		return "packet"
	case SpanBytes:
		return "bytes"
	case SpanOpen:
		return "open"
	case SpanFlow:
		return "flow"
	}
	return "span(" + strconv.Itoa(int(s)) + ")"
}

// Effect is one effect parsed from the guest's egress. Its slices are
// views, valid until the next call to the parser's Feed or Expire; Event
// copies them.
type Effect struct {
	Kind   Kind
	Time   time.Time
	Family uint8
	Proto  uint8
	Src    netip.AddrPort
	Dst    netip.AddrPort
	// Span, Seq and End say which client-to-server TCP bytes the effect
	// covers; the verdict releases exactly those.
	Span     Span
	Seq, End uint32
	HTTP     HTTPRequest
	TLS      ClientHello
	DNS      DNSQuery
	QUIC     QUICInitial
	ICMPType uint8
	ICMPCode uint8
	ICMPID   uint16
	ICMPSeq  uint16
	// Content is what the effect carries: the HTTP body, the datagram or
	// echo payload, the first bytes of an opaque stream.
	Content []byte
	// Opaque is non-nil when carbd cannot see all the effect carries: the
	// engine must treat it as possibly carrying every sensitive value.
	Opaque error
	body   []byte
}

func (e *Effect) reset() {
	h, t := e.HTTP.Headers[:0], e.HTTP.Trailers[:0]
	alpn, qalpn := e.TLS.ALPN[:0], e.QUIC.Hello.ALPN[:0]
	qs, names := e.DNS.Questions[:0], e.DNS.names[:0]
	body := e.body[:0]
	*e = Effect{body: body}
	e.HTTP.Headers, e.HTTP.Trailers = h, t
	e.TLS.ALPN, e.QUIC.Hello.ALPN = alpn, qalpn
	e.DNS.Questions, e.DNS.names = qs, names
}

// Op is the effect's operation as carbd's policy names it: "http:POST",
// "tls:clienthello", "dns:query", "quic:initial", "icmp:echo",
// "icmp:other", "udp:datagram", "tcp:opaque", "ip:opaque".
func (e *Effect) Op() string {
	if e.Kind == KindHTTP {
		return "http:" + string(e.HTTP.Method)
	}
	if int(e.Kind) < len(kindOps) {
		return kindOps[e.Kind]
	}
	return "net:unknown"
}

// Field names of net events.
const (
	FieldHost         = "host"          // target: HTTP host (no port)
	FieldURL          = "url"           // target: the request URL
	FieldUserInfo     = "url.userinfo"  // credential: user:password of an absolute URL
	FieldMethod       = "method"        // control
	FieldQuery        = "query"         // selector: the raw query string
	FieldQueryPrefix  = "query."        // selector, or credential for key/token/secret-like names: one per parameter, decoded
	FieldHeaderPrefix = "header."       // credential for Authorization, Cookie, API keys, tokens; control otherwise
	FieldTrailPrefix  = "trailer."      // like headers
	FieldBody         = "body"          // content
	FieldPart         = "part"          // control: "head" or "body" when a request is split
	FieldSNI          = "sni"           // target
	FieldALPN         = "alpn"          // control: comma-separated
	FieldTLSVersion   = "tls.version"   // control
	FieldECH          = "tls.ech"       // control: "true" when the real SNI is encrypted
	FieldQUICVersion  = "quic.version"  // control
	FieldQName        = "qname"         // target: one per question
	FieldQType        = "qtype"         // control
	FieldQClass       = "qclass"        // control
	FieldDNSExtra     = "dns.extra"     // content: bytes after the questions
	FieldICMPType     = "icmp.type"     // control
	FieldICMPCode     = "icmp.code"     // control
	FieldICMPID       = "icmp.id"       // control
	FieldICMPSeq      = "icmp.seq"      // control
	FieldPayload      = "payload"       // content
	FieldOpaque       = "opaque"        // content, empty value: present when the content is not visible
	FieldOpaqueReason = "opaque.reason" // control: why
)

// IsOpaque reports whether an event says its content is not visible.
func IsOpaque(ev *decide.Event) bool {
	if ev.Opaque {
		return true
	}
	for _, f := range ev.Fields {
		if f.Name == FieldOpaque && f.Role == decide.RoleContent {
			return true
		}
	}
	return false
}

// maxQueryFields bounds the per-parameter fields of one URL.
const maxQueryFields = 64

// Event converts the effect to a decide.Event (channel net, direction
// out). It copies what it needs. An effect whose content carbd cannot see
// sets Event.Opaque and carries an "opaque" content field with an empty
// value (and "opaque.reason").
func (e *Effect) Event() decide.Event {
	ev := decide.Event{Time: e.Time, Ch: decide.ChanNet, Dir: decide.Out, Op: e.Op()}
	d := &decide.Dest{Addr: e.Dst.Addr(), Port: e.Dst.Port(), Proto: protoName(e.Proto, e.Family)}
	ev.Dest = d
	add := func(name string, role decide.Role, v string) {
		ev.Fields = append(ev.Fields, decide.Field{Name: name, Role: role, Value: v})
	}
	switch e.Kind {
	case KindHTTP:
		r := &e.HTTP
		host := string(r.Host)
		d.Host = hostOnly(host)
		ev.Obj = e.url()
		add(FieldMethod, decide.RoleControl, string(r.Method))
		if d.Host != "" {
			add(FieldHost, decide.RoleTarget, d.Host)
		}
		add(FieldURL, decide.RoleTarget, ev.Obj)
		if len(r.UserInfo) > 0 {
			add(FieldUserInfo, decide.RoleCredential, string(r.UserInfo))
		}
		if len(r.Query) > 0 {
			add(FieldQuery, decide.RoleSelector, string(r.Query))
			n := 0
			for kv := range strings.SplitSeq(string(r.Query), "&") {
				if kv == "" {
					continue
				}
				if n++; n > maxQueryFields {
					break
				}
				k, v, _ := strings.Cut(kv, "=")
				if dk, err := url.QueryUnescape(k); err == nil {
					k = dk
				}
				if dv, err := url.QueryUnescape(v); err == nil {
					v = dv
				}
				role := decide.RoleSelector
				if credentialName(k, queryCredNames) {
					role = decide.RoleCredential
				}
				add(FieldQueryPrefix+k, role, v)
			}
		}
		if r.HeadOnly {
			add(FieldPart, decide.RoleControl, "head")
		}
		if r.BodyOnly {
			add(FieldPart, decide.RoleControl, "body")
		} else {
			headerFields(&ev, FieldHeaderPrefix, r.Headers)
		}
		headerFields(&ev, FieldTrailPrefix, r.Trailers)
		if len(r.Body) > 0 {
			add(FieldBody, decide.RoleContent, string(r.Body))
		}
		ev.Content = string(r.Body)
	case KindTLS, KindQUIC:
		ch := &e.TLS
		if e.Kind == KindQUIC {
			ch = &e.QUIC.Hello
			add(FieldQUICVersion, decide.RoleControl, "0x"+strconv.FormatUint(uint64(e.QUIC.Version), 16))
		}
		if len(ch.SNI) > 0 {
			d.Host = string(ch.SNI)
			ev.Obj = netJoin(d.Host, e.Dst.Port())
			add(FieldSNI, decide.RoleTarget, d.Host)
		} else {
			ev.Obj = e.Dst.String()
		}
		if len(ch.ALPN) > 0 {
			add(FieldALPN, decide.RoleControl, string(bytes.Join(ch.ALPN, []byte(","))))
		}
		if ch.Version != 0 {
			add(FieldTLSVersion, decide.RoleControl, VersionName(ch.Version))
		}
		if ch.ECH {
			add(FieldECH, decide.RoleControl, "true")
		}
	case KindDNS:
		for i, q := range e.DNS.Questions {
			name := string(q.Name)
			if i == 0 {
				d.Host, ev.Obj = name, name
			}
			add(FieldQName, decide.RoleTarget, name)
			add(FieldQType, decide.RoleControl, TypeName(q.Type))
			add(FieldQClass, decide.RoleControl, ClassName(q.Class))
		}
		if ev.Obj == "" {
			ev.Obj = e.Dst.String()
		}
		if len(e.DNS.Extra) > 0 {
			add(FieldDNSExtra, decide.RoleContent, string(e.DNS.Extra))
		}
		ev.Content = string(e.Content)
	case KindICMPEcho, KindICMPOther:
		ev.Obj = e.Dst.Addr().String()
		add(FieldICMPType, decide.RoleControl, strconv.Itoa(int(e.ICMPType)))
		add(FieldICMPCode, decide.RoleControl, strconv.Itoa(int(e.ICMPCode)))
		if e.Kind == KindICMPEcho {
			add(FieldICMPID, decide.RoleControl, strconv.Itoa(int(e.ICMPID)))
			add(FieldICMPSeq, decide.RoleControl, strconv.Itoa(int(e.ICMPSeq)))
		}
		if len(e.Content) > 0 {
			add(FieldPayload, decide.RoleContent, string(e.Content))
		}
		ev.Content = string(e.Content)
	case KindIPOpaque:
		ev.Obj = e.Dst.Addr().String()
		if len(e.Content) > 0 {
			add(FieldPayload, decide.RoleContent, string(e.Content))
		}
		ev.Content = string(e.Content)
	default: // UDP, TCP opaque
		ev.Obj = e.Dst.String()
		if len(e.Content) > 0 {
			add(FieldPayload, decide.RoleContent, string(e.Content))
		}
		ev.Content = string(e.Content)
	}
	if e.Opaque != nil {
		ev.Opaque = true
		add(FieldOpaque, decide.RoleContent, "")
		add(FieldOpaqueReason, decide.RoleControl, e.Opaque.Error())
	}
	return ev
}

// url is the request URL: the absolute-form target as sent, else
// http://host + target; the CONNECT target for CONNECT.
func (e *Effect) url() string {
	r := &e.HTTP
	switch {
	case string(r.Method) == "CONNECT":
		return string(r.Host)
	case bytes.Contains(r.Target, []byte("://")):
		return string(r.Target)
	}
	host := string(r.Host)
	if host == "" {
		if e.Dst.Port() == 80 {
			host = addrHost(e.Dst.Addr())
		} else {
			host = e.Dst.String()
		}
	}
	if len(r.Target) == 1 && r.Target[0] == '*' {
		return "http://" + host
	}
	return "http://" + host + string(r.Target)
}

func addrHost(a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return "[" + a.String() + "]"
	}
	return a.String()
}

func netJoin(host string, port uint16) string {
	if strings.IndexByte(host, ':') >= 0 {
		return "[" + host + "]:" + strconv.Itoa(int(port))
	}
	return host + ":" + strconv.Itoa(int(port))
}

// hostOnly strips the port from a Host value ("example.com:8080",
// "[::1]:80").
func hostOnly(h string) string {
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			return h[1:i]
		}
		return h
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h[:i], ':') < 0 {
		return h[:i]
	}
	return h
}

func headerFields(ev *decide.Event, prefix string, hs []Header) {
	for _, h := range hs {
		name := strings.ToLower(string(h.Name))
		if name == "host" {
			continue // the host field
		}
		role := decide.RoleControl
		if credentialName(name, headerCredNames) {
			role = decide.RoleCredential
		}
		ev.Fields = append(ev.Fields, decide.Field{Name: prefix + name, Role: role, Value: string(h.Value)})
	}
}

// Names that mark a header or query parameter as a credential: exact
// names, then substrings.
var (
	headerCredNames = credNames{
		exact: []string{"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "apikey",
			"x-auth", "x-amz-security-token", "x-goog-api-key", "private-token", "x-vault-token", "dpop"},
		sub: []string{"token", "secret", "password", "passwd", "api-key", "api_key", "apikey", "auth",
			"session", "credential", "signature", "cookie"},
	}
	queryCredNames = credNames{
		exact: []string{"key", "sig", "code", "pass", "pwd", "auth", "jwt"},
		sub: []string{"token", "secret", "password", "passwd", "apikey", "api_key", "api-key", "signature",
			"session", "credential", "auth"},
	}
)

type credNames struct{ exact, sub []string }

func credentialName(name string, c credNames) bool {
	name = strings.ToLower(name)
	for _, n := range c.exact {
		if name == n {
			return true
		}
	}
	for _, n := range c.sub {
		if strings.Contains(name, n) {
			return true
		}
	}
	return false
}
