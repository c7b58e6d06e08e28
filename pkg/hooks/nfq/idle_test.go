package nfq

import (
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// armedTimers returns each worker's tick delay (0: no tick to come) and
// how many flows it and its parser remember.
func (h *harness) armedTimers() (armed []time.Duration, flows int) {
	for _, w := range h.c.workers {
		w.mu.Lock()
		armed = append(armed, w.armed)
		flows += len(w.flows) + w.parser.Flows()
		w.mu.Unlock()
	}
	return armed, flows
}

// TestCoreIdleWorkersSleep: a worker ticks only while it has something to
// expire: none before the first packet; at tickEvery while a request is
// held; until its flows are idle once released; then none again.
func TestCoreIdleWorkersSleep(t *testing.T) {
	release := make(chan struct{})
	hold := newDecider(func(Meta, decide.Event) Outcome {
		<-release
		return Outcome{Verdict: Release}
	})
	h := newHarness(t, hold, func(c *Config) { c.Parser.FlowIdle = 400 * time.Millisecond })
	if armed, _ := h.armedTimers(); armed[0] != 0 || armed[1] != 0 {
		t.Fatalf("ticks armed before any packet: %v", armed)
	}
	c := h.dial(cli4, srv4, 40100, 80)
	p := c.write(reqHead + "\r\n")
	h.pending(p)
	armed, _ := h.armedTimers()
	if armed[0] != tickEvery && armed[1] != tickEvery {
		t.Fatalf("a request is held and no worker ticks at %s: %v", tickEvery, armed)
	}
	close(release)
	h.want(p, true)
	deadline := time.Now().Add(10 * time.Second)
	for {
		armed, flows := h.armedTimers()
		if flows == 0 && armed[0] == 0 && armed[1] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the request was released: %d flows remembered, ticks armed %v; want none", flows, armed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Woken again by a packet: a new request is decided as before.
	c2 := h.dial(cli4, srv4, 40101, 80)
	h.want(c2.write(reqHead+"\r\n"), true)
}
