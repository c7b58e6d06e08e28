package capture

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultStreamMaxBytes caps a streamed audit file: frames beyond it are
// counted (Stream.Stats) and not written.
const DefaultStreamMaxBytes = 256 << 20

// DefaultStreamPendingBytes bounds the frames a Stream holds back while
// their verdicts are not final: beyond it, the oldest are written with
// the annotation they have then.
const DefaultStreamPendingBytes = 32 << 20

// StreamConfig configures a Stream.
type StreamConfig struct {
	// Path is the file, created (or truncated) with mode 0600: it holds
	// the agent's payloads.
	Path    string
	Ifname  string
	Snaplen int
	// MaxBytes caps the file (0: DefaultStreamMaxBytes; negative: no cap).
	MaxBytes int64
	// Delay is the longest a frame is held back waiting for its final
	// verdict (the daemon's hold timeout: a held packet is decided or
	// dropped by then). 0: frames are written at the next tick.
	Delay time.Duration
	// PendingBytes bounds the frames held back (0:
	// DefaultStreamPendingBytes).
	PendingBytes int
	// Annotate labels a frame; Final in its answer says the verdict will
	// not change, so the frame can be written now.
	Annotate func(Record) Annotation
	// Tick is how often held-back frames are reconsidered (0: 100 ms);
	// while none is held back, the Stream does not wake.
	Tick time.Duration
}

// Stream writes a pcapng file as the capture goes: each frame once its
// verdict is final (or after Delay), in capture order, each block with
// one write(2) and no user-space buffer, so the file is readable while it
// grows and, after a crash (kill -9), holds every block written before
// it: readers stop at the last whole block. Decryption secrets are
// written at once, ahead of the frames still held back, so they precede
// the frames they decrypt.
type Stream struct {
	cfg  StreamConfig
	f    *os.File
	pw   *Writer
	kick chan struct{} // flush now: over PendingBytes, or closed
	arm  chan struct{} // a frame is held back: tick
	done chan struct{}

	mu      sync.Mutex // guards everything below and writes to f
	pending []Record
	pbytes  int
	written int64
	frames  uint64
	dropped uint64 // frames beyond MaxBytes or after Close
	err     error  // the first write error; nothing is written after it
	closed  bool
}

// StreamStats are a Stream's counts.
type StreamStats struct {
	Frames  uint64 // frames written
	Dropped uint64 // frames not written: beyond the cap or after an error
	Bytes   int64  // bytes written
}

// NewStream creates the file and writes its section header.
func NewStream(cfg StreamConfig) (*Stream, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultStreamMaxBytes
	}
	if cfg.PendingBytes <= 0 {
		cfg.PendingBytes = DefaultStreamPendingBytes
	}
	if cfg.Tick <= 0 {
		cfg.Tick = 100 * time.Millisecond
	}
	if cfg.Snaplen <= 0 {
		cfg.Snaplen = 65535
	}
	f, err := os.OpenFile(cfg.Path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("capture: audit file: %w", err)
	}
	// An existing file keeps its mode through O_CREATE: make it private.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("capture: audit file: %w", err)
	}
	s := &Stream{cfg: cfg, f: f, kick: make(chan struct{}, 1), arm: make(chan struct{}, 1), done: make(chan struct{})}
	cw := &countWriter{s: s}
	pw, err := NewWriter(cw, cfg.Ifname, LinkTypeEthernet, uint32(cfg.Snaplen))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("capture: audit file: %w", err)
	}
	s.pw = pw
	go s.loop()
	return s, nil
}

// countWriter writes one block per call to the file and counts it; it is
// called with s.mu held (or before the loop starts).
type countWriter struct{ s *Stream }

func (w *countWriter) Write(b []byte) (int, error) {
	n, err := w.s.f.Write(b)
	w.s.written += int64(n)
	return n, err
}

// Add queues a frame (the capture's frame function: it never blocks).
// The Stream keeps r.Data, which it does not modify.
func (s *Stream) Add(r Record) {
	s.mu.Lock()
	if s.closed || s.err != nil {
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.pending = append(s.pending, r)
	s.pbytes += len(r.Data)
	over := s.pbytes > s.cfg.PendingBytes
	first := len(s.pending) == 1
	s.mu.Unlock()
	if first {
		select {
		case s.arm <- struct{}{}:
		default:
		}
	}
	if over {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Write writes TLS key log lines as a Decryption Secrets Block now, ahead
// of the frames held back (the interception's key log writer).
func (s *Stream) Write(lines []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.closed {
		return len(lines), nil // the live export still has them
	}
	if s.full(int64(len(lines)) + 16) {
		return len(lines), nil
	}
	if err := s.pw.WriteSecrets(SecretsTLSKeyLog, lines); err != nil {
		s.err = err
	}
	return len(lines), nil
}

func (s *Stream) full(n int64) bool {
	return s.cfg.MaxBytes > 0 && s.written+n > s.cfg.MaxBytes
}

// loop writes what is held back every Tick while anything is (and at
// once on a kick), and sleeps while nothing is.
func (s *Stream) loop() {
	defer close(s.done)
	t := time.NewTimer(s.cfg.Tick)
	t.Stop()
	defer t.Stop()
	armed := false
	for {
		select {
		case <-s.arm:
			if !armed {
				armed = true
				t.Reset(s.cfg.Tick)
			}
			continue
		case <-t.C:
			armed = false
		case <-s.kick:
		}
		s.mu.Lock()
		closed := s.closed
		s.flush(closed)
		held := len(s.pending) > 0
		s.mu.Unlock()
		if closed {
			return
		}
		// A frame added after this check finds pending non-empty and
		// does not arm: arm for it here.
		if held && !armed {
			armed = true
			t.Reset(s.cfg.Tick)
		}
	}
}

// flush writes the frames at the head of the queue whose verdict is
// final, that waited Delay, or that exceed the pending bound; all of them
// when force is set. Called with s.mu held.
func (s *Stream) flush(force bool) {
	now := time.Now()
	i := 0
	for ; i < len(s.pending); i++ {
		r := s.pending[i]
		var a Annotation
		if s.cfg.Annotate != nil {
			a = s.cfg.Annotate(r)
		}
		if !force && !a.Final && now.Sub(r.Time) < s.cfg.Delay && s.pbytes <= s.cfg.PendingBytes {
			break
		}
		s.pbytes -= len(r.Data)
		s.pending[i] = Record{}
		if s.err != nil || s.full(int64(len(r.Data))+64+int64(len(a.Reason))) {
			s.dropped++
			continue
		}
		if err := s.pw.WritePacket(r.Time, r.Data, r.OrigLen, r.Dir, a); err != nil {
			s.err = err
			s.dropped++
			continue
		}
		s.frames++
	}
	s.pending = s.pending[i:]
	if len(s.pending) == 0 {
		s.pending = nil
	}
}

// Stats returns the Stream's counts.
func (s *Stream) Stats() StreamStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return StreamStats{Frames: s.frames, Dropped: s.dropped, Bytes: s.written}
}

// Close writes the frames still held back with their annotations as they
// are now, and closes the file.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
	<-s.done
	s.mu.Lock()
	werr := s.err
	s.mu.Unlock()
	return errors.Join(werr, s.f.Close())
}
