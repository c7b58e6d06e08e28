//go:build linux && amd64

package fileev

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/carbd/carbd/internal/testutil"
	"golang.org/x/sys/unix"
)

// helperMigrate pins its thread to CPU 0, says its thread id, and opens
// the FIFO "fifo" for reading, which blocks until the parent has moved
// the thread to CPU 1 and opened the FIFO for writing: the syscall enters
// on CPU 0 and returns on CPU 1. It says the CPU it returned on.
func helperMigrate() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to cpu 0: %w", err)
	}
	fmt.Printf("tid %d\n", unix.Gettid())
	fd := must("open fifo", sys(unix.SYS_OPENAT, fdcwd, cstr("fifo"), unix.O_RDONLY|unix.O_CLOEXEC))
	var cpu uint32
	must("getcpu", sys(unix.SYS_GETCPU, uintptr(unsafe.Pointer(&cpu)), 0, 0))
	must("close", sys(unix.SYS_CLOSE, fd))
	fmt.Printf("cpu %d\n", cpu)
	return nil
}

// TestSyscallMigrates: a traced syscall that enters on one CPU and returns
// on another is recorded, under both mechanisms (the syscall in flight is
// kept per thread, not per CPU: a per-CPU slot would lose it, or pair it
// with another thread's exit).
func TestSyscallMigrates(t *testing.T) {
	testutil.RequireRoot(t)
	if runtime.NumCPU() < 2 {
		t.Skip("needs two CPUs")
	}
	for _, mech := range []string{MechTPBTF, MechRawTP} {
		t.Run(mech, func(t *testing.T) {
			root := t.TempDir()
			fifo := filepath.Join(root, "fifo")
			if err := unix.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			tr, col := newTracer(t, Config{Root: root, Attach: mech})
			if got, _ := tr.Mechanism(); got != mech {
				t.Fatalf("mechanism %s, want %s", got, mech)
			}
			h := startHelper(t, "migrate", root, nil)
			if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
				t.Fatal(err)
			}
			if _, err := h.stdin.Write([]byte("go\n")); err != nil {
				t.Fatal(err)
			}
			line, err := h.out.ReadString('\n')
			tid, perr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "tid "))
			if err != nil || perr != nil {
				t.Fatalf("helper: %q %v", line, err)
			}
			// Wait for the thread to block in openat (257), then
			// move it to CPU 1 and let its open return there.
			sysFile := fmt.Sprintf("/proc/%d/task/%d/syscall", h.pid, tid)
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				b, _ := os.ReadFile(sysFile)
				if strings.HasPrefix(string(b), "257 ") {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("helper thread not blocked in openat: %q", b)
				}
			}
			var set unix.CPUSet
			set.Set(1)
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				t.Fatal(err)
			}
			w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			w.Close()
			line, err = h.out.ReadString('\n')
			if err != nil || line != "cpu 1\n" {
				t.Fatalf("helper: %q %v (the open must return on cpu 1)", line, err)
			}
			if line, err = h.out.ReadString('\n'); err != nil || line != "ok\n" {
				t.Fatalf("helper: %q %v", line, err)
			}
			h.stdin.Close()
			if err := h.cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			syncTracer(t, tr)
			recs, _ := col.of(h.pid)
			var got []string
			found := false
			for _, r := range recs {
				got = append(got, r.String())
				if r.Op == OpOpen && r.TID == tid && r.Syscall == "openat" && r.Path == "fifo" && r.InRoot && r.Ret >= 0 && r.FD == int(r.Ret) {
					found = true
				}
			}
			if !found {
				t.Errorf("no record of the migrated openat of fifo by thread %d; records:\n%s", tid, strings.Join(got, "\n"))
			}
			if n := tr.Lost(); n != 0 {
				t.Errorf("%d records lost: %+v", n, tr.Stats())
			}
		})
	}
}
