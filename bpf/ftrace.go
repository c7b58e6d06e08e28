//go:build amd64 && linux

package bpf

import "github.com/cilium/ebpf"

// LoadFtrace returns the collection spec of ftrace.c, the file-event
// tracer (pkg/hooks/fileev loads and attaches it). It is built for
// x86-64 only: syscall numbers and pt_regs are architecture-specific.
func LoadFtrace() (*ebpf.CollectionSpec, error) { return loadFtrace() }

// FtraceObject returns the compiled ftrace.c: pkg/hooks/fileev names the
// pins of a loaded tracer after its digest, so a carbd of another build
// never adopts programs it did not build.
func FtraceObject() []byte { return _FtraceBytes }
