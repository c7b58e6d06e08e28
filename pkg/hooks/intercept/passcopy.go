package intercept

import (
	"errors"
	"io"
	"net"
	"sync"
)

// A passed connection is relayed through user space in large chunks,
// not spliced: on loopback (the benchmarks) splice(2) through a pipe
// cost more CPU per byte than reading into a 256 KiB buffer and writing
// it out (docs/interception.md, "Issue 13: downloads"). The buffer is
// taken from a pool only once bytes are waiting (chunkReader), so an
// idle passed connection holds none.

// passChunk is the most a passed connection forwards in one write.
const passChunk = 256 << 10

var passBufs = sync.Pool{New: func() any { b := make([]byte, passChunk); return &b }}

// relayStep is the step of relay that ended it with an error.
type relayStep uint8

const (
	stepRead relayStep = iota
	stepCheck
	stepWrite
)

// errStop ends chunkReader.next from use; relay returns use's own error.
var errStop = errors.New("intercept: relay stopped")

// relay copies src to dst chunk by chunk until src ends or fails. Each
// chunk goes to check first (when set); a chunk check refuses is not
// forwarded, and check's error ends the relay. It returns the bytes
// written to dst and, when it ended early, the failing step and its
// error. src's end (EOF) and a connection closed here (either) are not
// errors.
func relay(dst, src net.Conn, check func() error) (int64, relayStep, error) {
	var (
		total int64
		step  relayStep
		uerr  error
	)
	use := func(b []byte) error {
		if check != nil {
			if err := check(); err != nil {
				step, uerr = stepCheck, err
				return errStop
			}
		}
		n, err := dst.Write(b)
		total += int64(n)
		if err != nil {
			step, uerr = stepWrite, err
			return errStop
		}
		return nil
	}
	r := newChunkReader(src)
	for {
		switch err := r.next(use); {
		case err == nil:
		case err == errStop:
			if step == stepWrite && errors.Is(uerr, net.ErrClosed) {
				return total, stepRead, nil // closed here: the end
			}
			return total, step, uerr
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
			return total, stepRead, nil
		default:
			return total, stepRead, err
		}
	}
}

// plainNext is chunkReader.next for a connection that is not a socket:
// one Read into a pooled buffer.
func plainNext(c net.Conn, use func([]byte) error) error {
	buf := passBufs.Get().(*[]byte)
	defer passBufs.Put(buf)
	n, err := c.Read(*buf)
	if n > 0 {
		if uerr := use((*buf)[:n]); uerr != nil {
			return uerr
		}
	}
	return err
}
