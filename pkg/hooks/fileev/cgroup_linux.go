//go:build linux

package fileev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/mountinfo"
)

// Cgroup is a cgroup v2 directory: its id is what
// bpf_get_current_cgroup_id returns for its processes, its level the depth
// below the hierarchy's root (carbd assumes the initial cgroup namespace).
type Cgroup struct {
	Path  string
	ID    uint64
	Level int
}

// Cgroup2Mount returns where the cgroup v2 hierarchy is mounted
// (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones).
func Cgroup2Mount() (string, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return "", fmt.Errorf("fileev: find cgroup2 mount: %w", err)
	}
	for _, m := range ms {
		if m.FSType == "cgroup2" {
			return m.Point, nil
		}
	}
	return "", errors.New("fileev: no cgroup2 hierarchy is mounted")
}

// OpenCgroup describes an existing cgroup v2 directory.
func OpenCgroup(path string) (*Cgroup, error) {
	mnt, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	path = filepath.Clean(path)
	rel, err := filepath.Rel(mnt, path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("fileev: cgroup %s is not below the cgroup2 mount %s", path, mnt)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("fileev: cgroup %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("fileev: cgroup %s is not a directory", path)
	}
	level := 0
	if rel != "." {
		level = len(strings.Split(rel, "/"))
	}
	return &Cgroup{Path: path, ID: st.Ino, Level: level}, nil
}

// NewCgroup creates the cgroup v2 directory name (one level, no slashes)
// below the cgroup2 mount.
func NewCgroup(name string) (*Cgroup, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("fileev: cgroup name %q", name)
	}
	mnt, err := Cgroup2Mount()
	if err != nil {
		return nil, err
	}
	p := filepath.Join(mnt, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("fileev: create cgroup: %w", err)
	}
	return OpenCgroup(p)
}

// Open opens the cgroup directory, for SysProcAttr.CgroupFD (the child
// starts inside the cgroup: nothing it does escapes tracing).
func (c *Cgroup) Open() (*os.File, error) {
	f, err := os.OpenFile(c.Path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fileev: open cgroup: %w", err)
	}
	return f, nil
}

// AddProc moves a process into the cgroup.
func (c *Cgroup) AddProc(pid int) error {
	if err := os.WriteFile(filepath.Join(c.Path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("fileev: move pid %d to cgroup %s: %w", pid, c.Path, err)
	}
	return nil
}

// Kill kills every process of the cgroup (cgroup.kill, Linux 5.14).
func (c *Cgroup) Kill() error {
	if err := os.WriteFile(filepath.Join(c.Path, "cgroup.kill"), []byte("1"), 0); err != nil {
		return fmt.Errorf("fileev: kill cgroup %s: %w", c.Path, err)
	}
	return nil
}

// Remove removes the cgroup directory; it must have no processes left.
func (c *Cgroup) Remove() error {
	if err := os.Remove(c.Path); err != nil {
		return fmt.Errorf("fileev: remove cgroup: %w", err)
	}
	return nil
}
