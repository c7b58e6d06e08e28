package respwatch

import "errors"

// Why a response (or a whole server-to-client stream) is not fully
// visible. An event flagged Opaque carries one of these, or a parse
// error wrapping ErrHTTP, in its "opaque.reason" field.
var (
	// ErrHTTP marks a response carbd cannot frame: the rest of the
	// connection is not parsed.
	ErrHTTP = errors.New("respwatch: malformed http response")
	// ErrNeedMore: ParseResponse was given the start of a response only.
	ErrNeedMore = errors.New("respwatch: response incomplete")
	// ErrHeadTooBig: the head exceeds Config.MaxHeaderBytes.
	ErrHeadTooBig = errors.New("respwatch: response head larger than the limit")
	// ErrBodyTooBig: the body exceeds MaxBodyBytes (or, encoded,
	// MaxWireBytes); the content holds its start.
	ErrBodyTooBig = errors.New("respwatch: response body larger than the limit")
	// ErrEncoding: a Content-Encoding carbd does not decode (br, zstd,
	// compress...); the content holds the encoded bytes.
	ErrEncoding = errors.New("respwatch: content encoding not decoded")
	// ErrDecode: a gzip or deflate body that does not decode; the content
	// holds what decoded before the error.
	ErrDecode = errors.New("respwatch: content does not decode")
	// ErrLost: the guest acknowledged server bytes the capture never
	// delivered (a dropped frame, a full queue, a truncated frame).
	ErrLost = errors.New("respwatch: response bytes lost before carbd saw them")
	// ErrMemory: the response did not fit in the watcher's memory bound.
	ErrMemory = errors.New("respwatch: buffer memory exhausted")
	// ErrPartial: the response was still incomplete when its wait ran
	// out; the event holds what had arrived, the rest is not inspected.
	ErrPartial = errors.New("respwatch: response incomplete when its wait ran out")
	// ErrTLS: the connection is encrypted.
	ErrTLS = errors.New("respwatch: tls: the content is encrypted")
	// ErrNotHTTP: the server speaks a protocol carbd does not parse.
	ErrNotHTTP = errors.New("respwatch: not a protocol carbd parses")
	// ErrNoStart: the connection's start was not seen; where responses
	// begin is unknown.
	ErrNoStart = errors.New("respwatch: stream start not seen")
	// ErrTunnel: after CONNECT or 101 Switching Protocols the connection
	// carries another protocol.
	ErrTunnel = errors.New("respwatch: the connection became a tunnel")
)
