/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The read generation of a sandbox, shared by bpf/ftrace.c (which bumps
 * it) and bpf/tc.c (which compares it). carbd creates the map once per
 * sandbox (pkg/hooks/tcx NewReadGen) and gives it to both: the sandbox's
 * TC program is loaded with it in place of the map declared here
 * (cilium/ebpf MapReplacements); the file tracer, one instance for the
 * whole host, is not loaded per sandbox and finds it in ft_gens, an
 * array of maps at the sandbox's slot, where carbd inserts it when it
 * takes the slot (pkg/hooks/fileev Config.ReadGen; bpf/ftrace.c's struct
 * ft_gen is this map's layout). So the two programs see one counter.
 *
 * The file tracer adds one, after the record of the syscall is in the
 * ring buffer, for every traced syscall that can raise what the agent has
 * read: a read, copy (source) or mmap of a regular file on the traced
 * tree's filesystem, and every loss (a record not reserved, a syscall not
 * remembered, an ia32/x32 syscall, a child not traced). The TC program
 * queues a data packet of a flow released to its end (CARBD_VF_READ_GEN)
 * whose verdict carries another generation: the agent has read since the
 * release was decided. Userspace reads the generation before it brings the
 * tracer up to date and decides, so every bump it has seen has its record
 * (or its loss count) in front of the sync marker.
 */
#ifndef CARBD_READ_GEN_H
#define CARBD_READ_GEN_H

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} read_gen SEC(".maps");

#endif /* CARBD_READ_GEN_H */
