//go:build linux && amd64

package fileev

import (
	"github.com/cilium/ebpf"

	"github.com/carbd/carbd/bpf"
)

// loadSpec returns the compiled bpf/ftrace.c (x86-64: syscall numbers
// and pt_regs are architecture-specific).
func loadSpec() (*ebpf.CollectionSpec, error) { return bpf.LoadFtrace() }

// ftraceObject is the compiled bpf/ftrace.c, whose digest names its pins.
func ftraceObject() []byte { return bpf.FtraceObject() }
