package netparse

import (
	"errors"
	"fmt"
)

// ErrHelloIncomplete says that the bytes given so far end inside the
// ClientHello: read more and call again.
var ErrHelloIncomplete = errors.New("netparse: tls clienthello incomplete")

// HelloScanner reads the ClientHello at the start of a TLS byte stream
// (records joined, split anywhere), as the verdict loop does: for a
// listener that must see a connection's server name before it decides
// what to do with it (the interception's pass-through). The zero value
// is ready; a scanner serves one stream.
type HelloScanner struct {
	scan    helloScan
	scratch []byte
}

// Scan looks at b, the stream from its first byte (each call with the
// bytes of the previous one and what came since). It returns
// ErrHelloIncomplete while more is needed, ErrTLS (wrapped) when the
// stream does not start with a ClientHello or it exceeds limit bytes, or
// nil with ch filled (its slices view b or the scanner's buffer).
func (s *HelloScanner) Scan(b []byte, limit int, ch *ClientHello) error {
	if len(b) > 0 && !looksTLS(b) {
		return fmt.Errorf("%w: the stream does not start with a handshake record", ErrTLS)
	}
	msg, st, err := s.scan.next(b, limit, &s.scratch)
	switch st {
	case tlsMore:
		return ErrHelloIncomplete
	case tlsBig:
		return fmt.Errorf("%w: larger than %d bytes", ErrTLS, limit)
	case tlsBad:
		return err
	}
	return parseClientHelloMsg(msg, ch)
}
