package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// IndexDir holds the sandbox index locks. It is machine-wide whatever the
// state directory: addresses, interface names and queue numbers are global
// to the host.
const IndexDir = "/run/carbd-index"

// claimIndex gives the sandbox an index unique among the live sandboxes of
// the host (addresses, queue number): an flock'ed file per index, held for
// the daemon's life, so a crashed daemon's index is free again. A sandbox
// gets back the index it had before when it is free.
//
// It first claims the sandbox id itself (claimID): the host-wide names a
// run creates and a crashed run's clean-up removes (its cgroup, TC pins,
// netfilter chains and tables) are derived from the id.
func claimIndex(stateDir, id string) (func() error, int, error) {
	dir := IndexDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, err
	}
	unlockID, err := claimID(dir, id)
	if err != nil {
		return nil, 0, err
	}
	unlock, i, err := claimSlot(dir, stateDir, id)
	if err != nil {
		unlockID()
		return nil, 0, err
	}
	return func() error {
		err := unlock()
		if e := unlockID(); err == nil {
			err = e
		}
		return err
	}, i, nil
}

// claimID holds the host-wide lock of one sandbox id for the daemon's
// life. Without it a second run with the same id (an explicit --id reused
// for another working directory) would take the live run's resources for
// a crashed run's and remove them: kill its agent's cgroup, unpin its TC
// program, delete its queue rules. The second run is refused instead.
//
// carbd cleanup removes a lock file while holding it: a lock taken on a
// file no longer at its path guards nothing, so it is taken again on the
// file there now.
func claimID(dir, id string) (func() error, error) {
	var f *os.File
	for {
		var err error
		f, err = os.OpenFile(filepath.Join(dir, "id-"+id+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("sandbox id %s: %w", id, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			holder, _ := os.ReadFile(f.Name())
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("sandbox id %s is in use by another carbd on this host (pid %s); give this run another --id", id, strings.TrimSpace(string(holder)))
			}
			return nil, fmt.Errorf("sandbox id %s: lock: %w", id, err)
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(f.Name(), &now) == nil && held.Dev == now.Dev && held.Ino == now.Ino {
			break
		}
		f.Close()
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	// A run that ends removes its lock file while it still holds the lock
	// (a run waiting on the same file sees it gone and takes a new one,
	// above): only a crashed run's file stays, for carbd cleanup to find.
	// A host running a fresh id per run kept one file per run forever.
	return func() error {
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(f.Name(), &now) == nil && held.Dev == now.Dev && held.Ino == now.Ino {
			if err := os.Remove(f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
				f.Close()
				return fmt.Errorf("sandbox id %s: remove its lock: %w", id, err)
			}
		}
		return f.Close()
	}, nil
}

// claimSlot is claimIndex's index proper.
func claimSlot(dir, stateDir, id string) (func() error, int, error) {
	remember := filepath.Join(stateDir, "sandboxes", id, "index")
	try := func(i int) (func() error, bool) {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(i)+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, false
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			return nil, false
		}
		_ = f.Truncate(0)
		_, _ = f.WriteString(id + "\n")
		_ = os.WriteFile(remember, []byte(strconv.Itoa(i)), 0o600)
		return f.Close, true
	}
	if b, err := os.ReadFile(remember); err == nil {
		if i, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && i >= 0 && i <= netns.MaxIndex {
			if unlock, ok := try(i); ok {
				return unlock, i, nil
			}
		}
	}
	for i := 0; i <= netns.MaxIndex; i++ {
		if unlock, ok := try(i); ok {
			return unlock, i, nil
		}
	}
	return nil, 0, fmt.Errorf("no free sandbox index under %s", dir)
}
