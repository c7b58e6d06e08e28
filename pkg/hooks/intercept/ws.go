package intercept

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// WebSocket framing (RFC 6455 §5.2), for deciding each client message
// and observing each server message after a released upgrade.

// Operations and fields of WebSocket events.
const (
	OpWSMessage = "ws:message" // a data message; Dir out: the client's, in: the server's
	OpWSControl = "ws:control" // a ping, pong or close frame carrying a payload
	FieldWSType = "ws.type"    // control: text, binary, ping, pong, close
)

const maxWSControl = 125

// ErrWebSocket marks frames carbd cannot follow; the connection ends.
var ErrWebSocket = errors.New("intercept: websocket")

// wsHeader is a frame's header.
type wsHeader struct {
	fin    bool
	opcode byte
	masked bool
	key    [4]byte
	length uint64
}

func (h *wsHeader) control() bool { return h.opcode&0x8 != 0 }

// parseWSHeader parses the frame header at the start of b: it returns the
// header's length, 0 when b does not hold all of it yet.
func parseWSHeader(b []byte, h *wsHeader) (int, error) {
	if len(b) < 2 {
		return 0, nil
	}
	rsv := b[0] & 0x70
	h.fin, h.opcode = b[0]&0x80 != 0, b[0]&0x0f
	h.masked = b[1]&0x80 != 0
	n := 2
	switch l := b[1] & 0x7f; l {
	case 126:
		if len(b) < 4 {
			return 0, nil
		}
		h.length = uint64(binary.BigEndian.Uint16(b[2:]))
		n = 4
	case 127:
		if len(b) < 10 {
			return 0, nil
		}
		h.length = binary.BigEndian.Uint64(b[2:])
		if h.length>>63 != 0 {
			return 0, fmt.Errorf("%w: 64-bit length with its top bit set", ErrWebSocket)
		}
		n = 10
	default:
		h.length = uint64(l)
	}
	if h.masked {
		if len(b) < n+4 {
			return 0, nil
		}
		copy(h.key[:], b[n:n+4])
		n += 4
	}
	switch {
	case rsv != 0:
		// An extension (permessage-deflate) would hide the payload; the
		// proxy strips extension offers from the upgrade, so none is in
		// use and a reserved bit is an error.
		return 0, fmt.Errorf("%w: reserved bits %#x set (no extension was agreed)", ErrWebSocket, rsv)
	case h.opcode > 0xa || h.opcode > 2 && h.opcode < 8:
		return 0, fmt.Errorf("%w: opcode %#x", ErrWebSocket, h.opcode)
	case h.control() && (h.length > maxWSControl || !h.fin):
		return 0, fmt.Errorf("%w: control frame of %d bytes (fin %v)", ErrWebSocket, h.length, h.fin)
	}
	return n, nil
}

var wsTypeNames = [...]string{0: "continuation", 1: "text", 2: "binary", 8: "close", 9: "ping", 10: "pong"}

func wsTypeName(op byte) string {
	if int(op) < len(wsTypeNames) && wsTypeNames[op] != "" {
		return wsTypeNames[op]
	}
	return "unknown"
}

// wsUnit is what a wsAssembler returns: a whole data message, a control
// frame, the start of a message longer than the limit (big), or later
// bytes of such a message (follow).
type wsUnit struct {
	typ     byte   // opcode: 1 text, 2 binary, 8-10 control
	payload []byte // unmasked; for a big message its first limit bytes
	raw     []byte // the bytes as received (headers and payload)
	big     bool   // a message longer than the limit: the rest follows
	follow  bool   // raw continues a big message returned earlier
	end     bool   // the message's (or control frame's) last byte is in raw
}

// wsAssembler frames one direction of a WebSocket connection. Write the
// bytes as they arrive, then call next until it returns false. A data
// message is buffered whole up to limit bytes of payload; a longer one is
// returned at the limit (big) and its later bytes pass as follow units,
// as they arrive. Control frames are returned whole, also between the
// fragments of a message.
type wsAssembler struct {
	masked bool // the client's direction: its frames are masked
	limit  int
	buf    []byte // bytes not parsed yet
	// The frame in progress (data frames only).
	inFrame bool
	h       wsHeader
	remain  uint64 // its payload bytes not seen yet
	off     int    // payload bytes seen (for the mask)
	// The message in progress.
	inMsg   bool
	typ     byte
	raw     []byte
	payload []byte
	follow  bool
}

func (a *wsAssembler) write(b []byte) { a.buf = append(a.buf, b...) }

func (a *wsAssembler) consume(n int) {
	k := copy(a.buf, a.buf[n:])
	a.buf = a.buf[:k]
}

// next returns the next unit, or false when more bytes are needed.
func (a *wsAssembler) next() (wsUnit, bool, error) {
	for {
		if !a.inFrame {
			var h wsHeader
			hn, err := parseWSHeader(a.buf, &h)
			if err != nil || hn == 0 {
				return wsUnit{}, false, err
			}
			if h.masked != a.masked {
				return wsUnit{}, false, fmt.Errorf("%w: a frame masked=%v in the wrong direction", ErrWebSocket, h.masked)
			}
			if h.control() {
				end := hn + int(h.length)
				if len(a.buf) < end {
					return wsUnit{}, false, nil
				}
				u := wsUnit{typ: h.opcode, raw: clone(a.buf[:end]), payload: unmask(a.buf[hn:end], &h, 0), end: true}
				a.consume(end)
				return u, true, nil
			}
			switch {
			case h.opcode == 0 && !a.inMsg:
				return wsUnit{}, false, fmt.Errorf("%w: continuation frame outside a message", ErrWebSocket)
			case h.opcode != 0 && a.inMsg:
				return wsUnit{}, false, fmt.Errorf("%w: a new message inside a fragmented one", ErrWebSocket)
			}
			if !a.inMsg {
				a.inMsg, a.typ, a.raw, a.payload, a.follow = true, h.opcode, a.raw[:0], a.payload[:0], false
			}
			a.inFrame, a.h, a.remain, a.off = true, h, h.length, 0
			hdr := a.buf[:hn]
			if a.follow {
				u := wsUnit{typ: a.typ, raw: clone(hdr), follow: true}
				a.consume(hn)
				if a.frameDone() {
					u.end = a.msgEnd()
				}
				return u, true, nil
			}
			a.raw = append(a.raw, hdr...)
			a.consume(hn)
			if a.frameDone() && a.msgEnd() {
				return a.whole(), true, nil
			}
			continue
		}
		k := int(min(a.remain, uint64(len(a.buf))))
		if k == 0 {
			return wsUnit{}, false, nil
		}
		data := a.buf[:k]
		if a.follow {
			u := wsUnit{typ: a.typ, raw: clone(data), follow: true}
			a.consume(k)
			a.remain -= uint64(k)
			a.off += k
			if a.frameDone() {
				u.end = a.msgEnd()
			}
			return u, true, nil
		}
		room := a.limit - len(a.payload)
		a.raw = append(a.raw, data...)
		a.payload = append(a.payload, unmask(data[:min(k, room)], &a.h, a.off)...)
		a.consume(k)
		a.remain -= uint64(k)
		a.off += k
		if k > room || len(a.payload) == a.limit && a.remain > 0 {
			// Over the limit: decide on the start; the rest follows.
			u := wsUnit{typ: a.typ, raw: clone(a.raw), payload: clone(a.payload), big: true}
			a.follow = true
			if a.frameDone() {
				u.end = a.msgEnd()
			}
			return u, true, nil
		}
		if a.frameDone() && a.msgEnd() {
			return a.whole(), true, nil
		}
	}
}

// frameDone ends the frame in progress when its payload is all seen.
func (a *wsAssembler) frameDone() bool {
	if a.remain > 0 {
		return false
	}
	a.inFrame = false
	return true
}

// msgEnd ends the message when the frame just ended was its last.
func (a *wsAssembler) msgEnd() bool {
	if !a.h.fin {
		return false
	}
	a.inMsg, a.follow = false, false
	return true
}

func (a *wsAssembler) whole() wsUnit {
	return wsUnit{typ: a.typ, raw: clone(a.raw), payload: clone(a.payload), end: true}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// unmask returns a copy of payload bytes unmasked, off bytes into the
// frame's payload.
func unmask(b []byte, h *wsHeader, off int) []byte {
	out := clone(b)
	if h.masked {
		for i := range out {
			out[i] ^= h.key[(off+i)&3]
		}
	}
	return out
}

// wsCloseFrame is a server-to-client close frame with a status code and
// a reason cut to fit.
func wsCloseFrame(code uint16, reason string) []byte {
	if len(reason) > maxWSControl-2 {
		reason = reason[:maxWSControl-2]
	}
	b := []byte{0x88, byte(2 + len(reason)), byte(code >> 8), byte(code)}
	return append(b, reason...)
}
