package scalebench

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/benchstat"
	"github.com/carbd/carbd/internal/testutil"
)

// startScript is the agent of BenchmarkStartToExec: its first
// instruction stamps the time, and it ends.
const startScript = `date +%s%N > /run/carbd/exec`

// BenchmarkStartToExec starts one sandbox at a time (CARBD_START_N
// starts, default 10, one after the other) and reports the latency from
// the start of `carbd run` to the agent's first instruction (p50, p90),
// and to the run's end (its teardown included). With
// CARBD_SCALE_BASE_BIN, a second carbd binary (an older build, say) is
// started in turn with this one, start for start, and the ratio of their
// medians is reported: a comparison within one run, which a loaded
// machine's noise affects alike.
//
// Each iteration is the whole series: run it with -benchtime=1x.
func BenchmarkStartToExec(b *testing.B) {
	testutil.RequireRoot(b)
	n := envInt("CARBD_START_N", 10)
	dir, err := os.MkdirTemp("/var/lib", "carbd-start-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	bins := []string{os.Getenv("CARBD_SCALE_BIN")}
	if bins[0] == "" {
		bins[0] = buildCarbd(b, dir)
	}
	if base := os.Getenv("CARBD_SCALE_BASE_BIN"); base != "" {
		bins = append(bins, base)
	}
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policy), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		exec := make([][]time.Duration, len(bins))
		whole := make([][]time.Duration, len(bins))
		for i := 0; i < n; i++ {
			for k, bin := range bins {
				e, w := startOnce(b, bin, policyPath, filepath.Join(dir, fmt.Sprintf("it%d-%d-%d", it, i, k)), i)
				exec[k] = append(exec[k], e)
				whole[k] = append(whole[k], w)
			}
		}
		b.StopTimer()
		p50 := benchstat.Median(exec[0])
		b.ReportMetric(float64(p50.Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(benchstat.Quantile(exec[0], 0.9).Microseconds())/1000, "start-p90-ms")
		b.ReportMetric(float64(benchstat.Median(whole[0]).Microseconds())/1000, "run-p50-ms")
		b.Logf("%d starts, one at a time: start-to-exec p50 %v p90 %v (min %v max %v); start to exit p50 %v",
			n, p50, benchstat.Quantile(exec[0], 0.9), benchstat.Quantile(exec[0], 0), benchstat.Quantile(exec[0], 1), benchstat.Median(whole[0]))
		if len(bins) > 1 {
			bp50 := benchstat.Median(exec[1])
			b.ReportMetric(float64(bp50.Microseconds())/1000, "base-start-p50-ms")
			b.ReportMetric(float64(benchstat.Median(whole[1]).Microseconds())/1000, "base-run-p50-ms")
			b.ReportMetric(float64(p50)/float64(bp50), "start/base")
			b.Logf("base %s, in turn: start-to-exec p50 %v p90 %v (min %v max %v); start to exit p50 %v",
				bins[1], bp50, benchstat.Quantile(exec[1], 0.9), benchstat.Quantile(exec[1], 0), benchstat.Quantile(exec[1], 1), benchstat.Median(whole[1]))
		}
		b.StartTimer()
	}
}

// startOnce runs one sandbox whose agent stamps the time and ends; it
// returns the time from carbd's start to the stamp, and to carbd's exit.
func startOnce(b *testing.B, bin, policyPath, base string, i int) (toExec, toExit time.Duration) {
	f := &fleet{b: b, bin: bin, state: filepath.Join(base, "state"), script: startScript}
	if err := os.MkdirAll(f.state, 0o711); err != nil {
		b.Fatal(err)
	}
	defer f.cleanup()
	r := f.prepare(base, uniq(), i)
	f.runs = append(f.runs, r)
	f.start(r, policyPath, 0)
	select {
	case <-r.done:
	case <-time.After(2 * time.Minute):
		b.Fatalf("sandbox %s did not end:\n%s", r.id, r.out.String())
	}
	toExit = time.Since(r.start)
	if r.code != 0 {
		b.Fatalf("sandbox %s exited %d:\n%s", r.id, r.code, r.out.String())
	}
	t, ok := f.stamp(r, "exec")
	if !ok {
		b.Fatalf("sandbox %s: no stamp from its agent:\n%s", r.id, r.out.String())
	}
	return t.Sub(r.start), toExit
}
