//go:build linux

package fileev

import (
	"bufio"
	"fmt"
	"os"
)

// slotHolderEnv makes the test binary a carbd stand-in that takes a slot
// of the shared tracer pinned in the variable's value, traces the cgroup
// in slotHolderCgroupEnv, prints "slot N" and waits for stdin to close
// (the test kills it instead: a crashed carbd).
const (
	slotHolderEnv       = "FILEEV_SLOT_HOLDER"
	slotHolderCgroupEnv = "FILEEV_SLOT_HOLDER_CGROUP"
)

func runSlotHolder(pinDir string) int {
	root, err := os.MkdirTemp("", "fileev-holder")
	if err != nil {
		fmt.Println("holder:", err)
		return 1
	}
	defer os.RemoveAll(root)
	tr, err := New(Config{Root: root, PinDir: pinDir})
	if err != nil {
		fmt.Println("holder:", err)
		return 1
	}
	defer tr.Close()
	if _, err := tr.Trace(Target{Cgroup: os.Getenv(slotHolderCgroupEnv)}); err != nil {
		fmt.Println("holder:", err)
		return 1
	}
	fmt.Printf("slot %d\n", tr.sl.n)
	bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}
