package nfq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// Loop is the NFQUEUE verdict loop of one sandbox: it receives the
// guest's undecided packets from one queue, parses them into effects,
// has each decided, and gives every packet exactly one verdict.
type Loop struct {
	cfg   Config
	c     *core
	ready chan struct{}

	mu      sync.Mutex
	started bool
	readBuf int
}

// New validates cfg and returns a loop; Run starts it.
func New(cfg Config) (*Loop, error) {
	cfg, err := cfg.withDefaults(runtime.GOMAXPROCS(0))
	if err != nil {
		return nil, err
	}
	if _, err := netparse.NewParser(cfg.Parser); err != nil {
		return nil, fmt.Errorf("%w: parser: %w", ErrConfig, err)
	}
	l := &Loop{cfg: cfg, ready: make(chan struct{})}
	l.c = newCore(cfg, nil)
	return l, nil
}

// Ready is closed once the loop is bound to its queue (and is never
// closed when Run fails before that).
func (l *Loop) Ready() <-chan struct{} { return l.ready }

// nfSink sends verdicts and RSTs through the queue's socket.
type nfSink struct {
	nf   *nfqueue.Nfqueue
	rsts *rstSender
	mask uint32
	pass uint32
}

func (s *nfSink) verdict(p *packet, accept bool) error {
	if !accept {
		return s.nf.SetVerdict(p.id, nfqueue.NfDrop)
	}
	// NF_REPEAT runs the hook again with the pass mark: carbd's chain
	// returns the packet to the host's own rules instead of accepting it
	// past them (an xtables NF_ACCEPT would skip the rest of the table).
	return s.nf.SetVerdictWithOption(p.id, nfqueue.NfRepeat, nfqueue.WithMark(p.mark&^s.mask|s.pass))
}

func (s *nfSink) rst(r rstInfo) error {
	if s.rsts == nil {
		return errors.New("nfq: rst sender not open")
	}
	return s.rsts.send(r)
}

func (s *nfSink) unreachable(u unreachInfo) error {
	if s.rsts == nil {
		return errors.New("nfq: rst sender not open")
	}
	return s.rsts.sendUnreachable(u)
}

// Run binds the queue and decides its packets until ctx ends. It returns
// after every packet it received has had its verdict: on cancellation
// every packet still held is dropped, then the queue is unbound (the
// kernel drops whatever arrives after, as no listener means drop). It
// returns nil when ctx ended it, or the error that stopped it. A Loop
// runs once.
func (l *Loop) Run(ctx context.Context) (err error) {
	l.mu.Lock()
	if l.started {
		l.mu.Unlock()
		return errors.New("nfq: loop already ran")
	}
	l.started = true
	l.mu.Unlock()
	cfg := l.cfg

	nsFD := 0
	if cfg.NetNS != "" {
		fd, err := unix.Open(cfg.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("nfq: open netns %s: %w", cfg.NetNS, err)
		}
		defer unix.Close(fd)
		nsFD = fd
	}
	var flags uint32
	if cfg.GSO {
		flags |= nfqueue.NfQaCfgFlagGSO
	}
	// Never nfqueue.NfQaCfgFlagFailOpen: a full queue must drop.
	nf, err := nfqueue.Open(&nfqueue.Config{
		NetNS:        nsFD,
		NfQueue:      cfg.QueueNum,
		MaxQueueLen:  cfg.MaxQueueLen,
		MaxPacketLen: cfg.MaxPacketLen,
		Copymode:     nfqueue.NfQnlCopyPacket,
		Flags:        flags,
		WriteTimeout: cfg.VerdictTimeout,
	})
	if err != nil {
		return fmt.Errorf("nfq: open queue %d: %w", cfg.QueueNum, err)
	}
	defer nf.Close()
	if l.readBuf, err = setReadBuffer(nf, cfg.ReadBuffer); err != nil {
		return fmt.Errorf("nfq: queue %d: %w", cfg.QueueNum, err)
	}
	sk := &nfSink{nf: nf, mask: cfg.MarkMask, pass: cfg.PassMark}
	if !cfg.NoReject {
		if sk.rsts, err = newRSTSender(cfg.NetNS); err != nil {
			return err
		}
		defer sk.rsts.close()
	}
	c := l.c
	c.out = sk
	c.start()
	stopped := false
	defer func() {
		if !stopped {
			c.stop()
		}
	}()

	regCtx, regCancel := context.WithCancel(context.Background())
	defer regCancel()
	fatal := make(chan error, 1)
	hook := func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			c.recvErrs.Add(1)
			return 0
		}
		p := packetFrom(&a)
		if cfg.Timing != nil && a.Timestamp != nil {
			p.tm = &Timing{Kernel: *a.Timestamp}
		}
		c.dispatch(p)
		return 0
	}
	errfn := func(err error) int {
		if regCtx.Err() != nil {
			return 1
		}
		switch {
		case errors.Is(err, unix.ENOBUFS):
			// The socket buffer overflowed: the kernel dropped those
			// packets (counted in user_dropped). Keep going.
			c.overruns.Add(1)
			return 0
		case errors.Is(err, net.ErrClosed), errors.Is(err, unix.EBADF):
			select {
			case fatal <- fmt.Errorf("nfq: queue %d: receive: %w", cfg.QueueNum, err):
			default:
			}
			return 1
		}
		// Errors the kernel reports for verdicts (an unknown packet id)
		// and other transient ones.
		c.recvErrs.Add(1)
		return 0
	}
	if err := nf.RegisterWithErrorFunc(regCtx, hook, errfn); err != nil {
		return fmt.Errorf("nfq: bind queue %d: %w", cfg.QueueNum, err)
	}
	close(l.ready)
	select {
	case <-ctx.Done():
	case err = <-fatal:
		cfg.Logger.Error("nfq: receive stopped: dropping held packets", "queue", cfg.QueueNum, "err", err)
	}
	// Fail closed, in order: drop everything queued and held while the
	// queue is still bound, then unbind.
	c.stop()
	stopped = true
	regCancel()
	return err
}

// packetFrom copies what the loop needs from a queued packet's
// attributes.
func packetFrom(a *nfqueue.Attribute) *packet {
	p := &packet{id: *a.PacketID, time: time.Now()}
	if a.Mark != nil {
		p.mark = *a.Mark
	}
	if a.Payload != nil {
		p.data = *a.Payload
	}
	p.length = len(p.data)
	// NFQA_CAP_LEN is present only when the copy is shorter than the
	// packet.
	if a.CapLen != nil && int(*a.CapLen) > len(p.data) {
		p.truncated = true
	}
	if a.Payload == nil {
		p.truncated = true
	}
	if a.Hook != nil && *a.Hook == unix.NF_INET_LOCAL_IN {
		p.local = true
	}
	if a.InDev != nil {
		p.indev = *a.InDev
	}
	if a.HwAddr != nil && len(*a.HwAddr) >= 6 {
		copy(p.hw[:], *a.HwAddr)
		p.hasHW = true
	}
	if a.SkbInfo != nil && len(*a.SkbInfo) >= 4 {
		// NFQA_SKB_CSUMNOTREADY: a GSO packet queued whole, checksum
		// still to be computed.
		p.csumNotReady = binary.BigEndian.Uint32(*a.SkbInfo)&1 != 0
		// NFQA_SKB_GSO: queued whole as a GSO packet.
		p.gso = binary.BigEndian.Uint32(*a.SkbInfo)&2 != 0
	}
	return p
}

// setReadBuffer sizes the socket's receive buffer (SO_RCVBUFFORCE, past
// net.core.rmem_max, as root; SO_RCVBUF otherwise) and returns what the
// kernel reports (it doubles the request for its bookkeeping).
func setReadBuffer(nf *nfqueue.Nfqueue, n int) (int, error) {
	rc, err := nf.Con.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("receive buffer: %w", err)
	}
	var got int
	var serr error
	err = rc.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, n); e != nil {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n); e != nil {
				serr = fmt.Errorf("set receive buffer to %d: %w", n, e)
				return
			}
		}
		got, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
	})
	if err == nil {
		err = serr
	}
	return got, err
}

// Resolve gives the final verdict of a held effect (Outcome.Ticket). It
// reports whether the ticket named an effect held now; a ticket whose
// effect timed out or whose flow was refused meanwhile is ignored (the
// packets are gone), and one not registered yet is kept for a while.
func (l *Loop) Resolve(ticket uint64, v Verdict, reason string) bool {
	return l.c.resolve(Resolution{Ticket: ticket, Verdict: v, Reason: reason})
}

// RevokeOpen makes every flow that was released to its end (a TLS or
// QUIC connection, an opaque stream) be decided again at its next packet:
// call it when the agent has read new sensitive data since those
// decisions. It returns how many flows were revoked (0 when the loop is
// not running).
func (l *Loop) RevokeOpen() int {
	l.mu.Lock()
	started := l.started
	l.mu.Unlock()
	if !started {
		return 0
	}
	n := 0
	for _, w := range l.c.workers {
		res := make(chan int, 1)
		select {
		case w.ctl <- func() { res <- w.revokeOpen() }:
		case <-w.done:
			continue
		}
		select {
		case k := <-res:
			n += k
		case <-w.done:
		}
	}
	return n
}

// Stats returns the loop's counters and the kernel's view of the queue.
func (l *Loop) Stats() Stats {
	s := l.c.stats()
	s.ReadBuffer = l.readBuf
	q, err := readQueueProc(l.cfg.NetNS, l.cfg.QueueNum)
	if err != nil {
		s.KernelErr = err.Error()
	}
	s.Kernel = q
	return s
}

// Config returns the configuration in use, defaults filled in.
func (l *Loop) Config() Config { return l.cfg }

// ApplyResolution hands the engine's resolution of a scope (from
// Engine.Resolve or Finish: an operator's answer, the end of the task) to
// the loop. It returns how many of its effects the loop was holding.
func (l *Loop) ApplyResolution(r *decide.Resolution) int {
	n := 0
	for _, res := range Resolutions(r) {
		if l.c.resolve(res) {
			n++
		}
	}
	return n
}
