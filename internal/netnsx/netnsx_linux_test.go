package netnsx

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
)

// The main goroutine keeps the main thread, so no test goroutine runs on
// it: the runtime does not end the main thread when a locked goroutine
// exits there but parks it for good (see the package comment), which would
// hide the thread this test waits to see retired.
func init() { runtime.LockOSThread() }

// nsID names the namespace a file under /proc refers to.
func nsID(t testing.TB, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

func newNS(t *testing.T) (path, id string) {
	name := testutil.NewNetNS(t)
	path = filepath.Join(RunDir, name)
	return path, nsID(t, path)
}

func TestDoEntersAndReturns(t *testing.T) {
	path, target := newNS(t)
	home := nsID(t, "/proc/self/ns/net")
	for i := 0; i < 20; i++ {
		var inside, ifaces string
		err := Do(path, func() error {
			inside = nsID(t, "/proc/thread-self/ns/net")
			b, err := os.ReadFile("/proc/thread-self/net/dev")
			ifaces = string(b)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if inside != target {
			t.Fatalf("fn ran in netns %s, want %s", inside, target)
		}
		// A fresh namespace has only loopback: 2 header lines + lo.
		if n := strings.Count(strings.TrimSpace(ifaces), "\n"); n != 2 {
			t.Fatalf("fn saw %d interfaces, want only lo:\n%s", n-1, ifaces)
		}
	}
	assertAllThreadsIn(t, home)
}

func TestDoEmptyPathRunsInPlace(t *testing.T) {
	home := nsID(t, "/proc/self/ns/net")
	var got string
	if err := Do("", func() error { got = nsID(t, "/proc/thread-self/ns/net"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != home {
		t.Fatalf("ran in %s, want %s", got, home)
	}
}

func TestDoMissingNamespace(t *testing.T) {
	err := DoNamed("carbd-no-such-netns", func() error { t.Error("fn ran"); return nil })
	if err == nil || !strings.Contains(err.Error(), "netnsx: open") {
		t.Fatalf("err = %v, want an open error", err)
	}
}

func TestDoReturnsFnError(t *testing.T) {
	path, _ := newNS(t)
	want := fmt.Errorf("boom")
	if err := Do(path, func() error { return want }); err != want {
		t.Fatalf("err = %v, want %v", err, want)
	}
}

// failBack is a setns that enters for real but fails (or lies about)
// every later switch, leaving the thread where it is.
func failBack(lie bool) func(int, int) error {
	var calls atomic.Int32
	return func(fd, nstype int) error {
		if calls.Add(1) == 1 {
			return unix.Setns(fd, nstype)
		}
		if lie {
			return nil
		}
		return unix.EPERM
	}
}

// The thread that could not switch back is retired: it leaves the process,
// and no thread of the process is left in the sandbox's namespace.
func TestDoThreadRetiredWhenSwitchBackFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		lie  bool
	}{{"error", false}, {"silent", true}} {
		t.Run(tc.name, func(t *testing.T) {
			path, target := newNS(t)
			home := nsID(t, "/proc/self/ns/net")
			var tid int
			err := switcher{setns: failBack(tc.lie)}.do(path, func() error {
				tid = unix.Gettid()
				if got := nsID(t, "/proc/thread-self/ns/net"); got != target {
					return fmt.Errorf("in %s, want %s", got, target)
				}
				return nil
			})
			if err == nil || !strings.Contains(err.Error(), "netnsx: return from netns") {
				t.Fatalf("err = %v, want a return error", err)
			}
			waitThreadGone(t, tid)
			stressThreads(t, home)
			assertAllThreadsIn(t, home)
		})
	}
}

func TestDoPanicRetiresThread(t *testing.T) {
	path, _ := newNS(t)
	home := nsID(t, "/proc/self/ns/net")
	var tid int
	func() {
		defer func() {
			if v := recover(); v != "inside" {
				t.Fatalf("recovered %v, want the panic of fn", v)
			}
		}()
		_ = Do(path, func() error { tid = unix.Gettid(); panic("inside") })
		t.Fatal("Do returned after fn panicked")
	}()
	waitThreadGone(t, tid)
	assertAllThreadsIn(t, home)
}

func TestDoGoexitRetiresThread(t *testing.T) {
	path, _ := newNS(t)
	home := nsID(t, "/proc/self/ns/net")
	var tid int
	err := Do(path, func() error { tid = unix.Gettid(); runtime.Goexit(); return nil })
	if err == nil || !strings.Contains(err.Error(), "did not return") {
		t.Fatalf("err = %v", err)
	}
	waitThreadGone(t, tid)
	assertAllThreadsIn(t, home)
}

// waitThreadGone waits until thread tid has left the process. The runtime
// ends a locked thread when its goroutine exits; the exit itself is
// asynchronous, so this polls (with a generous limit that is a hang
// guard, not a speed assertion).
func waitThreadGone(t *testing.T, tid int) {
	t.Helper()
	p := fmt.Sprintf("/proc/self/task/%d", tid)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			return
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("thread %d was not retired: it went back to the pool", tid)
}

// stressThreads makes the scheduler use many threads, each checking its
// namespace, so a thread left in the pool in the wrong namespace is used.
func stressThreads(t *testing.T, home string) {
	t.Helper()
	errc := make(chan error, 64)
	for i := 0; i < cap(errc); i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var st unix.Stat_t
			err := unix.Stat("/proc/thread-self/ns/net", &st)
			if err == nil && fmt.Sprintf("%d:%d", st.Dev, st.Ino) != home {
				err = fmt.Errorf("thread %d runs in netns %d:%d", unix.Gettid(), st.Dev, st.Ino)
			}
			time.Sleep(time.Millisecond)
			errc <- err
		}()
	}
	for i := 0; i < cap(errc); i++ {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

func assertAllThreadsIn(t *testing.T, home string) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join("/proc/self/task", e.Name(), "ns/net"), &st); err != nil {
			continue // the thread ended meanwhile
		}
		if got := fmt.Sprintf("%d:%d", st.Dev, st.Ino); got != home {
			t.Errorf("thread %s is in netns %s, want %s", e.Name(), got, home)
		}
	}
}
