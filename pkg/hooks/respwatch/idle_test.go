package respwatch

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTrackerNextFlush: Flush is due every flushEvery while a response
// may still be reported for want of more bytes (PendingTimeout), then only
// when the flow is idle for FlowIdle, then never; and what each of those
// flushes does still happens.
func TestTrackerNextFlush(t *testing.T) {
	tr := newTracker(t, Config{})
	cfg := tr.Config()
	if d := tr.nextFlush(clock); d != 0 {
		t.Fatalf("no flow: next flush in %s, want none", d)
	}
	c := newConn(t, guest, server)
	// A response whose body stops short: reported, incomplete, once it
	// has received nothing for PendingTimeout.
	resp := "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"
	if evs := feedAll(t, tr, cat(c.handshake(), one(c.send(get("/a", "a.test"))), c.reply(resp, 1400), one(c.ack()))); len(evs) != 0 {
		t.Fatalf("events before the pending timeout: %v", summarize(evs))
	}
	clockMu.Lock()
	last := clock
	clockMu.Unlock()
	if d := tr.nextFlush(last); d != flushEvery {
		t.Fatalf("a response in progress: next flush in %s, want %s", d, flushEvery)
	}
	at := last.Add(cfg.PendingTimeout)
	if d := tr.nextFlush(at); d != flushEvery {
		t.Fatalf("at the pending timeout: next flush in %s, want %s", d, flushEvery)
	}
	res := tr.Flush(at)
	if len(res.Events) != 1 {
		t.Fatalf("flush at the pending timeout: %d events, want the incomplete response", len(res.Events))
	}
	at = last.Add(cfg.PendingTimeout + flushEvery)
	want := cfg.FlowIdle - cfg.PendingTimeout - flushEvery
	if d := tr.nextFlush(at); d != want {
		t.Fatalf("the response reported, the flow idle: next flush in %s, want %s (its FlowIdle)", d, want)
	}
	tr.Flush(at.Add(want))
	if s := tr.Stats(); s.Flows != 0 || tr.req.Flows() != 0 {
		t.Fatalf("after FlowIdle: %d flows, %d in the request parser; want none", s.Flows, tr.req.Flows())
	}
	if d := tr.nextFlush(at.Add(want)); d != 0 {
		t.Fatalf("no flow left: next flush in %s, want none", d)
	}
}

// TestWatcherIdleAfterFlows: with no frame to wake it, a watcher still
// forgets its flows and marks once they are idle for FlowIdle (its
// flushes come at their deadlines).
func TestWatcherIdleAfterFlows(t *testing.T) {
	w, err := New(Config{FlowIdle: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rec recorder
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, rec.emit) }()
	c := newConn(t, guest, server)
	for _, f := range cat(c.handshake(), one(c.send(get("/a", "a.test")))) {
		w.Frame(time.Now(), f.data, f.dir)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	for {
		err := w.WaitSeen(wctx, netipAP(guest), netipAP(server), c.cseq-1)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrNotRunning) {
			t.Fatalf("WaitSeen: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // Run has not started yet
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		marks := len(w.seen)
		w.mu.Unlock()
		flows := w.Stats().Flows
		if marks == 0 && flows == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the last frame: %d flows, %d marks; want none (FlowIdle 300 ms)", flows, marks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
