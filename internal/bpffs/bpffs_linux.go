// Package bpffs makes pin directories on a bpf filesystem.
package bpffs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Default is where the kernel's bpf filesystem is mounted by convention.
const Default = "/sys/fs/bpf"

var mountMu sync.Mutex

// Ensure makes dir, which must lie on a bpf filesystem. When dir lies
// below Default and nothing is mounted there, it mounts it (another
// process mounting it at the same time is not an error).
func Ensure(dir string) error {
	mountMu.Lock()
	defer mountMu.Unlock()
	p := filepath.Clean(dir)
	for {
		if _, err := os.Stat(p); err == nil {
			break
		}
		parent := filepath.Dir(p)
		if parent == p {
			break
		}
		p = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", p, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		if p != Default || !strings.HasPrefix(filepath.Clean(dir)+"/", Default+"/") {
			return fmt.Errorf("pin dir %s is not on a bpf filesystem (mount -t bpf bpf DIR)", dir)
		}
		if err := unix.Mount("bpf", Default, "bpf", 0, "mode=0700"); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount bpffs on %s: %w", Default, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make pin dir: %w", err)
	}
	return nil
}
