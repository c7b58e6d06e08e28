// Package fileev turns the file syscalls of the host processes that serve
// the agent's working directory into decide.Events: virtiofsd for a
// microVM, or the processes of a namespace sandbox that has the merged
// view M bind-mounted.
//
// BPF programs on the sys_enter and sys_exit tracepoints (bpf/ftrace.c)
// record the file syscalls of traced processes — by pid (children follow)
// or by cgroup v2 — into a ring buffer: opens, reads, writes, truncation,
// unlink, rename, mkdir, rmdir, symlink, link, chmod, chown, xattrs,
// copies (copy_file_range, sendfile, splice), file mmaps, and the
// bookkeeping that makes descriptors resolvable (close, dup, chdir, fork,
// exit). Tracer.Run reads the ring, resolves descriptors and relative
// paths to paths relative to M (its own descriptor table per process,
// /proc when it did not see a descriptor opened), reads back from M the
// bytes each read returned or each write stored (bounded by
// Config.MaxContent, 1 MiB by default), and hands each Record with its
// decide.Events to the caller (see Events for the mapping).
//
// The event stream is not the record of what is staged: the overlay's
// upper layer is (pkg/staging). Reads feed provenance; writes are early
// notice of effects. A record the kernel could not deliver (ring buffer
// full, map full) is counted (Lost, Stats), reported in-band as a
// KindLoss record, and makes TakeRescan true, as does a record that could
// not be resolved (Record.Malformed): the daemon then re-scans the upper
// layer before committing. Sync waits until every record of syscalls that
// returned before it was called has been handled; it is the flush point of
// the batched wake-ups (Config.WakeupInterval: the kernel side wakes Run
// at most once per interval, Sync's marker always), so a decision that
// syncs first never waits for a batch.
//
// One tracer serves the whole host: the first Tracer (of any carbd
// process) loads and attaches the programs and pins them under
// Config.PinDir; later ones open the pins, skipping verification and the
// kernel BTF, and each takes a slot of its own (its ring buffer, read
// generation, settings and loss counters), held by a flock so that a
// crashed process's slot is reclaimed by the next one to start. The last
// Tracer to close unpins it. docs/file-events.md, "One tracer per host".
//
// StartVirtiofsd runs /usr/lib/qemu/virtiofsd (one per VM boot), in a
// cgroup when asked, so tracing that cgroup sees it from its first
// syscall.
//
// docs/file-events.md has the wire format, the per-operation fields and
// the known limits.
//
// # Requirements
//
// Linux on x86-64 (syscall numbers and pt_regs are architecture-specific;
// elsewhere New fails), root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN), BTF at
// /sys/kernel/btf/vmlinux, tp_btf or raw_tracepoint programs (New probes
// tp_btf first; Tracer.Mechanism says which is in use and why the other
// was refused), ring buffers (5.8) in maps of maps, a bpf filesystem
// (/sys/fs/bpf, mounted if missing), openat2 (5.6), cgroup v2 for cgroup
// targets. No tracefs, kprobes, fentry or BPF-LSM needed.
//
// # Testing
//
// The pure parts (wire decoding, resolution against a fake /proc, the
// mapping to decide.Events) have unit tests and a fuzz target
// (FuzzDecodeEvent, corpus in testdata/fuzz). The privileged tests load
// the real programs with each mechanism and trace a child (the test binary
// re-executed) that performs every operation class with raw syscalls in a
// plain directory and in an overlay mount, asserting the exact record and
// event sequences; they check that untraced processes yield nothing, that
// children follow (pid and cgroup), that a one-page ring buffer overflows
// into the loss counter, that cut paths are malformed, and that virtiofsd
// starts, is traced in its cgroup through its sandbox fork, and stops.
// Benchmarks compare a 4 KiB file cycle with and without tracing and
// measure the reader's records per second.
package fileev
