package nfq

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/benchstat"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
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

// releaseNow releases every effect at once: an InlineDecider, as a
// policy-only decision is.
type releaseNow struct{}

func (releaseNow) Decide(context.Context, Meta, decide.Event) Outcome {
	return Outcome{Verdict: Release}
}
func (releaseNow) DecideNow(Meta, decide.Event) (Outcome, bool) {
	return Outcome{Verdict: Release}, true
}

// hopNames are the stages of BenchmarkFirstPacketHops' table: the
// round trip, then stages 1-15, which follow each other and add up to
// it, then the loop's part of them.
var hopNames = []string{
	"round trip (connect, request, response)",
	"client's connect → SYN's kernel stamp",
	"SYN: kernel stamp → netlink read", "SYN: read → worker", "SYN: worker → verdict (parse, fast path)",
	"SYN: verdict write (with the packet's way on)",
	"SYN written → request's kernel stamp (handshake, client's write)",
	"request: kernel stamp → netlink read", "request: read → worker", "request: worker → submit (parse)",
	"request: submit → Decide starts", "request: Decide", "request: Decide returns → worker",
	"request: worker → verdict (settle, fast path)", "request: verdict write (with the packet's way on)",
	"request written → response read",
	"loop (SYN and request, kernel stamp → verdict written)",
}

const (
	firstStage, lastStage = 1, 15 // the stages that add up to the round trip
	loopHop               = 16
)

// hopVariant is one way of running the loop in BenchmarkFirstPacketHops.
type hopVariant struct {
	name string
	topo *tcxtest.Topology
	addr netip.AddrPort
	mu   sync.Mutex
	tms  []Timing
	cl   []clientStamps
	hops [][]time.Duration // by hopNames
	// slowest: in the slowest 1 % of round trips, how often each stage
	// was the longest.
	slowest map[int]int
}

// BenchmarkFirstPacketHops breaks the first-packet latency of a decided
// flow down by stage: thousands of round trips from the guest (connect,
// request, response) with carbd releasing every request, Config.Timing
// noting each queued packet's stages (the kernel's receive stamp, the
// netlink read, the worker, the decision pool, the verdict write), and
// the client noting its own; beside them the runtime's scheduling
// latencies and GC pauses over the same time. Four topologies take
// turns round trip by round trip, in a random order each round, so that
// all sample the same moments of a loaded machine: without carbd
// (base), carbd with every packet handed to its worker and every
// decision to the pool (hand-off: the loop before its inline paths),
// carbd as it runs now with a Decider that may block (inline: packets
// handled on the receive goroutine when their worker is idle; carbd
// run's case), and with an InlineDecider (inline+now: the decision
// too). It logs the table of docs/verdict-loop.md, "Where the
// first-packet latency goes", and, for the slowest 1 % of round trips,
// which stage took longest.
func BenchmarkFirstPacketHops(b *testing.B) {
	testutil.RequireRoot(b)
	kernelTimestamps(b)
	vs := []*hopVariant{{name: "base"}, {name: "hand-off"}, {name: "inline"}, {name: "inline+now"}}
	for i, v := range vs {
		v.topo = tcxtest.New(b)
		v.addr = netip.AddrPortFrom(v.topo.World4, 8210)
		rrServer(b, v.topo.World, v.addr)
		timing := func(t Timing) {
			if t.Flow.DstPort == v.addr.Port() {
				v.mu.Lock()
				v.tms = append(v.tms, t)
				v.mu.Unlock()
			}
		}
		switch i {
		case 1:
			carbdUp(b, v.topo, releaseAll, func(c *Config) { c.Timing, c.handOff = timing, true })
		case 2:
			carbdUp(b, v.topo, releaseAll, func(c *Config) { c.Timing = timing })
		case 3:
			carbdUp(b, v.topo, releaseNow{}, func(c *Config) { c.Timing = timing })
		}
	}
	for range 20 { // warm up
		for _, v := range vs {
			timedRoundTrip(b, v.topo.Guest, v.addr)
		}
	}
	for _, v := range vs {
		v.mu.Lock()
		v.tms = v.tms[:0]
		v.mu.Unlock()
	}
	const n = 1000
	m0 := schedSample()
	b.ResetTimer()
	for i := 0; i < max(b.N, 2); i++ {
		for k := 0; k < n; k++ {
			for _, j := range rand.Perm(len(vs)) { // see BenchmarkFirstPacketLatency
				v := vs[j]
				v.cl = append(v.cl, timedRoundTrip(b, v.topo.Guest, v.addr))
			}
		}
	}
	b.StopTimer()
	m1 := schedSample()
	for _, v := range vs {
		if err := v.breakdown(); err != nil {
			b.Fatal(err)
		}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	var tab strings.Builder
	fmt.Fprintf(&tab, "%d round trips each\n| stage, µs p50 / p99 |", len(vs[0].cl))
	for _, v := range vs {
		fmt.Fprintf(&tab, " %s |", v.name)
	}
	tab.WriteString("\n|---|" + strings.Repeat("---|", len(vs)) + "\n")
	for h, name := range hopNames {
		fmt.Fprintf(&tab, "| %s |", name)
		for _, v := range vs {
			if d := v.hops[h]; len(d) > 0 {
				fmt.Fprintf(&tab, " %.1f / %.1f |", us(benchstat.Median(d)), us(benchstat.Quantile(d, .99)))
			} else {
				tab.WriteString(" |")
			}
		}
		tab.WriteString("\n")
	}
	for _, v := range vs[1:] {
		fmt.Fprintf(&tab, "%s, slowest 1 %% of round trips, the stage that took longest:", v.name)
		for i := firstStage; i <= lastStage; i++ {
			if k := v.slowest[i]; k > 0 {
				fmt.Fprintf(&tab, " %s ×%d;", hopNames[i], k)
			}
		}
		tab.WriteString("\n")
	}
	lat0, lat1 := m0[0].Value.Float64Histogram(), m1[0].Value.Float64Histogram()
	l50, nl := histDelta(lat0, lat1, .5)
	l99, _ := histDelta(lat0, lat1, .99)
	p0, p1 := m0[1].Value.Float64Histogram(), m1[1].Value.Float64Histogram()
	g50, ng := histDelta(p0, p1, .5)
	g99, _ := histDelta(p0, p1, .99)
	fmt.Fprintf(&tab, "runtime (the whole process: loops, clients, servers): %d goroutine wake-ups, runnable → running p50 ≤ %.1f µs, p99 ≤ %.1f µs; %d GC cycles, %d stop-the-world pauses p50 ≤ %.1f µs, p99 ≤ %.1f µs\n",
		nl, us(l50), us(l99), m1[2].Value.Uint64()-m0[2].Value.Uint64(), ng, us(g50), us(g99))
	b.Log("\n" + tab.String())
	base := vs[0].hops[0]
	for _, v := range vs[1:] {
		b.ReportMetric(us(benchstat.Median(v.hops[0])-benchstat.Median(base)), v.name+"-added-p50-µs")
		b.ReportMetric(us(benchstat.Quantile(v.hops[0], .99)-benchstat.Quantile(base, .99)), v.name+"-added-p99-µs")
	}
}

// breakdown matches the loop's timings with the client's round trips by
// the client's port and fills v.hops and v.slowest.
func (v *hopVariant) breakdown() error {
	v.hops = make([][]time.Duration, len(hopNames))
	for _, s := range v.cl {
		v.hops[0] = append(v.hops[0], s.done.Sub(s.start))
	}
	if len(v.tms) == 0 { // base: no loop
		return nil
	}
	// By the client's port and the time: ports come round again in a
	// long run.
	syn, req := map[uint16][]Timing{}, map[uint16][]Timing{}
	for _, t := range v.tms {
		switch {
		case t.TCPFlags&tcpSYN != 0:
			syn[t.Flow.SrcPort] = append(syn[t.Flow.SrcPort], t)
		case t.Payload > 0:
			req[t.Flow.SrcPort] = append(req[t.Flow.SrcPort], t)
		}
	}
	during := func(ts []Timing, s clientStamps) (Timing, bool) {
		for _, t := range ts {
			if !t.Read.Before(s.start) && !t.Read.After(s.done) {
				return t, true
			}
		}
		return Timing{}, false
	}
	var rows [][]time.Duration // one per matched round trip, by hopNames
	missing := 0
	for _, s := range v.cl {
		y, ok1 := during(syn[s.port], s)
		r, ok2 := during(req[s.port], s)
		if !ok1 || !ok2 || y.Kernel.IsZero() || r.Kernel.IsZero() {
			missing++
			continue
		}
		// The stages' boundaries, in order: each stage is the time
		// between two neighbours.
		at := []time.Time{s.start, y.Kernel, y.Read, y.Worker, y.Verdict, y.Written,
			r.Kernel, r.Read, r.Worker, r.Submit, r.DecideStart, r.DecideEnd, r.Result, r.Verdict, r.Written, s.done}
		row := make([]time.Duration, len(hopNames))
		row[0] = s.done.Sub(s.start)
		for i := firstStage; i <= lastStage; i++ {
			row[i] = at[i].Sub(at[i-1])
		}
		row[loopHop] = y.Written.Sub(y.Kernel) + r.Written.Sub(r.Kernel)
		rows = append(rows, row)
		for i := firstStage; i < len(row); i++ {
			v.hops[i] = append(v.hops[i], row[i])
		}
	}
	if missing > len(v.cl)/10 {
		return fmt.Errorf("%s: %d of %d round trips without both timings (kernel stamps: %v)", v.name, missing, len(v.cl), len(v.tms) > 0 && !v.tms[0].Kernel.IsZero())
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i][0] > rows[j][0] })
	v.slowest = map[int]int{}
	for _, row := range rows[:max(1, len(rows)/100)] {
		longest := firstStage
		for i := firstStage; i <= lastStage; i++ {
			if row[i] > row[longest] {
				longest = i
			}
		}
		v.slowest[longest]++
	}
	return nil
}
