package chv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrVsockRefused is returned by DialVsock when Cloud Hypervisor closes
// the connection instead of answering OK: nothing listens on that port
// in the guest (yet).
var ErrVsockRefused = errors.New("chv: vsock connection refused")

// VsockConn is a host-initiated connection to a guest vsock port.
type VsockConn struct {
	net.Conn
	// HostPort is the local port Cloud Hypervisor assigned to the
	// connection (its "OK <port>" answer).
	HostPort uint32
	r        *bufio.Reader // holds what arrived after the OK line
}

// Read reads the guest's stream, starting after the OK line.
func (c *VsockConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// DialVsock connects to guest port through Cloud Hypervisor's hybrid
// vsock socket (docs/vsock.md, after Firecracker's): connect to the Unix
// socket, send "CONNECT <port>\n", read "OK <hostport>\n"; then the
// stream is the guest's. ctx bounds the handshake.
func DialVsock(ctx context.Context, socket string, port uint32) (*VsockConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("chv: vsock: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			c.Close()
		}
	}()
	if dl, has := ctx.Deadline(); has {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", port); err != nil {
		return nil, fmt.Errorf("chv: vsock: send CONNECT: %w", err)
	}
	r := bufio.NewReaderSize(c, 4096)
	line, err := r.ReadSlice('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("chv: vsock: CONNECT %d: %w", port, ctx.Err())
		}
		if dl, has := ctx.Deadline(); has && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
			// The connection's deadline is ctx's and fired first.
			return nil, fmt.Errorf("chv: vsock: CONNECT %d: %w", port, context.DeadlineExceeded)
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: port %d", ErrVsockRefused, port)
		}
		return nil, fmt.Errorf("chv: vsock: CONNECT %d: answer %q: %w", port, line, err)
	}
	hostPort, perr := parseOK(string(line))
	if perr != nil {
		return nil, fmt.Errorf("chv: vsock: CONNECT %d: %w", port, perr)
	}
	c.SetDeadline(time.Time{})
	ok = true
	return &VsockConn{Conn: c, HostPort: hostPort, r: r}, nil
}

// parseOK parses "OK <port>\n".
func parseOK(line string) (uint32, error) {
	rest, found := strings.CutPrefix(line, "OK ")
	rest, nl := strings.CutSuffix(rest, "\n")
	if !found || !nl {
		return 0, fmt.Errorf("answer %q is not \"OK <port>\"", line)
	}
	p, err := strconv.ParseUint(rest, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("answer %q: port: %w", line, err)
	}
	return uint32(p), nil
}
