package netnsx

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// RunDir is where ip-netns(8) keeps named namespaces.
const RunDir = "/run/netns"

// Do runs fn inside the network namespace at path (a bind mount such as
// /run/netns/NAME or /proc/PID/ns/net). An empty path runs fn in place.
// See the package comment for the thread guarantees.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return switcher{setns: unix.Setns}.do(path, fn)
}

// DoNamed runs fn inside the named namespace under RunDir.
func DoNamed(name string, fn func() error) error {
	return Do(filepath.Join(RunDir, name), fn)
}

// switcher holds the one system call Do needs, so a test can make the
// switch back fail.
type switcher struct {
	setns func(fd int, nstype int) error
}

// result is what the worker goroutine hands back.
type result struct {
	err      error
	panicked bool
	value    any
}

func (s switcher) do(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netnsx: open %s: %w", path, err)
	}
	defer unix.Close(target)

	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		res := result{err: errors.New("netnsx: fn did not return (runtime.Goexit)")}
		defer func() { done <- res }()

		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			res.err = fmt.Errorf("netnsx: open own netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		defer unix.Close(orig)
		var want unix.Stat_t
		if err := unix.Fstat(orig, &want); err != nil {
			res.err = fmt.Errorf("netnsx: stat own netns: %w", err)
			runtime.UnlockOSThread()
			return
		}
		if err := s.setns(target, unix.CLONE_NEWNET); err != nil {
			// setns(2) either switches or leaves the thread as it was;
			// check rather than trust it.
			res.err = fmt.Errorf("netnsx: enter netns %s: %w", path, err)
			if back(&want) == nil {
				runtime.UnlockOSThread()
			}
			return
		}

		returned := false
		defer func() {
			if !returned {
				if v := recover(); v != nil {
					res = result{panicked: true, value: v}
				}
				return // locked: the thread dies with this goroutine
			}
			serr := s.setns(orig, unix.CLONE_NEWNET)
			if serr == nil {
				serr = back(&want)
			}
			if serr != nil {
				res.err = errors.Join(res.err, fmt.Errorf("netnsx: return from netns %s: %w", path, serr))
				return // locked: the thread dies with this goroutine
			}
			runtime.UnlockOSThread()
		}()
		res.err = fn()
		returned = true
	}()
	r := <-done
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// back reports whether the calling thread's namespace is the one want
// describes.
func back(want *unix.Stat_t) error {
	var now unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &now); err != nil {
		return fmt.Errorf("stat own netns: %w", err)
	}
	if now.Dev != want.Dev || now.Ino != want.Ino {
		return fmt.Errorf("thread is in netns %d:%d, not %d:%d", now.Dev, now.Ino, want.Dev, want.Ino)
	}
	return nil
}
