package intercept

import (
	"io"
	"net"
	"os"
	"syscall"
)

// chunkReader reads a connection's bytes into pooled buffers: it waits
// for the connection to be readable holding no buffer, then reads what
// is waiting (up to passChunk) into one taken from passBufs.
type chunkReader struct {
	c  net.Conn
	rc syscall.RawConn // nil: c is not a socket; plain reads
}

func newChunkReader(c net.Conn) *chunkReader {
	r := &chunkReader{c: c}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc = rc
		}
	}
	return r
}

// next reads one chunk and hands it to use; use's error is returned.
// The end of the stream is io.EOF.
func (r *chunkReader) next(use func([]byte) error) error {
	if r.rc == nil {
		return plainNext(r.c, use)
	}
	var (
		buf  *[]byte
		n    int
		rerr error
	)
	err := r.rc.Read(func(fd uintptr) bool {
		buf = passBufs.Get().(*[]byte)
		for {
			n, rerr = syscall.Read(int(fd), *buf)
			if rerr != syscall.EINTR {
				break
			}
		}
		if rerr == syscall.EAGAIN {
			passBufs.Put(buf)
			buf = nil
			return false // wait until readable
		}
		return true
	})
	if buf != nil {
		defer passBufs.Put(buf)
	}
	switch {
	case err != nil:
		return err
	case rerr != nil:
		return os.NewSyscallError("read", rerr)
	case n == 0:
		return io.EOF
	}
	return use((*buf)[:n])
}
