package nfq

import (
	"fmt"
	"net"
	"net/netip"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// clientStamps is one timed round trip of the guest's client.
type clientStamps struct {
	port                    uint16 // its local port
	start, conn, sent, done time.Time
}

// timedRoundTrip connects from ns, sends a request and reads the
// response, noting when each step ended.
func timedRoundTrip(tb testing.TB, ns string, addr netip.AddrPort) clientStamps {
	req := []byte("GET /latency HTTP/1.1\r\nHost: bench.test\r\n\r\n")
	var s clientStamps
	err := tcxtest.Do(ns, func() error {
		buf := make([]byte, 256)
		s.start = time.Now()
		c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		s.conn = time.Now()
		s.port = uint16(c.LocalAddr().(*net.TCPAddr).Port)
		if _, err := c.Write(req); err != nil {
			return err
		}
		s.sent = time.Now()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := 0
		for got < 40 {
			k, err := c.Read(buf)
			got += k
			if err != nil {
				break
			}
		}
		s.done = time.Now()
		if got < 40 {
			return fmt.Errorf("%d bytes of response", got)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// kernelTimestamps makes the kernel stamp received packets (a socket
// with SO_TIMESTAMP turns the machine-wide stamping on while it is
// open), so that the queue's messages carry NFQA_TIMESTAMP.
func kernelTimestamps(tb testing.TB) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMP, 1); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
}

// schedSample reads the runtime's scheduling latency (time goroutines
// spent runnable before running) and stop-the-world GC pause histograms.
func schedSample() []metrics.Sample {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/pauses/total/gc:seconds"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s
}

// histDelta returns the quantile q of the samples b added to a (both
// cumulative histograms of the same buckets), as the upper bound of the
// bucket it falls in, and their count.
func histDelta(a, b *metrics.Float64Histogram, q float64) (time.Duration, uint64) {
	var n uint64
	for i := range b.Counts {
		n += b.Counts[i] - a.Counts[i]
	}
	if n == 0 {
		return 0, 0
	}
	want := uint64(q * float64(n))
	var acc uint64
	for i := range b.Counts {
		acc += b.Counts[i] - a.Counts[i]
		if acc > want {
			return time.Duration(b.Buckets[i+1] * 1e9), n
		}
	}
	return 0, n
}

// hop is one stage of the breakdown: a name and its durations.
type hop struct {
	name string
	d    []time.Duration
}

// BenchmarkFirstPacketHops breaks the first-packet latency of a decided
// flow down by stage: thousands of round trips from the guest (connect,
// request, response) with carbd releasing every request, Config.Timing
// noting each queued packet's stages (the kernel's receive stamp, the
// netlink read, the worker, the decision pool, the verdict write), and
// the client noting its own; beside them the runtime's scheduling
// latencies and GC pauses over the same time. The round trips without
// carbd run in turns with them, on a second topology, as in
// BenchmarkFirstPacketLatency, for the added latency. It logs the table
// of docs/verdict-loop.md, "Where the first-packet latency goes".
func BenchmarkFirstPacketHops(b *testing.B) {
	testutil.RequireRoot(b)
	kernelTimestamps(b)
	with, without := tcxtest.New(b), tcxtest.New(b)
	addrWith := netip.AddrPortFrom(with.World4, 8210)
	addrWithout := netip.AddrPortFrom(without.World4, 8210)
	rrServer(b, with.World, addrWith)
	rrServer(b, without.World, addrWithout)
	var mu sync.Mutex
	var tms []Timing
	c := carbdUp(b, with, releaseAll, func(cfg *Config) {
		cfg.Timing = func(t Timing) { mu.Lock(); tms = append(tms, t); mu.Unlock() }
	})
	const n = 1000
	for i := 0; i < 20; i++ { // warm up
		timedRoundTrip(b, without.Guest, addrWithout)
		timedRoundTrip(b, with.Guest, addrWith)
	}
	mu.Lock()
	tms = tms[:0]
	mu.Unlock()
	var base, cl []clientStamps
	m0 := schedSample()
	b.ResetTimer()
	for i := 0; i < max(b.N, 2); i++ {
		for k := 0; k < n; k++ {
			if k%2 == 0 {
				base = append(base, timedRoundTrip(b, without.Guest, addrWithout))
				cl = append(cl, timedRoundTrip(b, with.Guest, addrWith))
			} else {
				cl = append(cl, timedRoundTrip(b, with.Guest, addrWith))
				base = append(base, timedRoundTrip(b, without.Guest, addrWithout))
			}
		}
	}
	b.StopTimer()
	m1 := schedSample()
	c.down()

	syn, req := map[uint16]Timing{}, map[uint16]Timing{}
	mu.Lock()
	for _, t := range tms {
		switch {
		case t.Flow.DstPort != addrWith.Port():
		case t.TCPFlags&tcpSYN != 0:
			syn[t.Flow.SrcPort] = t
		case t.Payload > 0:
			req[t.Flow.SrcPort] = t
		}
	}
	mu.Unlock()
	hops := []*hop{
		{name: "round trip without carbd"}, {name: "round trip with carbd"},
		{name: "SYN: kernel stamp → netlink read"}, {name: "SYN: read → worker"}, {name: "SYN: worker → verdict (parse, fast path)"},
		{name: "SYN: verdict write"}, {name: "SYN: kernel stamp → verdict written"},
		{name: "SYN written → request's kernel stamp"},
		{name: "request: kernel stamp → netlink read"}, {name: "request: read → worker"}, {name: "request: worker → submit (parse)"},
		{name: "request: submit → Decide starts"}, {name: "request: Decide"}, {name: "request: Decide returns → worker"},
		{name: "request: worker → verdict (settle, fast path)"}, {name: "request: verdict write"},
		{name: "request: kernel stamp → verdict written"},
		{name: "loop total (SYN + request, stamp → written)"},
		{name: "request written → response read"},
	}
	add := func(i int, from, to time.Time) {
		if !from.IsZero() && !to.IsZero() {
			hops[i].d = append(hops[i].d, to.Sub(from))
		}
	}
	for _, s := range base {
		add(0, s.start, s.done)
	}
	missing := 0
	for _, s := range cl {
		add(1, s.start, s.done)
		y, ok1 := syn[s.port]
		r, ok2 := req[s.port]
		if !ok1 || !ok2 || y.Kernel.IsZero() || r.Kernel.IsZero() {
			missing++
			continue
		}
		add(2, y.Kernel, y.Read)
		add(3, y.Read, y.Worker)
		add(4, y.Worker, y.Verdict)
		add(5, y.Verdict, y.Written)
		add(6, y.Kernel, y.Written)
		add(7, y.Written, r.Kernel)
		add(8, r.Kernel, r.Read)
		add(9, r.Read, r.Worker)
		if !r.Submit.IsZero() {
			add(10, r.Worker, r.Submit)
			add(11, r.Submit, r.DecideStart)
			add(13, r.DecideEnd, r.Result)
			add(14, r.Result, r.Verdict)
		} else { // decided inline on the worker
			add(10, r.Worker, r.DecideStart)
			add(14, r.DecideEnd, r.Verdict)
		}
		add(12, r.DecideStart, r.DecideEnd)
		add(15, r.Verdict, r.Written)
		add(16, r.Kernel, r.Written)
		hops[17].d = append(hops[17].d, y.Written.Sub(y.Kernel)+r.Written.Sub(r.Kernel))
		add(18, s.sent, s.done)
	}
	if missing > len(cl)/10 {
		b.Fatalf("%d of %d round trips without both timings (kernel stamps: %v)", missing, len(cl), len(tms) > 0 && !tms[0].Kernel.IsZero())
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	var tab strings.Builder
	fmt.Fprintf(&tab, "%d round trips each (%d without both timings)\n| stage | p50 µs | p90 µs | p99 µs |\n|---|---|---|---|\n", len(cl), missing)
	for _, h := range hops {
		if len(h.d) == 0 {
			continue
		}
		slices.Sort(h.d)
		q := func(x float64) time.Duration { return h.d[min(len(h.d)-1, int(x*float64(len(h.d))))] }
		fmt.Fprintf(&tab, "| %s | %.1f | %.1f | %.1f |\n", h.name, us(q(.5)), us(q(.9)), us(q(.99)))
	}
	lat0, lat1 := m0[0].Value.Float64Histogram(), m1[0].Value.Float64Histogram()
	l50, nl := histDelta(lat0, lat1, .5)
	l99, _ := histDelta(lat0, lat1, .99)
	p0, p1 := m0[1].Value.Float64Histogram(), m1[1].Value.Float64Histogram()
	g50, ng := histDelta(p0, p1, .5)
	g99, _ := histDelta(p0, p1, .99)
	fmt.Fprintf(&tab, "runtime: %d goroutine wake-ups, runnable→running p50 ≤ %.1f µs, p99 ≤ %.1f µs; %d GC cycles, %d stop-the-world pauses p50 ≤ %.1f µs, p99 ≤ %.1f µs\n",
		nl, us(l50), us(l99), m1[2].Value.Uint64()-m0[2].Value.Uint64(), ng, us(g50), us(g99))
	b.Log("\n" + tab.String())
	b.ReportMetric(us(quantile(hops[1].d, .5)-quantile(hops[0].d, .5)), "added-p50-µs")
	b.ReportMetric(us(quantile(hops[1].d, .99)-quantile(hops[0].d, .99)), "added-p99-µs")
	b.ReportMetric(us(quantile(hops[17].d, .5)), "loop-p50-µs")
	b.ReportMetric(us(quantile(hops[17].d, .99)), "loop-p99-µs")
}
