//go:build linux && !amd64

package fileev

import "fmt"

// runHelper: the traced helper scripts use x86-64 syscalls, like the
// tracer.
func runHelper(string) int {
	fmt.Println("helper: linux/amd64 only")
	return 1
}
