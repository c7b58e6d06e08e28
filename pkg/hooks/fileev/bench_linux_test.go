//go:build linux && amd64

package fileev

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// begin lets a looping helper (bench, readloop) start; send drives it.
func (h *helper) begin(t testing.TB) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
}

// benchCounts is what a benchmark's Run counts.
type benchCounts struct {
	events      atomic.Int64 // decide.Events
	contentErrs atomic.Int64 // data records whose content could not be read back
	uncaptured  atomic.Int64 // reads and writes that moved bytes without content copied at the syscall
}

// benchTracer starts a tracer on root tracing pid, with Run counting
// (benchCounts); stop untraces and closes it.
func benchTracer(b *testing.B, cfg Config, pid int) (tr *Tracer, cnt *benchCounts, stop func()) {
	b.Helper()
	tr, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cnt = &benchCounts{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tr.Run(ctx, func(r *Record, evs []decide.Event) {
			cnt.events.Add(int64(len(evs)))
			if r.ContentErr != "" {
				cnt.contentErrs.Add(1)
			}
			if (r.Op == OpRead || r.Op == OpWrite) && r.Ret > 0 && !r.ContentCaptured {
				cnt.uncaptured.Add(1)
			}
		})
	}()
	id := 0
	if pid > 0 {
		if id, err = tr.Trace(Target{PID: pid}); err != nil {
			b.Fatal(err)
		}
	}
	return tr, cnt, func() {
		if id > 0 {
			tr.Untrace(id)
		}
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
		tr.Close()
	}
}

// cpuTime is the CPU time pid's threads have used
// (/proc/PID/task/TID/schedstat: nanoseconds on a CPU), so a figure does
// not count the time the machine's other work kept them waiting.
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	var sum time.Duration
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(raw))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			b.Fatalf("%s/%s/schedstat: %v", dir, e.Name(), err)
		}
		sum += time.Duration(ns)
	}
	return sum
}

// BenchmarkFileCycle measures a 4 KiB create/write/fsync/read/close/
// unlink cycle in an overlay mount (the shape of M), run by a child
// process: plain (no BPF loaded), with the tracer attached but the
// process not traced (the filter's cost on everyone else), traced with
// every event read, resolved, its content read back from M and mapped
// to decide.Events (Sync included in the time), and traced as before
// batched wake-ups ("eager": Config.WakeupInterval -1, a wake-up per
// record whenever the reader has caught up), and traced with every
// record's content read back from M instead of copied by the kernel
// ("readback": Config.ReadBack, as before the copy). Rounds alternate the variants so
// machine noise hits them alike. ns/op is the traced cycle; ratio =
// traced / plain (wall time); cpu-ratio compares the CPU time of the
// child and of this process (the reader) instead, which the other work
// on a loaded machine does not inflate.
func BenchmarkFileCycle(b *testing.B) {
	testutil.RequireRoot(b)
	b.Run("fsync", func(b *testing.B) { benchCycle(b, "bench") })
	// Without the fsync the disk is out of the picture and the tracer's
	// CPU cost shows.
	b.Run("nofsync", func(b *testing.B) { benchCycle(b, "bench-nofsync") })
}

func benchCycle(b *testing.B, script string) {
	root := mountOverlay(b)
	variants := []string{"plain", "traced", "eager", "readback"}
	helpers := map[string]*helper{}
	for _, d := range variants {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
		helpers[d] = startHelper(b, script, filepath.Join(root, d), nil)
		helpers[d].begin(b)
		helpers[d].send(b, 10) // warm up
	}
	self := os.Getpid()

	const rounds = 8
	per := max(b.N/rounds, 250) // enough cycles per round to average out the noise
	wall := map[string]time.Duration{}
	cpu := map[string]time.Duration{}   // the child's and this process's
	child := map[string]time.Duration{} // the child's alone
	var nEvents, nContentErrs, nUncaptured, nEagerErrs, nReadbackErrs int64
	var lost uint64
	losses := map[string]Stats{} // per variant, by counter
	addLoss := func(v string, tr *Tracer) {
		st, sum := tr.Stats(), losses[v]
		sum.RingFull += st.RingFull
		sum.InflightFull += st.InflightFull
		losses[v] = sum
		lost += tr.Lost()
	}
	// measure runs per cycles of h and adds its wall and CPU time
	// (the child's and this process's) to variant v.
	measure := func(v string, h *helper, tr *Tracer) {
		runtime.GC() // loading a tracer allocates: collect it outside the window
		h0, s0 := cpuTime(b, h.pid), cpuTime(b, self)
		start := time.Now()
		h.send(b, per)
		if tr != nil {
			syncTracer(b, tr)
		}
		wall[v] += time.Since(start)
		h1, s1 := cpuTime(b, h.pid), cpuTime(b, self)
		cpu[v] += h1 - h0 + s1 - s0
		child[v] += h1 - h0
	}
	// The timer runs throughout (the harness sizes b.N by it); the
	// figures reported are the per-variant times measured below.
	b.ResetTimer()
	for range rounds {
		measure("plain", helpers["plain"], nil)

		tr, cnt, stop := benchTracer(b, Config{Root: root}, helpers["traced"].pid)
		measure("untraced", helpers["plain"], nil)
		measure("traced", helpers["traced"], tr)
		nEvents += cnt.events.Load()
		nContentErrs += cnt.contentErrs.Load()
		nUncaptured += cnt.uncaptured.Load()
		addLoss("traced", tr)
		stop()

		tr, cnt, stop = benchTracer(b, Config{Root: root, WakeupInterval: -1}, helpers["eager"].pid)
		measure("eager", helpers["eager"], tr)
		nEagerErrs += cnt.contentErrs.Load()
		addLoss("eager", tr)
		stop()

		tr, cnt, stop = benchTracer(b, Config{Root: root, ReadBack: true}, helpers["readback"].pid)
		measure("readback", helpers["readback"], tr)
		nReadbackErrs += cnt.contentErrs.Load()
		addLoss("readback", tr)
		stop()
	}
	n := float64(per * rounds)
	b.ReportMetric(float64(wall["traced"].Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(wall["plain"].Nanoseconds())/n, "plain-ns/op")
	b.ReportMetric(float64(wall["untraced"].Nanoseconds())/n, "untraced-ns/op")
	b.ReportMetric(float64(wall["eager"].Nanoseconds())/n, "eager-ns/op")
	b.ReportMetric(float64(wall["traced"])/float64(wall["plain"]), "ratio")
	b.ReportMetric(float64(wall["eager"])/float64(wall["plain"]), "eager-ratio")
	b.ReportMetric(float64(cpu["plain"].Nanoseconds())/n, "plain-cpu-ns/op")
	b.ReportMetric(float64(cpu["traced"].Nanoseconds())/n, "cpu-ns/op")
	b.ReportMetric(float64(cpu["traced"])/float64(cpu["plain"]), "cpu-ratio")
	b.ReportMetric(float64(child["plain"].Nanoseconds())/n, "plain-child-cpu-ns/op")
	b.ReportMetric(float64(child["untraced"].Nanoseconds())/n, "untraced-child-cpu-ns/op")
	b.ReportMetric(float64(child["traced"].Nanoseconds())/n, "child-cpu-ns/op")
	b.ReportMetric(float64(child["eager"].Nanoseconds())/n, "eager-child-cpu-ns/op")
	b.ReportMetric(float64((cpu["traced"]-child["traced"]).Nanoseconds())/n, "reader-cpu-ns/op")
	b.ReportMetric(float64((cpu["eager"]-child["eager"]).Nanoseconds())/n, "eager-reader-cpu-ns/op")
	b.ReportMetric(float64(cpu["eager"])/float64(cpu["plain"]), "eager-cpu-ratio")
	b.ReportMetric(float64(wall["readback"])/float64(wall["plain"]), "readback-ratio")
	b.ReportMetric(float64(child["readback"].Nanoseconds())/n, "readback-child-cpu-ns/op")
	b.ReportMetric(float64((cpu["readback"]-child["readback"]).Nanoseconds())/n, "readback-reader-cpu-ns/op")
	b.ReportMetric(float64(cpu["readback"])/float64(cpu["plain"]), "readback-cpu-ratio")
	b.ReportMetric(float64(nEvents)/n, "events/op")
	b.ReportMetric(float64(nContentErrs)/n, "content-err/op")
	b.ReportMetric(float64(nUncaptured)/n, "uncaptured/op") // of 2 reads and writes per cycle
	b.ReportMetric(float64(nEagerErrs)/n, "eager-content-err/op")
	b.ReportMetric(float64(nReadbackErrs)/n, "readback-content-err/op")
	b.ReportMetric(float64(lost), "lost")
	for v, st := range losses {
		if st.RingFull > 0 {
			b.ReportMetric(float64(st.RingFull), v+"-lost-ringfull")
		}
		if st.InflightFull > 0 {
			b.ReportMetric(float64(st.InflightFull), v+"-lost-inflight")
		}
	}
}

// BenchmarkReaderThroughput measures the records per second the reader
// sustains. A traced child preads 64 bytes of a file in M per op while
// the handler is held, so the records pile up in a 64 MiB ring (room for
// ~360,000); then the handler is let go and the clock runs until Sync
// says every record was decoded, resolved, its content read back from M
// ("content"; "no-content" skips that) and mapped to a decide.Event.
func BenchmarkReaderThroughput(b *testing.B) {
	testutil.RequireRoot(b)
	for _, mode := range []struct {
		name       string
		maxContent int
	}{{"content", 0}, {"no-content", -1}} {
		b.Run(mode.name, func(b *testing.B) {
			root := b.TempDir()
			h := startHelper(b, "readloop", root, nil)
			h.begin(b)
			tr, err := New(Config{Root: root, RingBytes: 64 << 20, MaxContent: mode.maxContent})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			var gate sync.Mutex
			var events atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- tr.Run(ctx, func(r *Record, evs []decide.Event) {
					// Wait at the gate while the benchmark holds it.
					gate.Lock()
					gate.Unlock() //lint:ignore SA2001 a gate, not a critical section
					events.Add(int64(len(evs)))
				})
			}()
			defer func() { cancel(); <-done }()
			if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
				b.Fatal(err)
			}
			h.send(b, 100)
			syncTracer(b, tr)
			b.ResetTimer()
			b.StopTimer()
			var el time.Duration
			var got int64
			for done := 0; done < b.N; done += 200_000 {
				n := min(200_000, b.N-done)
				before := events.Load()
				gate.Lock()
				h.send(b, n)
				start := time.Now()
				b.StartTimer() // the harness sizes b.N by the measured part only
				gate.Unlock()
				syncTracer(b, tr)
				b.StopTimer()
				el += time.Since(start)
				got += events.Load() - before
			}
			b.ReportMetric(float64(got)/el.Seconds(), "events/s")
			b.ReportMetric(float64(el.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(float64(tr.Lost()), "lost")
			if got != int64(b.N) && tr.Lost() == 0 {
				b.Errorf("%d events for %d reads and no loss", got, b.N)
			}
		})
	}
}

// BenchmarkFileCycleBPF measures the kernel side of the no-fsync cycle:
// with BPF run-time statistics enabled (BPF_ENABLE_STATS, released when
// the benchmark ends), a child runs the cycle, traced ("traced") or not
// ("untraced": the programs only filter it out), and each tracing program
// reports its run time per cycle (<prog>-ns/op) and its runs per cycle
// (<prog>-runs/op). The programs run on every syscall of the machine, so
// runs/op counts the other processes' syscalls too: the difference of the
// two variants is the cost of tracing the child. The statistics add two
// clock reads per program run, so the figures are upper bounds. The
// reader runs as in BenchmarkFileCycle.
func BenchmarkFileCycleBPF(b *testing.B) {
	testutil.RequireRoot(b)
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		b.Skipf("BPF run-time statistics refused: %v", err)
	}
	defer stats.Close()
	for _, traced := range []bool{true, false} {
		name := "traced"
		if !traced {
			name = "untraced"
		}
		b.Run(name, func(b *testing.B) { benchCycleBPF(b, traced) })
	}
}

func benchCycleBPF(b *testing.B, traced bool) {
	root := mountOverlay(b)
	h := startHelper(b, "bench-nofsync", root, nil)
	h.begin(b)
	h.send(b, 10)
	pid := 0
	if traced {
		pid = h.pid
	}
	tr, _, stop := benchTracer(b, Config{Root: root, PinDir: testPinDir(b)}, pid)
	defer stop()
	names := make([]string, 0, len(tr.host.progs))
	for name := range tr.host.progs {
		names = append(names, name)
	}
	slices.Sort(names)
	read := func() map[string]ebpf.ProgramStats {
		m := map[string]ebpf.ProgramStats{}
		for _, name := range names {
			st, err := tr.host.progs[name].Stats()
			if err != nil {
				b.Fatalf("stats of %s: %v", name, err)
			}
			m[name] = *st
		}
		return m
	}
	n := max(b.N, 1000) // enough cycles to average out the noise
	before := read()
	b.ResetTimer()
	start := time.Now()
	h.send(b, n)
	syncTracer(b, tr)
	wall := time.Since(start)
	b.StopTimer()
	after := read()
	b.ReportMetric(float64(wall.Nanoseconds())/float64(n), "ns/op") // per cycle, also when n > b.N
	var total time.Duration
	for _, name := range names {
		d := after[name].Runtime - before[name].Runtime
		runs := after[name].RunCount - before[name].RunCount
		if name == "ft_marker" || runs == 0 {
			continue
		}
		total += d
		b.ReportMetric(float64(d.Nanoseconds())/float64(n), name+"-ns/op")
		b.ReportMetric(float64(runs)/float64(n), name+"-runs/op")
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(n), "bpf-ns/op")
}
