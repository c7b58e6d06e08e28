package nfq

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// inNetNS runs fn on a fresh OS thread inside the network namespace at
// path (the caller's when path is empty). The thread is never returned to
// the Go scheduler's pool: it ends with the goroutine, so no other
// goroutine ever runs in the wrong namespace.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// readQueueProc reads the queue's line of /proc/net/netfilter/nfnetlink_queue
// in the namespace at nsPath.
func readQueueProc(nsPath string, num uint16) (QueueProc, error) {
	var b []byte
	err := inNetNS(nsPath, func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/netfilter/nfnetlink_queue")
		return err
	})
	if err != nil {
		return QueueProc{}, fmt.Errorf("nfq: %w", err)
	}
	return parseQueueProc(b, num)
}
