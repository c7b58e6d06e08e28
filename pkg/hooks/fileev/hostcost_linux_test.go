//go:build linux && amd64

package fileev

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

// processCPU is the process's CPU time (every thread, user and system:
// a program's verification runs in the loading thread's system time).
func processCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// syscallCPU is the least thread CPU time per call of f over five rounds
// of n calls: waiting for a CPU on a loaded machine does not count.
func syscallCPU(n int, f func()) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	best := time.Duration(1 << 62)
	for range 5 {
		t := threadCPU()
		for range n {
			f()
		}
		best = min(best, threadCPU()-t)
	}
	return float64(best.Nanoseconds()) / float64(n)
}

// idleSandboxes starts n Tracers, each tracing an empty cgroup of its
// own with Run waiting, as n idle sandboxes' carbd processes would: all
// in one pin directory (shared), or each in its own (separate: n copies
// of the programs attached, as before the tracer was shared).
func idleSandboxes(b *testing.B, pins string, n int, shared bool) {
	for range n {
		dir := pins
		if !shared {
			dir = testPinDir(b)
		}
		tr, err := New(Config{Root: b.TempDir(), PinDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		cg, err := NewCgroup(testutil.UniqueName("fhc"))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tr.Run(ctx, func(*Record, []decide.Event) {}) }()
		b.Cleanup(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
				b.Errorf("Run: %v", err)
			}
			tr.Close()
			cg.Remove()
		})
		if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHostSyscall: what a system call of an untraced host process
// costs with 0, 10 and 20 idle sandboxes, their file tracers shared (one
// per host) or separate (one per sandbox, as before): getppid (a syscall
// number the tracer does not trace: the programs return after a switch)
// and a one-byte pread of /dev/zero (a traced number: the pid and cgroup
// look-ups run and miss). Thread CPU, least of five rounds.
//
//	go test -run '^$' -bench HostSyscall -count 3 ./pkg/hooks/fileev/
func BenchmarkHostSyscall(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{0, 10, 20} {
		for _, mode := range []string{"separate", "shared"} {
			if n == 0 && mode == "shared" {
				continue
			}
			b.Run(fmt.Sprintf("sandboxes=%d/tracer=%s", n, mode), func(b *testing.B) {
				idleSandboxes(b, testPinDir(b), n, mode == "shared")
				fd, err := unix.Open("/dev/zero", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					b.Fatal(err)
				}
				defer unix.Close(fd)
				buf := make([]byte, 1)
				const calls = 20000
				b.ResetTimer()
				var ppid, pread float64
				for range b.N {
					ppid += syscallCPU(calls, func() { unix.Getppid() })
					pread += syscallCPU(calls, func() { unix.Pread(fd, buf, 0) })
				}
				b.ReportMetric(ppid/float64(b.N), "getppid-cpu-ns")
				b.ReportMetric(pread/float64(b.N), "pread1-cpu-ns")
			})
		}
	}
}

// BenchmarkNewTracer: the CPU a sandbox's start spends on its file
// tracer (New, then Close), when it loads the tracer (first: nothing
// pinned, as every start before the tracer was shared) and when it
// joins one another sandbox holds (join: no verification, no kernel
// BTF). Process CPU, user and system.
//
//	go test -run '^$' -bench NewTracer -count 5 ./pkg/hooks/fileev/
func BenchmarkNewTracer(b *testing.B) {
	testutil.RequireRoot(b)
	for _, mode := range []string{"first", "join"} {
		b.Run(mode, func(b *testing.B) {
			pins := testPinDir(b)
			if mode == "join" {
				idleSandboxes(b, pins, 1, true)
			}
			var cpu time.Duration
			b.ResetTimer()
			for range b.N {
				dir := pins
				if mode == "first" {
					dir = testPinDir(b)
				}
				c := processCPU()
				tr, err := New(Config{Root: b.TempDir(), PinDir: dir})
				if err != nil {
					b.Fatal(err)
				}
				tr.Close()
				cpu += processCPU() - c
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
