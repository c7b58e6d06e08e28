package nfq

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// askingDecider blocks each Decide until its context ends (an oracle
// waiting for an answer) and reports the context's cause.
type askingDecider struct {
	started chan struct{}
	causes  chan error
}

func (d *askingDecider) Decide(ctx context.Context, _ Meta, _ decide.Event) Outcome {
	d.started <- struct{}{}
	<-ctx.Done()
	d.causes <- context.Cause(ctx)
	return Outcome{Verdict: Refuse, Reason: "withdrawn"}
}

// A decision in progress learns that its client is gone: the guest
// resets the connection, or closes it; a DNS query's client stops
// retransmitting. Its context ends with decide.ErrClientGone and the
// reason; nothing held is accepted.
func TestCoreClientGoneCancelsDecision(t *testing.T) {
	dec := &askingDecider{started: make(chan struct{}, 8), causes: make(chan error, 8)}
	h := newHarness(t, dec, func(c *Config) { c.HoldTimeout = 30 * time.Second; c.DNSClientWindow = 300 * time.Millisecond })
	cause := func(want string) {
		t.Helper()
		select {
		case err := <-dec.causes:
			if !errors.Is(err, decide.ErrClientGone) || !strings.Contains(err.Error(), want) {
				t.Fatalf("cause %v, want ErrClientGone: %s", err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the decision was not told: %s", want)
		}
	}
	// Reset.
	c := h.dial(cli4, srv4, 40101, 80)
	p := c.write(reqHead + "\r\n")
	<-dec.started
	h.send(tcpPkt(t, tcpSeg{src: cli4, dst: srv4, sport: 40101, dport: 80, seq: c.next, ack: c.ack, rst: true}))
	cause("the guest reset the connection")
	h.want(p, false)
	// Close.
	c = h.dial(cli4, srv4, 40102, 80)
	p = c.write(reqHead + "\r\n")
	<-dec.started
	h.send(tcpPkt(t, tcpSeg{src: cli4, dst: srv4, sport: 40102, dport: 80, seq: c.next, ack: c.ack, fin: true}))
	cause("the guest closed the connection")
	h.want(p, false)
	// A DNS query whose client stops retransmitting.
	q := h.send(udpPkt(t, cli4, srv4, 40103, 53, dnsQuery(t, "example.org")))
	<-dec.started
	cause("stopped retransmitting")
	h.want(q, false)
}

// A held effect (a ticket) whose client goes is reported to ClientGone,
// once; its packets stay held until its verdict comes.
func TestCoreClientGoneReportsTicket(t *testing.T) {
	var mu sync.Mutex
	var gone []uint64
	reported := make(chan struct{}, 4)
	dec := newDecider(func(Meta, decide.Event) Outcome { return Outcome{Verdict: Hold, Ticket: 41} })
	h := newHarness(t, dec, func(c *Config) {
		c.ClientGone = func(ticket uint64, reason string) {
			mu.Lock()
			gone = append(gone, ticket)
			mu.Unlock()
			if reason == "the guest closed the connection" {
				reported <- struct{}{}
			}
		}
	})
	c := h.dial(cli4, srv4, 40104, 80)
	p := c.write(reqHead + "\r\n")
	<-dec.calls
	// The ticket is registered by the worker once it has the outcome.
	for i := 0; i < 200 && h.c.stats().Deferred == 0; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	fin := tcpSeg{src: cli4, dst: srv4, sport: 40104, dport: 80, seq: c.next, ack: c.ack, fin: true}
	h.send(tcpPkt(t, fin))
	h.send(tcpPkt(t, fin)) // a retransmitted FIN reports nothing more
	select {
	case <-reported:
	case <-time.After(10 * time.Second):
		t.Fatal("ClientGone was not called")
	}
	h.pending(p)
	h.c.resolve(Resolution{Ticket: 41, Verdict: Refuse})
	h.want(p, false)
	mu.Lock()
	defer mu.Unlock()
	if len(gone) != 1 || gone[0] != 41 {
		t.Errorf("reported %v, want ticket 41 once", gone)
	}
}
