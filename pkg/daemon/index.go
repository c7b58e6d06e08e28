package daemon

import (
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
func claimIndex(stateDir, id string) (func() error, int, error) {
	dir := IndexDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, 0, err
	}
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
