package nfq

import (
	"context"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/benchstat"
	"github.com/carbd/carbd/pkg/decide"
)

// chanSink signals every verdict.
type chanSink struct{ ch chan uint32 }

func (s chanSink) verdict(p *packet, accept bool) error { s.ch <- p.id; return nil }
func (s chanSink) rst(rstInfo) error                    { return nil }
func (s chanSink) unreachable(unreachInfo) error        { return nil }

// BenchmarkCoreRequest measures the loop's own work for one new TCP flow
// with one request (SYN, then the request decided and released), with no
// kernel: dispatch, parse, decide on the decision pool, verdicts. It is
// the userspace part of BenchmarkFirstPacketLatency's added latency.
func BenchmarkCoreRequest(b *testing.B) {
	dec := DeciderFunc(func(context.Context, Meta, decide.Event) Outcome { return Outcome{Verdict: Release} })
	cfg, err := Config{QueueNum: 1, MaxQueueLen: 1024, Decider: dec}.withDefaults(2)
	if err != nil {
		b.Fatal(err)
	}
	out := chanSink{ch: make(chan uint32, 16)}
	c := newCore(cfg, out)
	c.start()
	defer c.stop()
	req := []byte("GET /x HTTP/1.1\r\nHost: a.test\r\n\r\n")
	syns := make([][]byte, 1024)
	datas := make([][]byte, 1024)
	for i := range syns {
		port := uint16(10000 + i)
		syns[i] = tcpPkt(b, tcpSeg{src: cli4, dst: srv4, sport: port, dport: 80, seq: 1000, syn: true})
		datas[i] = tcpPkt(b, tcpSeg{src: cli4, dst: srv4, sport: port, dport: 80, seq: 1001, ack: 1, payload: req})
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i % len(syns)
		t0 := time.Now()
		c.dispatch(&packet{id: uint32(2 * i), data: syns[k], time: t0})
		<-out.ch
		c.dispatch(&packet{id: uint32(2*i + 1), data: datas[k], time: time.Now()})
		<-out.ch
		lat = append(lat, time.Since(t0))
		if k == len(syns)-1 {
			b.StopTimer()
			c.stop() // forget the flows: the ports are reused
			c = newCore(cfg, out)
			c.start()
			b.StartTimer()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(benchstat.Median(lat).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(benchstat.Quantile(lat, .99).Nanoseconds())/1e3, "p99-µs")
}
