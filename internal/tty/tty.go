// Package tty says whether output goes to a terminal, so that commands
// draw progress lines and colour only for a person watching, never into
// pipes, files or logs. Colour also honours NO_COLOR
// (https://no-color.org) and TERM=dumb.
//
// It needs nothing but the file's descriptor (the TCGETS ioctl); it is
// tested with a pipe and a real pseudo-terminal.
package tty

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// IsTerminal reports whether w is a file open on a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// Colour reports whether colour codes may be written to w: w is a
// terminal, NO_COLOR is unset or empty and TERM is not "dumb". getenv is
// os.Getenv unless nil.
func Colour(w io.Writer, getenv func(string) string) bool {
	if getenv == nil {
		getenv = os.Getenv
	}
	return getenv("NO_COLOR") == "" && getenv("TERM") != "dumb" && IsTerminal(w)
}
