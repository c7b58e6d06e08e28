package capture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/netnsx"
)

// Record is one captured frame.
type Record struct {
	Time    time.Time
	Data    []byte
	OrigLen int
	Dir     Direction
}

// Capture records the frames of one interface into a bounded buffer: when
// it holds more than MaxBytes, the oldest frames are dropped (and
// counted).
type Capture struct {
	// f is the packet socket, non-blocking, in Go's poller: the reader
	// sleeps until a frame arrives, and Close wakes it.
	f       *os.File
	rc      syscall.RawConn
	ifname  string
	snaplen int

	// onFrame, when set, is called with every frame (WithFrameFunc).
	onFrame func(Record)
	// rcvbuf, when set, is the socket's receive buffer (WithReadBuffer).
	rcvbuf int

	mu       sync.Mutex // guards everything below
	recs     []Record
	bytes    int
	maxBytes int
	dropped  uint64
	keylog   []byte // NSS key log lines, the newest MaxKeyLogBytes
	closing  bool
	done     chan struct{}
}

// Option configures a Capture at Start.
type Option func(*Capture)

// WithFrameFunc has the capture call fn with every frame it reads, in
// the order read, on the capture's reader goroutine, before the frame is
// added to the bounded buffer. fn must not block (hand the frame to a
// bounded queue and count what does not fit) and must not modify
// Record.Data, which the buffer shares; it may keep the Record.
func WithFrameFunc(fn func(Record)) Option {
	return func(c *Capture) { c.onFrame = fn }
}

// WithReadBuffer sets the packet socket's receive buffer to n bytes
// (SO_RCVBUFFORCE; the kernel doubles it). The default (rmem_default,
// about 208 KiB) holds three 64 KiB offload frames: a burst larger than
// that while the reader is not scheduled is dropped by the kernel.
func WithReadBuffer(n int) Option {
	return func(c *Capture) { c.rcvbuf = n }
}

// Start opens an AF_PACKET socket on ifname, inside the network
// namespace at nsPath when it is not empty, and records every frame in
// both directions.
func Start(ifname, nsPath string, snaplen, maxBytes int, opts ...Option) (*Capture, error) {
	if snaplen <= 0 {
		snaplen = 65535
	}
	var fd int
	var c0 Capture
	for _, o := range opts {
		o(&c0)
	}
	open := func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		// Protocol 0: the socket receives nothing until it is bound to
		// ifname. Opened with ETH_P_ALL it would take every interface's
		// frames until the bind, and the bind would wait for an RCU grace
		// period to move its hook (15 ms per sandbox start, measured).
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("capture: packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("capture: bind to %s: %w", ifname, err)
		}
		if c0.rcvbuf > 0 {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, c0.rcvbuf); err != nil {
				unix.Close(fd)
				return fmt.Errorf("capture: receive buffer of %d bytes: %w", c0.rcvbuf, err)
			}
		}
		// Non-blocking, read through Go's poller (see loop).
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return fmt.Errorf("capture: packet socket: %w", err)
		}
		return nil
	}
	if nsPath != "" {
		if err := inNS(nsPath, open); err != nil {
			return nil, err
		}
	} else if err := open(); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "packet:"+ifname)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("capture: packet socket: %w", err)
	}
	c := &Capture{f: f, rc: rc, ifname: ifname, snaplen: snaplen, maxBytes: maxBytes, done: make(chan struct{}),
		onFrame: c0.onFrame, rcvbuf: c0.rcvbuf}
	go c.loop()
	return c, nil
}

func inNS(path string, fn func() error) error { return netnsx.Do(path, fn) }

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, c.snaplen)
	for {
		var n int
		var from unix.Sockaddr
		var err error
		// Read waits in Go's poller while the socket has nothing (no
		// wake-up while the interface is quiet); Close ends it.
		rerr := c.rc.Read(func(fd uintptr) bool {
			n, from, err = unix.Recvfrom(int(fd), buf, unix.MSG_TRUNC)
			return err != unix.EAGAIN
		})
		if rerr != nil { // closed
			return
		}
		if err != nil {
			// ENETDOWN: the interface was down when the socket was bound
			// (carbd starts the capture before the interface comes up) or
			// went down; the kernel reports it once and delivers frames
			// again when the interface is up.
			if err == unix.EAGAIN || err == unix.EINTR || err == unix.ENETDOWN {
				continue
			}
			return
		}
		orig := n
		if n > len(buf) {
			n = len(buf)
		}
		dir := Egress // frames the guest sent arrive on the host side
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			dir = Ingress
		}
		rec := Record{Time: time.Now(), Data: append([]byte(nil), buf[:n]...), OrigLen: orig, Dir: dir}
		if c.onFrame != nil {
			c.onFrame(rec)
		}
		c.mu.Lock()
		c.recs = append(c.recs, rec)
		c.bytes += n
		for c.maxBytes > 0 && c.bytes > c.maxBytes && len(c.recs) > 1 {
			c.bytes -= len(c.recs[0].Data)
			c.recs[0] = Record{}
			c.recs = c.recs[1:]
			c.dropped++
		}
		c.mu.Unlock()
	}
}

// Records returns a copy of the captured frames, oldest first, and how
// many older frames were dropped to stay within the bound.
func (c *Capture) Records() ([]Record, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Record(nil), c.recs...), c.dropped
}

// MaxKeyLogBytes bounds the TLS key log a Capture keeps: the oldest
// lines go first (their connections' frames are likely gone too).
const MaxKeyLogBytes = 4 << 20

// KeyLog returns a writer (crypto/tls's KeyLogWriter) whose NSS key log
// lines the export carries as a Decryption Secrets Block before the
// frames, so that readers (tshark, Wireshark) decrypt the TLS they
// carry. Safe for concurrent use.
func (c *Capture) KeyLog() io.Writer { return keyLogWriter{c} }

type keyLogWriter struct{ c *Capture }

// Write keeps whole lines, as crypto/tls writes them.
func (k keyLogWriter) Write(lines []byte) (int, error) {
	c := k.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keylog = append(c.keylog, lines...)
	if over := len(c.keylog) - MaxKeyLogBytes; over > 0 {
		cut := over
		if i := bytes.IndexByte(c.keylog[over:], '\n'); i >= 0 {
			cut += i + 1
		} else {
			cut = len(c.keylog)
		}
		c.keylog = append(c.keylog[:0], c.keylog[cut:]...)
	}
	return len(lines), nil
}

// WritePcapng exports the capture, annotating each frame; the TLS key
// log lines written to the Capture come first, as a Decryption Secrets
// Block.
func (c *Capture) WritePcapng(w io.Writer, annotate func(Record) Annotation) error {
	recs, _ := c.Records()
	c.mu.Lock()
	keylog := append([]byte(nil), c.keylog...)
	c.mu.Unlock()
	pw, err := NewWriter(w, c.ifname, LinkTypeEthernet, uint32(c.snaplen))
	if err != nil {
		return err
	}
	if len(keylog) > 0 {
		if err := pw.WriteSecrets(SecretsTLSKeyLog, keylog); err != nil {
			return err
		}
	}
	for _, r := range recs {
		var a Annotation
		if annotate != nil {
			a = annotate(r)
		}
		if err := pw.WritePacket(r.Time, r.Data, r.OrigLen, r.Dir, a); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the capture: it closes the socket, which wakes the reader,
// and waits for the reader to end.
func (c *Capture) Close() error {
	c.mu.Lock()
	already := c.closing
	c.closing = true
	c.mu.Unlock()
	if already {
		return nil
	}
	err := c.f.Close()
	<-c.done
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}
