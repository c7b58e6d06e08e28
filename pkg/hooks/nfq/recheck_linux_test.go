package nfq

import (
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// echoWorld serves TCP echo on addr in the world namespace; received
// counts the bytes it got.
func echoWorld(t testing.TB, e *env, addr netip.AddrPort) (received *atomic.Int64) {
	t.Helper()
	received = &atomic.Int64{}
	l := tcxtest.Listen(t, e.topo.World, addr)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						received.Add(int64(n))
						c.Write(buf[:n])
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return received
}

func setGen(t testing.TB, e *env, gen uint64) {
	t.Helper()
	if err := e.dp.ReadGen().Update(uint32(0), gen, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// roundTrip writes msg and reads its echo.
func roundTrip(c net.Conn, msg []byte) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.ReadFull(c, make([]byte, len(msg)))
	return err
}

// TestRecheckOnQueue: on the real TC program and queue, an opaque stream
// released to its end passes on the fast path while the read generation
// stays; after it moved, the stream's next data is queued (queue-read),
// held until the Decider says the release stands (it then arrives, and
// what follows passes on the fast path again), or, when it does not, the
// stream is decided again and refused: its data never reaches the world.
func TestRecheckOnQueue(t *testing.T) {
	e := newEnv(t, envOpt{cfg: func(c *Config) { c.Recheck = true }})
	var stands atomic.Bool
	stands.Store(true)
	e.dec.on(Release, func(m Meta, _ *decide.Event) bool {
		return m.Flow.DstPort == 9170 && (!m.Recheck && !m.Redecide || m.Recheck && stands.Load())
	})
	addr := netip.AddrPortFrom(e.topo.World4, 9170)
	received := echoWorld(t, e, addr)
	setGen(t, e, 3)
	c, err := tcxtest.Dial(e.topo.Guest, "tcp", addr, netip.AddrPort{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c, []byte("\x00\x01opaque hello")); err != nil {
		t.Fatal(err)
	}
	counters := func() tcx.Counters {
		t.Helper()
		cs, err := e.dp.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	base, recv := counters(), e.loop.Stats().Received
	if err := roundTrip(c, []byte("same generation")); err != nil {
		t.Fatal(err)
	}
	if n := e.loop.Stats().Received - recv; n != 0 {
		t.Errorf("%d packets queued at the same generation, want none", n)
	}

	setGen(t, e, 4) // a read that does not change what the agent has read
	if err := roundTrip(c, []byte("after a read")); err != nil {
		t.Fatalf("the stream did not go on after the release was confirmed: %v", err)
	}
	if n := counters().Sub(base)[tcx.QueueRead].Packets; n == 0 {
		t.Errorf("no packet counted queue-read after the generation moved")
	}
	asked := e.dec.decisions(func(d decision) bool { return d.meta.Recheck })
	if len(asked) != 1 {
		t.Fatalf("%d questions, want 1", len(asked))
	}
	if v, err := e.dp.Verdict(asked[0].meta.Flow); err != nil || v != (tcx.Verdict{Action: tcx.Released, ReadGen: true, Gen: 4}) {
		t.Fatalf("verdict after the question %+v (%v), want released at generation 4", v, err)
	}
	recv = e.loop.Stats().Received
	if err := roundTrip(c, []byte("fast again")); err != nil {
		t.Fatal(err)
	}
	if n := e.loop.Stats().Received - recv; n != 0 {
		t.Errorf("%d packets queued after the flow was released again, want none", n)
	}

	before := received.Load()
	stands.Store(false)
	setGen(t, e, 5) // the agent read more
	err = roundTrip(c, []byte("the secret"))
	if err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("the stream after the agent read more: %v, want a reset", err)
	}
	settle()
	if n := received.Load() - before; n != 0 {
		t.Fatalf("the world got %d bytes sent after the agent read more", n)
	}
	var kinds []string
	for _, d := range e.dec.decisions(func(d decision) bool { return d.meta.Flow.DstPort == 9170 }) {
		kinds = append(kinds, map[bool]string{true: "recheck", false: "decide"}[d.meta.Recheck]+"/"+d.out.Verdict.String())
	}
	if want := []string{"decide/release", "recheck/release", "recheck/refuse", "decide/refuse"}; !slices.Equal(kinds, want) {
		t.Errorf("calls %q, want %q", kinds, want)
	}
}

// BenchmarkRecheckRoundTrip: the echo round trip of 64 bytes on a
// released opaque stream, on the fast path and, alternating with it,
// right after the read generation moved (the packet goes through the
// queue, the Decider confirms at once: no tracer to drain here, see
// BenchmarkTracingSync in pkg/daemon for that part). Reports the medians
// and the 99th percentiles of both, and the added median.
func BenchmarkRecheckRoundTrip(b *testing.B) {
	e := newEnv(b, envOpt{cfg: func(c *Config) { c.Recheck = true }})
	e.dec.on(Release, dstPort(9171))
	addr := netip.AddrPortFrom(e.topo.World4, 9171)
	echoWorld(b, e, addr)
	c, err := tcxtest.Dial(e.topo.Guest, "tcp", addr, netip.AddrPort{}, 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 64)
	msg[0] = 1 // not HTTP: opaque
	if err := roundTrip(c, msg); err != nil {
		b.Fatal(err)
	}
	var fast, asked []time.Duration
	gen := uint64(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 1 {
			gen++
			setGen(b, e, gen)
		}
		start := time.Now()
		if err := roundTrip(c, msg); err != nil {
			b.Fatal(err)
		}
		if d := time.Since(start); i%2 == 1 {
			asked = append(asked, d)
		} else {
			fast = append(fast, d)
		}
	}
	b.StopTimer()
	if len(asked) == 0 {
		return
	}
	q := func(v []time.Duration, p float64) float64 {
		slices.Sort(v)
		return float64(v[int(p*float64(len(v)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(fast, 0.5), "fast-p50-µs")
	b.ReportMetric(q(fast, 0.99), "fast-p99-µs")
	b.ReportMetric(q(asked, 0.5), "recheck-p50-µs")
	b.ReportMetric(q(asked, 0.99), "recheck-p99-µs")
	b.ReportMetric(q(asked, 0.5)-q(fast, 0.5), "added-p50-µs")
}
