package netparse

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrTLS marks a TLS ClientHello carbd cannot read.
var ErrTLS = errors.New("netparse: malformed tls clienthello")

// ClientHello holds what carbd reads from a TLS ClientHello; the rest of
// the handshake and all application data are opaque. Slices are views.
type ClientHello struct {
	// Version is the highest version offered in supported_versions
	// (GREASE values ignored), else the legacy version.
	Version       uint16
	LegacyVersion uint16
	SNI           []byte   // the first host_name of server_name
	ALPN          [][]byte // protocols offered, in order
	// ECH says an encrypted_client_hello extension is present: SNI is then
	// the client-facing public name, not the real one.
	ECH bool
	// QUIC says the quic_transport_parameters extension is present.
	QUIC bool
}

func (c *ClientHello) reset() {
	a := c.ALPN[:0]
	*c = ClientHello{ALPN: a}
}

// VersionName names a TLS version ("tls1.3").
func VersionName(v uint16) string {
	switch v {
	case 0x0300:
		return "ssl3.0"
	case 0x0301:
		return "tls1.0"
	case 0x0302:
		return "tls1.1"
	case 0x0303:
		return "tls1.2"
	case 0x0304:
		return "tls1.3"
	}
	return fmt.Sprintf("0x%04x", v)
}

const (
	maxALPN     = 16
	extSNI      = 0
	extALPN     = 16
	extVersions = 43
	extQUIC     = 57
	extECH      = 0xfe0d
)

type reader struct {
	b   []byte
	err error
}

func (r *reader) n(k int) []byte {
	if r.err != nil {
		return nil
	}
	if k < 0 || k > len(r.b) {
		r.err = fmt.Errorf("%w: need %d bytes, have %d", ErrTLS, k, len(r.b))
		return nil
	}
	v := r.b[:k]
	r.b = r.b[k:]
	return v
}

func (r *reader) u8() int {
	v := r.n(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.n(2)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(v))
}

// parseClientHelloMsg parses a handshake message (type, 3-byte length,
// body) that must be exactly one ClientHello.
func parseClientHelloMsg(msg []byte, ch *ClientHello) error {
	if len(msg) < 4 {
		return fmt.Errorf("%w: handshake header", ErrTLS)
	}
	if msg[0] != 1 {
		return fmt.Errorf("%w: handshake type %d is not client_hello", ErrTLS, msg[0])
	}
	n := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
	if n != len(msg)-4 {
		return fmt.Errorf("%w: handshake length %d, have %d", ErrTLS, n, len(msg)-4)
	}
	return parseClientHello(msg[4:], ch)
}

// parseClientHello parses a ClientHello body (RFC 8446 §4.1.2).
func parseClientHello(body []byte, ch *ClientHello) error {
	ch.reset()
	r := reader{b: body}
	ch.LegacyVersion = uint16(r.u16())
	ch.Version = ch.LegacyVersion
	r.n(32) // random
	if sid := r.u8(); sid > 32 {
		return fmt.Errorf("%w: session id of %d bytes", ErrTLS, sid)
	} else {
		r.n(sid)
	}
	cs := r.u16()
	if cs%2 != 0 || cs == 0 {
		return fmt.Errorf("%w: cipher suites length %d", ErrTLS, cs)
	}
	r.n(cs)
	cm := r.u8()
	if cm == 0 {
		return fmt.Errorf("%w: no compression methods", ErrTLS)
	}
	r.n(cm)
	if r.err != nil {
		return r.err
	}
	if len(r.b) == 0 {
		return nil // no extensions (old clients)
	}
	ext := reader{b: r.n(r.u16())}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d bytes after the extensions", ErrTLS, len(r.b))
	}
	var seen [128]uint16 // extension types seen, for duplicates
	nseen := 0
	for len(ext.b) > 0 {
		typ := ext.u16()
		data := reader{b: ext.n(ext.u16())}
		if ext.err != nil {
			return ext.err
		}
		for _, t := range seen[:nseen] {
			if int(t) == typ {
				return fmt.Errorf("%w: extension %d twice", ErrTLS, typ)
			}
		}
		if nseen == len(seen) {
			return fmt.Errorf("%w: more than %d extensions", ErrTLS, len(seen))
		}
		seen[nseen] = uint16(typ)
		nseen++
		switch typ {
		case extSNI:
			list := reader{b: data.n(data.u16())}
			for len(list.b) > 0 && list.err == nil {
				nt := list.u8()
				name := list.n(list.u16())
				if nt == 0 && list.err == nil {
					if ch.SNI != nil {
						return fmt.Errorf("%w: two host names in server_name", ErrTLS)
					}
					if len(name) == 0 {
						return fmt.Errorf("%w: empty host name", ErrTLS)
					}
					ch.SNI = name
				}
			}
			if list.err != nil {
				return list.err
			}
		case extALPN:
			list := reader{b: data.n(data.u16())}
			for len(list.b) > 0 && list.err == nil {
				p := list.n(list.u8())
				if len(p) == 0 && list.err == nil {
					return fmt.Errorf("%w: empty ALPN protocol", ErrTLS)
				}
				if len(ch.ALPN) < maxALPN {
					ch.ALPN = append(ch.ALPN, p)
				}
			}
			if list.err != nil {
				return list.err
			}
		case extVersions:
			list := reader{b: data.n(data.u8())}
			best := uint16(0)
			for len(list.b) >= 2 {
				v := uint16(list.u16())
				if v&0x0f0f == 0x0a0a { // GREASE (RFC 8701)
					continue
				}
				best = max(best, v)
			}
			if best != 0 {
				ch.Version = best
			}
		case extQUIC:
			ch.QUIC = true
		case extECH:
			ch.ECH = true
		}
		if data.err != nil {
			return data.err
		}
	}
	return nil
}

// tlsStatus is the state of a TLS stream start.
type tlsStatus uint8

const (
	tlsMore tlsStatus = iota
	tlsDone
	tlsBad
	tlsBig
)

// looksTLS reports whether b can start a TLS handshake record.
func looksTLS(b []byte) bool {
	switch len(b) {
	case 0:
		return false
	case 1:
		return b[0] == 22
	case 2:
		return b[0] == 22 && b[1] == 3
	}
	return b[0] == 22 && b[1] == 3 && b[2] <= 4
}

// clientHelloFromRecords reads the first handshake message from TLS
// records at the start of a stream, joining handshake fragments from
// consecutive records into scratch when needed. It returns the message.
func clientHelloFromRecords(b []byte, limit int, scratch *[]byte) ([]byte, tlsStatus, error) {
	var s helloScan
	return s.next(b, limit, scratch)
}

// helloScan follows the records of a stream's first handshake message as
// they arrive: each call resumes after the records already counted, and
// the fragments are joined once, when the message is complete, so that a
// ClientHello sent in many small records and segments costs linear time.
type helloScan struct {
	off  int     // start of the first record not counted yet
	size int     // handshake bytes in the records counted
	hdr  [4]byte // the message's first four bytes
	want int     // the message's length with its header, once known
}

// next looks at b, the stream from its first byte (the bytes already
// counted unchanged), and says whether the message is complete.
func (s *helloScan) next(b []byte, limit int, scratch *[]byte) ([]byte, tlsStatus, error) {
	for {
		if len(b)-s.off < 5 {
			return nil, tlsMore, nil
		}
		h := b[s.off : s.off+5]
		if h[0] != 22 || h[1] != 3 || h[2] > 4 {
			return nil, tlsBad, fmt.Errorf("%w: record type %d version %d.%d is not a handshake", ErrTLS, h[0], h[1], h[2])
		}
		n := int(binary.BigEndian.Uint16(h[3:5]))
		if n == 0 || n > 1<<14 {
			return nil, tlsBad, fmt.Errorf("%w: record length %d", ErrTLS, n)
		}
		if s.off+5+n > limit+5*16 {
			// Decided on the record header alone, so that it does not
			// matter whether the record's bytes came with it.
			return nil, tlsBig, nil
		}
		if len(b)-s.off-5 < n {
			return nil, tlsMore, nil
		}
		frag := b[s.off+5 : s.off+5+n]
		for i := 0; s.size+i < 4 && i < n; i++ {
			s.hdr[s.size+i] = frag[i]
		}
		s.size += n
		s.off += 5 + n
		if s.size < 4 {
			continue
		}
		if s.want == 0 {
			if s.hdr[0] != 1 {
				return nil, tlsBad, fmt.Errorf("%w: first handshake message has type %d", ErrTLS, s.hdr[0])
			}
			s.want = 4 + (int(s.hdr[1])<<16 | int(s.hdr[2])<<8 | int(s.hdr[3]))
			if s.want > limit {
				return nil, tlsBig, nil
			}
		}
		if s.size < s.want {
			continue
		}
		if s.size > s.want {
			// Another handshake message in the same flight is not
			// something a client sends before the server answers.
			return nil, tlsBad, fmt.Errorf("%w: %d bytes after the ClientHello", ErrTLS, s.size-s.want)
		}
		if s.off == 5+n {
			return frag, tlsDone, nil // one record
		}
		msg := (*scratch)[:0]
		for off := 0; off < s.off; {
			rn := int(binary.BigEndian.Uint16(b[off+3 : off+5]))
			msg = append(msg, b[off+5:off+5+rn]...)
			off += 5 + rn
		}
		*scratch = msg
		return msg, tlsDone, nil
	}
}
