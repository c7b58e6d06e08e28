package respwatch

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
)

// recorder collects emitted events.
type recorder struct {
	mu  sync.Mutex
	evs []decide.Event
}

func (r *recorder) emit(ev decide.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

func (r *recorder) get() []decide.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]decide.Event(nil), r.evs...)
}

func TestWatcherQueueFullDrops(t *testing.T) {
	w, err := New(Config{QueueLen: 4})
	if err != nil {
		t.Fatal(err)
	}
	c := newConn(t, guest, server)
	accepted := 0
	for i := 0; i < 10; i++ {
		if w.Frame(time.Now(), c.ack().data, capture.Egress) {
			accepted++
		}
	}
	if accepted != 4 || w.Stats().Dropped != 6 {
		t.Fatalf("accepted %d, dropped %d; want 4 and 6", accepted, w.Stats().Dropped)
	}
}

// TestWatcherWaitSeen: once WaitSeen returns for a request's segment, the
// response the guest received before sending it has been emitted.
func TestWatcherWaitSeen(t *testing.T) {
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSeen(context.Background(), netipAP(guest), netipAP(server), 1); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("WaitSeen before Run: %v", err)
	}
	var rec recorder
	slow := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, func(ev decide.Event) {
			<-slow // the engine is busy: emit blocks
			rec.emit(ev)
		})
	}()
	for running := false; !running; {
		w.mu.Lock()
		running = w.running
		w.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	c := newConn(t, guest, server)
	frames := cat(c.handshake(), one(c.send(get("/page", "h.test"))), c.reply(okResponse("a link: http://x.test/next"), 1448), one(c.ack()))
	second := c.cseq
	frames = append(frames, c.send(get("/next", "x.test")))
	for _, f := range frames {
		if !w.Frame(time.Now(), f.data, f.dir) {
			t.Fatal("queue full")
		}
	}
	waited := make(chan error, 1)
	go func() {
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		waited <- w.WaitSeen(wctx, c.cli, c.srv, second)
	}()
	select {
	case err := <-waited:
		t.Fatalf("WaitSeen returned %v while the response was not emitted", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(slow)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if evs := rec.get(); len(evs) != 1 || evs[0].Content != "a link: http://x.test/next" {
		t.Fatalf("when WaitSeen returned: %+v", summarize(evs))
	}
	// A segment that never comes: the deadline ends the wait.
	wctx, wcancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer wcancel()
	if err := w.WaitSeen(wctx, c.cli, c.srv, second+10_000); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitSeen for an unseen segment: %v", err)
	}
	if err := w.Run(context.Background(), rec.emit); err == nil {
		t.Fatal("a second Run was accepted")
	}
	// Stopping reports the response in progress.
	for _, f := range c.reply("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf", 1448) {
		w.Frame(time.Now(), f.data, f.dir)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Frames < uint64(len(frames)+1) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	evs := rec.get()
	if len(evs) != 2 || evs[1].Content != "half" || evs[1].Obj != "http://x.test/next" {
		t.Fatalf("after stop: %+v", summarize(evs))
	}
	if v, _ := field(&evs[1], FieldIncomplete); v != "true" {
		t.Errorf("incomplete field %q", v)
	}
}
