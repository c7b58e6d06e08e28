package nfq

import (
	"sync"
	"testing"
	"time"
)

// TestCoreTiming: with Config.Timing every packet's stages come once, in
// order; the request's carry the decision's, the SYN's none.
func TestCoreTiming(t *testing.T) {
	var mu sync.Mutex
	got := map[uint32]Timing{}
	h := newHarness(t, always(Release), func(c *Config) {
		c.Timing = func(tm Timing) {
			mu.Lock()
			defer mu.Unlock()
			if _, dup := got[tm.ID]; dup {
				t.Errorf("packet %d timed twice", tm.ID)
			}
			got[tm.ID] = tm
		}
	})
	c := h.dial(cli4, srv4, 40100, 80)
	req := c.write(reqHead + "\r\n")
	h.want(req, true)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d timings, want 2", len(got))
	}
	ordered := func(id uint32, ts ...time.Time) {
		t.Helper()
		for i := 1; i < len(ts); i++ {
			if ts[i].IsZero() || ts[i].Before(ts[i-1]) {
				t.Errorf("packet %d: stage %d at %v, before stage %d at %v", id, i, ts[i], i-1, ts[i-1])
			}
		}
	}
	for id, tm := range got {
		if !tm.Accept || tm.Flow.SrcPort != 40100 {
			t.Errorf("packet %d: %+v", id, tm)
		}
		if id == req {
			if tm.Payload == 0 || tm.Reason != AcceptReleased {
				t.Errorf("request: payload %d reason %v", tm.Payload, tm.Reason)
			}
			ordered(id, tm.Read, tm.Worker, tm.Submit, tm.DecideStart, tm.DecideEnd, tm.Result, tm.Verdict, tm.Written)
			continue
		}
		if tm.TCPFlags&tcpSYN == 0 || tm.Reason != AcceptControl || !tm.Submit.IsZero() || !tm.DecideStart.IsZero() {
			t.Errorf("SYN: %+v", tm)
		}
		ordered(id, tm.Read, tm.Worker, tm.Verdict, tm.Written)
	}
}
