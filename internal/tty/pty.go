package tty

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal: term is its terminal side (what a
// program writes to, as to a console), ctl its controller side (what a
// terminal emulator reads the program's output from). Tests use it to
// check what a command draws for a person watching. The caller closes
// both.
func OpenPTY() (term, ctl *os.File, err error) {
	ctl, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("tty: open pseudo-terminal: %w", err)
	}
	defer func() {
		if err != nil {
			ctl.Close()
		}
	}()
	if err := unix.IoctlSetPointerInt(int(ctl.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		return nil, nil, fmt.Errorf("tty: unlock pseudo-terminal: %w", err)
	}
	n, err := unix.IoctlGetInt(int(ctl.Fd()), unix.TIOCGPTN)
	if err != nil {
		return nil, nil, fmt.Errorf("tty: pseudo-terminal number: %w", err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("tty: open pseudo-terminal: %w", err)
	}
	return term, ctl, nil
}
