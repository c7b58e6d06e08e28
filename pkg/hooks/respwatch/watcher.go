package respwatch

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
)

// ErrNotRunning is returned by WaitSeen when Run is not running.
var ErrNotRunning = errors.New("respwatch: watcher not running")

// flushEvery is how often Run calls Tracker.Flush while frames arrive
// and for PendingTimeout after the last one (see Tracker.nextFlush);
// after that Run flushes only when an idle flow or mark is due to be
// forgotten, and not at all once none is left.
const flushEvery = 100 * time.Millisecond

type frame struct {
	t    time.Time
	data []byte
	dir  capture.Direction
}

// mark is the guest's progress on one flow as the watcher processed it.
type mark struct {
	end uint32
	at  time.Time
}

// Watcher runs a Tracker on its own goroutine behind a bounded queue, so
// the capture that feeds it never blocks: a frame that finds the queue
// full is dropped and counted (Stats.Dropped). What a dropped frame
// carried is not lost silently: once the guest acknowledges the bytes,
// the response they belonged to is reported opaque (ErrLost).
type Watcher struct {
	tr      *Tracker
	q       chan frame
	dropped atomic.Uint64

	mu      sync.Mutex // guards everything below
	running bool
	stats   Stats
	seen    map[flowKey]mark
	waiters int
	tick    chan struct{} // closed when seen changes and waiters > 0
}

// New returns a watcher; zero Config fields take their defaults.
func New(cfg Config) (*Watcher, error) {
	tr, err := NewTracker(cfg)
	if err != nil {
		return nil, err
	}
	return &Watcher{tr: tr, q: make(chan frame, tr.cfg.QueueLen), seen: map[flowKey]mark{}, tick: make(chan struct{})}, nil
}

// Frame queues one captured frame (Ethernet, as seen on the host side of
// the sandbox's interface) with its direction. It never blocks: it
// returns false, and counts the frame as dropped, when the queue is
// full. data must not be modified afterwards.
func (w *Watcher) Frame(ts time.Time, data []byte, dir capture.Direction) bool {
	select {
	case w.q <- frame{t: ts, data: data, dir: dir}:
		return true
	default:
		w.dropped.Add(1)
		return false
	}
}

// Record queues a captured frame; pass it to capture.WithFrameFunc.
func (w *Watcher) Record(r capture.Record) { w.Frame(r.Time, r.Data, r.Dir) }

// Run processes the queued frames until ctx ends, calling emit with every
// incoming event, in the order the frames arrived, on Run's goroutine.
// emit may block (the engine's lock): frames queue up meanwhile, and
// drop once QueueLen are waiting. When ctx ends, the responses in
// progress are reported as they are and Run returns nil.
func (w *Watcher) Run(ctx context.Context, emit func(decide.Event)) error {
	w.mu.Lock()
	if w.running {
		w.mu.Unlock()
		return errors.New("respwatch: Run called twice")
	}
	w.running = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.running = false
		w.wakeLocked()
		w.mu.Unlock()
	}()
	timer := time.NewTimer(flushEvery)
	armed := flushEvery // the delay timer was last set to; 0: stopped
	defer timer.Stop()
	lastPrune := time.Now()
	for {
		select {
		case <-ctx.Done():
			w.deliver(w.tr.Close(time.Now()), emit)
			w.mu.Lock()
			w.stats = w.tr.Stats()
			w.mu.Unlock()
			return nil
		case fr := <-w.q:
			w.deliver(w.tr.Feed(fr.t, fr.data, fr.dir), emit)
			if armed != flushEvery {
				armed = flushEvery
				timer.Reset(flushEvery)
			}
		case now := <-timer.C:
			w.deliver(w.tr.Flush(now), emit)
			w.mu.Lock()
			w.stats = w.tr.Stats()
			w.mu.Unlock()
			d := w.tr.nextFlush(now)
			if d != flushEvery || now.Sub(lastPrune) >= 10*time.Second {
				w.prune(now)
				lastPrune = now
			}
			armed = w.nextFlush(now, d)
			if armed > 0 {
				timer.Reset(armed)
			}
		}
	}
}

// deliver emits a result's events, then records the guest's progress, so
// that WaitSeen returns only once the events before it were emitted.
func (w *Watcher) deliver(res *Result, emit func(decide.Event)) {
	for i := range res.Events {
		emit(res.Events[i])
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if res.Egress {
		k := flowKey{res.Client, res.Server}
		if _, ok := w.seen[k]; !ok && len(w.seen) >= 4*w.tr.cfg.MaxFlows {
			// Bound the map: forget some connections (a WaitSeen on one
			// of them waits until its deadline).
			n := 0
			for old := range w.seen {
				delete(w.seen, old)
				if n++; n >= w.tr.cfg.MaxFlows {
					break
				}
			}
		}
		if m, ok := w.seen[k]; !ok || seqGT(res.SeqEnd, m.end) {
			w.seen[k] = mark{end: res.SeqEnd, at: time.Now()}
		} else {
			m.at = time.Now()
			w.seen[k] = m
		}
		w.wakeLocked()
	}
}

func (w *Watcher) wakeLocked() {
	if w.waiters > 0 {
		close(w.tick)
		w.tick = make(chan struct{})
	}
}

// nextFlush is the delay before Run's next flush, 0 for none until a
// frame arrives: the tracker's, d (Tracker.nextFlush), or the first
// mark's FlowIdle deadline (prune has just run).
func (w *Watcher) nextFlush(now time.Time, d time.Duration) time.Duration {
	if d == flushEvery {
		return d
	}
	idle := w.tr.cfg.FlowIdle
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.seen {
		if dm := max(m.at.Add(idle).Sub(now), flushEvery); d == 0 || dm < d {
			d = dm
		}
	}
	return d
}

func (w *Watcher) prune(now time.Time) {
	idle := w.tr.cfg.FlowIdle
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, m := range w.seen {
		if now.Sub(m.at) >= idle {
			delete(w.seen, k)
		}
	}
}

// WaitSeen waits until the watcher has processed the guest's TCP segment
// of client -> server that carries sequence number seq (and so every
// frame captured before it), and has emitted the events those frames
// completed. The daemon calls it before deciding a request, with the
// request's first sequence number and a short deadline, so that a
// response the agent read before sending the request is observed before
// the request is decided. It returns ctx's error when the deadline passes
// first (the segment's frame may have been dropped), ErrNotRunning when
// Run is not running.
func (w *Watcher) WaitSeen(ctx context.Context, client, server netip.AddrPort, seq uint32) error {
	k := flowKey{client, server}
	w.mu.Lock()
	w.waiters++
	defer func() {
		w.mu.Lock()
		w.waiters--
		w.mu.Unlock()
	}()
	for {
		m, ok := w.seen[k]
		running, tick := w.running, w.tick
		w.mu.Unlock()
		if ok && seqGT(m.end, seq) {
			return nil
		}
		if !running {
			return ErrNotRunning
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
		}
		w.mu.Lock()
	}
}

// Stats returns the counters (refreshed by Run every 100 ms while frames
// arrive, and after the last).
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	s := w.stats
	w.mu.Unlock()
	s.Dropped = w.dropped.Load()
	return s
}
