package ctrl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
)

// LineError is a decode error with the number (from 1) of the line that
// caused it. It unwraps to one of the package's sentinel errors.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("ctrl: line %d: %s", e.Line, strings.TrimPrefix(e.Err.Error(), "ctrl: "))
}

func (e *LineError) Unwrap() error { return e.Err }

// Conn sends and receives messages over a byte stream. One goroutine may
// call Recv while another calls Send; Send and Recv are each also safe to
// call from several goroutines (they serialize).
type Conn struct {
	rmu     sync.Mutex // guards r, line, buf
	r       *bufio.Reader
	line    int
	buf     []byte
	rwClose io.Closer

	wmu sync.Mutex // guards w
	w   io.Writer
}

// NewConn returns a Conn over rw. Close closes rw when it is an io.Closer.
func NewConn(rw io.ReadWriter) *Conn {
	c := &Conn{r: bufio.NewReaderSize(rw, 64<<10), w: rw}
	if cl, ok := rw.(io.Closer); ok {
		c.rwClose = cl
	}
	return c
}

// Send validates m and writes it as one line.
func (c *Conn) Send(m Message) error {
	line, err := Encode(m)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.w.Write(line); err != nil {
		return fmt.Errorf("ctrl: send %s: %w", m.Type(), err)
	}
	return nil
}

// Recv reads and decodes the next line. At the end of the stream it
// returns io.EOF (io.ErrUnexpectedEOF inside a line). A line that does
// not decode gives a *LineError; the next Recv reads the line after it.
func (c *Conn) Recv() (Message, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.buf = c.buf[:0]
	tooLong := false
	for {
		frag, err := c.r.ReadSlice('\n')
		if !tooLong {
			if len(c.buf)+len(frag) > MaxLine+1 { // +1: the "\n"
				tooLong = true
				c.buf = c.buf[:0]
			} else {
				c.buf = append(c.buf, frag...)
			}
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err == io.EOF {
			if len(frag) == 0 && len(c.buf) == 0 && !tooLong {
				return nil, io.EOF
			}
			c.line++
			return nil, &LineError{Line: c.line, Err: fmt.Errorf("%w: stream ended inside a line", io.ErrUnexpectedEOF)}
		}
		return nil, fmt.Errorf("ctrl: recv: %w", err)
	}
	c.line++
	if tooLong {
		return nil, &LineError{Line: c.line, Err: fmt.Errorf("%w (max %d bytes)", ErrLineTooLong, MaxLine)}
	}
	m, err := Decode(c.buf[:len(c.buf)-1])
	if err != nil {
		return nil, &LineError{Line: c.line, Err: err}
	}
	return m, nil
}

// RecvHello receives the guest's first message and checks that it is a
// hello of a version from MinVersion to Version (the caller sends an env
// message only to EnvVersion or later).
func (c *Conn) RecvHello() (*Hello, error) {
	m, err := c.Recv()
	if err != nil {
		return nil, err
	}
	h, ok := m.(*Hello)
	if !ok {
		return nil, fmt.Errorf("%w: %s before hello", ErrUnexpected, m.Type())
	}
	if h.Version < MinVersion || h.Version > Version {
		return h, fmt.Errorf("%w: guest speaks %d, host %d to %d", ErrVersion, h.Version, MinVersion, Version)
	}
	return h, nil
}

// Close closes the underlying stream when it is an io.Closer.
func (c *Conn) Close() error {
	if c.rwClose == nil {
		return nil
	}
	return c.rwClose.Close()
}
