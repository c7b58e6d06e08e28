package scalebench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/benchstat"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// BenchmarkStartWhileRunning is the steady-state reading of the scale
// goal: sandboxes started one after another, each once the one before
// has run its agent loop and idles, so that start k is measured with k-1
// sandboxes running (BenchmarkHundredSandboxes starts them all at once).
// It reports the start-to-exec latency of all starts (p50, p90), of the
// first and of the last (n-1 running), the CPU cost of one system call
// on the host before the first start and with all n running (every
// sandbox's file tracer runs on every system call of the host), and the
// CPU the n carbd use while they idle, per sandbox. Each
// sub-benchmark is sandboxes=CARBD_SCALE_N (default 20); run it with
// -benchtime=1x. With CARBD_SCALE_LOG, a directory, the log of the
// first, middle and last start is written there (with a profiling
// build's start-up marks).
func BenchmarkStartWhileRunning(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireTool(b, "curl")
	n := envInt("CARBD_SCALE_N", 20)
	dir, err := os.MkdirTemp("/var/lib", "carbd-steady-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	bin := os.Getenv("CARBD_SCALE_BIN")
	if bin == "" {
		bin = buildCarbd(b, dir)
	}
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policy), 0o644); err != nil {
		b.Fatal(err)
	}
	served := newWorld(b)
	b.Run(fmt.Sprintf("sandboxes=%d", n), func(b *testing.B) {
		steady(b, n, bin, policyPath, filepath.Join(dir, fmt.Sprintf("n%d", n)), served)
	})
}

func steady(b *testing.B, n int, bin, policyPath, dir string, served *atomic.Int64) {
	for it := 0; it < b.N; it++ {
		base := filepath.Join(dir, fmt.Sprintf("it%d", it))
		f := &fleet{b: b, bin: bin, state: filepath.Join(base, "state")}
		if err := os.MkdirAll(f.state, 0o711); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(f.cleanup)
		tag := uniq()
		sys0 := syscallNs()
		var lat []time.Duration
		for i := 0; i < n; i++ {
			r := f.prepare(base, tag, i)
			f.runs = append(f.runs, r)
			f.start(r, policyPath, 0)
			one := []*run{r}
			f.waitAll(one, 5*time.Minute, "the agent's first instruction", func(r *run) bool { _, ok := f.stamp(r, "exec"); return ok })
			t, _ := f.stamp(r, "exec")
			lat = append(lat, t.Sub(r.start))
			f.waitAll(one, 5*time.Minute, "the end of the agent loop", func(r *run) bool { _, ok := f.stamp(r, "loopdone"); return ok })
			if i == 0 || i == n/2-1 || i == n-1 {
				b.Logf("start %d (%d running): start-to-exec %v", i+1, i, lat[i].Round(time.Millisecond))
				if d := os.Getenv("CARBD_SCALE_LOG"); d != "" {
					// For a profiling build's start-up marks: the
					// times of the start and of the agent's stamp,
					// then its log.
					log := fmt.Sprintf("started %d exec %d\n%s", r.start.UnixNano(), t.UnixNano(), r.out.String())
					if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("start-%d-of-%d.log", i+1, n)), []byte(log), 0o644); err != nil {
						b.Error(err)
					}
				}
			}
		}
		// All n run, idle: the cost of a system call now, the CPU they
		// use idling, and isolation.
		sysN := syscallNs()
		idle := idleCPU(f.runs, 5*time.Second)
		bound := boundQueues()
		var unbound []string
		for i, r := range f.runs {
			if !bound[netns.QueueBase+indexBase+i] {
				unbound = append(unbound, r.id)
			}
		}
		for _, r := range f.runs {
			f.tell(r, "exit")
		}
		for _, r := range f.runs {
			select {
			case <-r.done:
			case <-time.After(2 * time.Minute):
				b.Fatalf("sandbox %s did not end:\n%s", r.id, r.out.String())
			}
			if r.code != 0 {
				b.Errorf("sandbox %s exited %d:\n%s", r.id, r.code, r.out.String())
			}
		}
		violations, _ := f.isolation(time.Time{}, time.Time{})
		b.StopTimer()

		p50, p90 := benchstat.Median(lat), benchstat.Quantile(lat, 0.9)
		last := lat[len(lat)-1]
		// The last tenth of the starts (at least one): those made with
		// the most sandboxes running.
		tail := lat[len(lat)-max(len(lat)/10, 1):]
		b.ReportMetric(float64(p50.Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(p90.Microseconds())/1000, "start-p90-ms")
		b.ReportMetric(float64(lat[0].Microseconds())/1000, "first-start-ms")
		b.ReportMetric(float64(last.Microseconds())/1000, "last-start-ms")
		b.ReportMetric(float64(benchstat.Median(tail).Microseconds())/1000, "last-tenth-p50-ms")
		b.ReportMetric(sys0, "syscall-ns-0")
		b.ReportMetric(sysN, "syscall-ns-all")
		b.ReportMetric(float64(idle.Microseconds())/1000/float64(n), "idle-cpu-ms/s/sandbox")
		b.ReportMetric(float64(len(violations)+len(unbound)), "isolation-violations")
		b.Logf("%d sandboxes started one after another, each with the earlier ones running: start-to-exec p50 %v p90 %v (first %v, last %v, last tenth p50 %v); a system call on the host %.0f ns of CPU before, %.0f ns with all %d running; idle, the %d carbd use %v of CPU a second; world served %d requests",
			n, p50, p90, lat[0], last, benchstat.Median(tail), sys0, sysN, n, n, idle.Round(time.Millisecond), served.Load())
		for _, v := range violations {
			b.Errorf("isolation: %s", v)
		}
		if len(unbound) > 0 {
			b.Errorf("isolation: no bound queue of its own for %v", unbound)
		}
		b.StartTimer()
	}
}

// syscallNs is the CPU cost of one system call on this host now
// (getppid, which does nothing; the thread's CPU time, so that waiting
// for a CPU on a loaded machine does not count): the least of five
// rounds of 20,000.
func syscallNs() float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano())
	}
	best := time.Duration(1 << 62)
	const calls = 20000
	for range 5 {
		t := cpu()
		for range calls {
			unix.Getppid()
		}
		best = min(best, cpu()-t)
	}
	return float64(best.Nanoseconds()) / calls
}

// idleCPU is the CPU time the carbd processes of runs use per second
// while they idle, measured over d (utime and stime, /proc/PID/stat).
func idleCPU(runs []*run, d time.Duration) time.Duration {
	ticks := func() (n int64) {
		for _, r := range runs {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.cmd.Process.Pid))
			if err != nil {
				continue
			}
			// The fields after the command name, which is in parentheses.
			f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				s, _ := strconv.ParseInt(f[12], 10, 64)
				n += u + s
			}
		}
		return n
	}
	a := ticks()
	time.Sleep(d)
	// 100 clock ticks a second (USER_HZ on Linux).
	return time.Duration(ticks()-a) * 10 * time.Millisecond * time.Second / d
}
