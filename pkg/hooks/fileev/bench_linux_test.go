//go:build linux && amd64

package fileev

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// benchTracer starts a tracer on root tracing pid, with Run counting the
// decide.Events; stop untraces and closes it.
func benchTracer(b *testing.B, cfg Config, pid int) (tr *Tracer, events *atomic.Int64, stop func()) {
	b.Helper()
	tr, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	events = &atomic.Int64{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- tr.Run(ctx, func(r *Record, evs []decide.Event) { events.Add(int64(len(evs))) })
	}()
	id := 0
	if pid > 0 {
		if id, err = tr.Trace(Target{PID: pid}); err != nil {
			b.Fatal(err)
		}
	}
	return tr, events, func() {
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

// BenchmarkFileCycle measures a 4 KiB create/write/fsync/read/close/
// unlink cycle in an overlay mount (the shape of M), run by a child
// process: plain (no BPF loaded), with the tracer attached but the
// process not traced (the filter's cost on everyone else), and traced
// with every event read, resolved, its content read back from M and
// mapped to decide.Events (Sync included in the time). Rounds alternate
// the three so machine noise hits them alike. ns/op is the traced
// cycle; ratio = traced / plain.
func BenchmarkFileCycle(b *testing.B) {
	testutil.RequireRoot(b)
	b.Run("fsync", func(b *testing.B) { benchCycle(b, "bench") })
	// Without the fsync the disk is out of the picture and the tracer's
	// CPU cost shows.
	b.Run("nofsync", func(b *testing.B) { benchCycle(b, "bench-nofsync") })
}

func benchCycle(b *testing.B, script string) {
	root := mountOverlay(b)
	for _, d := range []string{"plain", "traced"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	plain := startHelper(b, script, filepath.Join(root, "plain"), nil)
	traced := startHelper(b, script, filepath.Join(root, "traced"), nil)
	plain.begin(b)
	traced.begin(b)
	plain.send(b, 10) // warm up
	traced.send(b, 10)

	const rounds = 8
	per := max(b.N/rounds, 250) // enough cycles per round to average out the noise
	var tPlain, tIdle, tTraced time.Duration
	var nEvents int64
	var lost uint64
	// The timer runs throughout (the harness sizes b.N by it); the
	// figures reported are the per-variant times measured below.
	b.ResetTimer()
	for range rounds {
		start := time.Now()
		plain.send(b, per)
		tPlain += time.Since(start)

		tr, events, stop := benchTracer(b, Config{Root: root}, traced.pid)
		start = time.Now()
		plain.send(b, per)
		tIdle += time.Since(start)

		start = time.Now()
		traced.send(b, per)
		syncTracer(b, tr)
		tTraced += time.Since(start)
		nEvents += events.Load()
		lost += tr.Lost()
		stop()
	}
	n := float64(per * rounds)
	b.ReportMetric(float64(tTraced.Nanoseconds())/n, "ns/op")
	b.ReportMetric(float64(tPlain.Nanoseconds())/n, "plain-ns/op")
	b.ReportMetric(float64(tIdle.Nanoseconds())/n, "untraced-ns/op")
	b.ReportMetric(float64(tTraced)/float64(tPlain), "ratio")
	b.ReportMetric(float64(nEvents)/n, "events/op")
	b.ReportMetric(float64(lost), "lost")
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
