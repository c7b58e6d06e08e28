//go:build linux && !amd64

package fileev

import (
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
)

// loadSpec fails: bpf/ftrace.c is built for x86-64 only (its syscall
// numbers and pt_regs layout are architecture-specific).
func loadSpec() (*ebpf.CollectionSpec, error) {
	return nil, fmt.Errorf("fileev: the file tracer is built for linux/amd64, not %s", runtime.GOARCH)
}

func ftraceObject() []byte { return nil }
