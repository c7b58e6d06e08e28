package staging

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount mounts the layout's overlay at l.Merged with the new mount API
// (fsopen/fsconfig/fsmount/move_mount: each option is passed on its own,
// and the kernel's explanation of a refused option is returned in the
// error), falling back to mount(2) on kernels without it.
func Mount(l *Layout) error {
	fsfd, err := unix.Fsopen(l.FSType, unix.FSOPEN_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) {
		var flags uintptr
		if l.NoDev {
			flags |= unix.MS_NODEV
		}
		if l.NoSUID {
			flags |= unix.MS_NOSUID
		}
		if err := unix.Mount(l.Source, l.Merged, l.FSType, flags, l.MountData()); err != nil {
			return fmt.Errorf("staging: mount overlay at %s: %w", l.Merged, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("staging: fsopen %s: %w", l.FSType, err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", l.Source); err != nil {
		return fmt.Errorf("staging: mount option source: %w%s", err, fsLog(fsfd))
	}
	for _, o := range l.Options {
		if o.Value == "" {
			err = unix.FsconfigSetFlag(fsfd, o.Key)
		} else {
			err = unix.FsconfigSetString(fsfd, o.Key, o.Value)
		}
		if err != nil {
			return fmt.Errorf("staging: mount option %s: %w%s", o, err, fsLog(fsfd))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("staging: create overlay: %w%s", err, fsLog(fsfd))
	}
	var attrs int
	if l.NoDev {
		attrs |= unix.MOUNT_ATTR_NODEV
	}
	if l.NoSUID {
		attrs |= unix.MOUNT_ATTR_NOSUID
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("staging: fsmount: %w%s", err, fsLog(fsfd))
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, l.Merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("staging: move mount to %s: %w", l.Merged, err)
	}
	return nil
}

// fsLog drains the filesystem context's messages (the kernel's reasons
// for refusing a configuration).
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for i := 0; i < 16; i++ {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// Unmount unmounts M. It fails with ErrNotMounted when nothing is
// mounted there and with EBUSY while M is in use (virtiofsd still
// serving it, a sandbox still holding it).
func Unmount(l *Layout) error {
	if err := unix.Unmount(l.Merged, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("%w at %s", ErrNotMounted, l.Merged)
		}
		return fmt.Errorf("staging: unmount %s: %w", l.Merged, err)
	}
	return nil
}
