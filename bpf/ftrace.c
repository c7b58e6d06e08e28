//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * ftrace.c: file events from the syscalls of traced processes (the file
 * daemon virtiofsd, or a namespace sandbox's processes).
 *
 * sys_enter remembers the arguments of an interesting syscall of a traced
 * process (in the thread's task-local storage ft_task under tp_btf, in the
 * hash map ft_inflight keyed by thread id under raw_tracepoint); sys_exit
 * pairs them with the
 * return value, describes the file descriptors involved from the task's
 * file table, copies path arguments from user memory, and submits one
 * record to the ring buffer of the process's slot. A record that cannot be
 * reserved, an entry that cannot be remembered and a child that cannot be
 * traced each count in the slot's ft_counters: userspace treats any count
 * as "events were lost, re-scan before committing".
 *
 * One instance serves every sandbox of the host (pkg/hooks/fileev pins it
 * under bpffs; the first carbd loads it, the others reuse it): each
 * sandbox's carbd owns a slot, with its own ring buffer (ft_rings) and
 * read generation (ft_gens), both inner maps it creates and inserts, its
 * settings (ft_slots) and its loss counters. A process is traced by
 * thread group id (ft_pids; children follow when FT_T_FOLLOW is set) or by
 * cgroup v2 id (ft_cgroups: the cgroup and its descendants; ft_levels says
 * at which levels to look), and the entry names its slot: a sandbox's
 * records reach only its own ring.
 *
 * Every program exists twice: as tp_btf (preferred) and as raw_tracepoint
 * (for kernels that refuse BTF-typed tracing). Userspace loads one set.
 * Syscall numbers and pt_regs are x86-64.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "ftrace_events.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FT_MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct ft_slot);
} ft_slots SEC(".maps");

/* The template of a slot's ring buffer. Each carbd creates its own ring
 * (of the size it wants) and inserts it at its slot. */
struct ft_ring {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 12);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, FT_MAX_SLOTS);
	__type(key, __u32);
	__array(values, struct ft_ring);
} ft_rings SEC(".maps");

/* The template of a slot's read generation: the map shared with the
 * sandbox's TC program (bpf/include/carbd/read_gen.h, the same layout),
 * inserted at its slot. */
struct ft_gen {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, FT_MAX_SLOTS);
	__type(key, __u32);
	__array(values, struct ft_gen);
} ft_gens SEC(".maps");

/* Bit L set: some traced cgroup sits at level L (the union of the levels
 * in ft_cgroups, written by userspace). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ft_levels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); /* tgid */
	__type(value, struct ft_target);
} ft_pids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64); /* cgroup v2 id */
	__type(value, struct ft_target);
} ft_cgroups SEC(".maps");

struct ft_inflight {
	__u64 args[6];
	__u32 nr;
	__u32 target;
	__u32 slot;
	__u32 epoch; /* the slot's, at entry */
	__u32 live;  /* ft_task: set at entry, cleared at exit */
	struct ft_fdinfo fi; /* close: the descriptor before it goes away */
};

/* The syscall in flight of each traced thread (a thread has at most one),
 * for the tp_btf programs: the thread's own storage, found from the task
 * without hashing, kept from entry to exit and freed with the task. One
 * lookup at entry and one at exit, against a hash update, a lookup and a
 * delete; right whatever CPU the thread moves to between the two (a
 * per-CPU slot would not be). The entry is marked live at entry and not
 * live at exit instead of being deleted. Untraced threads have none. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ft_inflight);
} ft_task SEC(".maps");

/* The same for the raw_tracepoint programs (which take no BTF-typed task
 * pointer), by thread id, shared by every slot. Userspace creates only
 * the map of the mechanism it loads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32); /* thread id */
	__type(value, struct ft_inflight);
} ft_inflight SEC(".maps");

/* Scratch for a data record: it is built here and copied into the ring
 * with bpf_ringbuf_output at its real size (a reservation's size must be
 * a constant; a 4 KiB reservation for a 100-byte write would take the
 * ring's room and the reader's copying for nothing). Programs on the
 * sys_exit tracepoint do not nest on a CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ft_data_event);
} ft_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FT_MAX_SLOTS * FT_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ft_counters SEC(".maps");

/* Not used at run time: keeps the wire types and enums in the object's
 * BTF, where pkg/hooks/fileev's layout test checks them. */
struct ft_wire {
	struct ft_path_event ev;
	struct ft_path1_event ev1;
	struct ft_data_event dev;
	enum ft_kind kind;
	enum ft_op op;
	enum ft_flag flag;
	enum ft_counter counter;
	struct ft_target target;
	struct ft_slot slot;
};
const struct ft_wire *unused_ft_wire __attribute__((unused));

#define ARG_NONE -1
#define ARG_RET 6 /* the descriptor is the return value */

/* How one syscall is recorded. */
struct ft_sc {
	__u8 op;
	__s8 path0, path1; /* argument index of a user string */
	__s8 fd0, fd1;     /* argument index of a descriptor, or ARG_RET */
	__s8 uoff0, uoff1; /* argument index of a user loff_t * to read at exit */
	__u8 how;          /* openat2: read struct open_how at args[2] */
};

#define SC(o, p0, p1, f0, f1)                                                  \
	do {                                                                   \
		sc->op = (o);                                                  \
		sc->path0 = (p0);                                              \
		sc->path1 = (p1);                                              \
		sc->fd0 = (f0);                                                \
		sc->fd1 = (f1);                                                \
	} while (0)

#define N ARG_NONE
#define R ARG_RET

/* describe fills sc for syscall nr and returns its op, FT_OP_NONE for a
 * syscall that is not traced. */
static __always_inline int describe(long nr, struct ft_sc *sc)
{
	sc->op = FT_OP_NONE;
	sc->uoff0 = N;
	sc->uoff1 = N;
	sc->how = 0;
	switch (nr) {
	case 0:   /* read(fd, buf, count) */
	case 17:  /* pread64(fd, buf, count, pos) */
	case 19:  /* readv(fd, iov, cnt) */
	case 295: /* preadv(fd, iov, cnt, pos_l, pos_h) */
	case 327: /* preadv2(fd, iov, cnt, pos_l, pos_h, flags) */
		SC(FT_OP_READ, N, N, 0, N);
		break;
	case 1:   /* write */
	case 18:  /* pwrite64 */
	case 20:  /* writev */
	case 296: /* pwritev */
	case 328: /* pwritev2 */
		SC(FT_OP_WRITE, N, N, 0, N);
		break;
	case 2:  /* open(path, flags, mode) */
	case 85: /* creat(path, mode) */
		SC(FT_OP_OPEN, 0, N, R, N);
		break;
	case 257: /* openat(dirfd, path, flags, mode) */
		SC(FT_OP_OPEN, 1, N, R, 0);
		break;
	case 437: /* openat2(dirfd, path, how, size) */
		SC(FT_OP_OPEN, 1, N, R, 0);
		sc->how = 1;
		break;
	case 304: /* open_by_handle_at(mount_fd, handle, flags) */
		SC(FT_OP_OPEN, N, N, R, 0);
		break;
	case 3: /* close(fd) */
		SC(FT_OP_CLOSE, N, N, N, N);
		break;
	case 9: /* mmap(addr, len, prot, flags, fd, off) */
		SC(FT_OP_MMAP, N, N, 4, N);
		break;
	case 32:  /* dup(old) */
	case 33:  /* dup2(old, new) */
	case 292: /* dup3(old, new, flags) */
	case 72:  /* fcntl(fd, F_DUPFD[_CLOEXEC], min) */
		SC(FT_OP_DUP, N, N, R, N);
		break;
	case 40: /* sendfile(out, in, off*, count) */
		SC(FT_OP_COPY, N, N, 1, 0);
		sc->uoff0 = 2;
		break;
	case 275: /* splice(in, off_in*, out, off_out*, len, flags) */
	case 326: /* copy_file_range(in, off_in*, out, off_out*, len, flags) */
		SC(FT_OP_COPY, N, N, 0, 2);
		sc->uoff0 = 1;
		sc->uoff1 = 3;
		break;
	case 76: /* truncate(path, len) */
		SC(FT_OP_TRUNCATE, 0, N, N, N);
		break;
	case 77: /* ftruncate(fd, len) */
		SC(FT_OP_TRUNCATE, N, N, 0, N);
		break;
	case 285: /* fallocate(fd, mode, off, len) */
		SC(FT_OP_FALLOCATE, N, N, 0, N);
		break;
	case 80: /* chdir(path) */
		SC(FT_OP_CHDIR, 0, N, N, N);
		break;
	case 81: /* fchdir(fd) */
		SC(FT_OP_CHDIR, N, N, 0, N);
		break;
	case 82: /* rename(old, new) */
		SC(FT_OP_RENAME, 0, 1, N, N);
		break;
	case 264: /* renameat(olddirfd, old, newdirfd, new) */
	case 316: /* renameat2(olddirfd, old, newdirfd, new, flags) */
		SC(FT_OP_RENAME, 1, 3, 0, 2);
		break;
	case 83: /* mkdir(path, mode) */
		SC(FT_OP_MKDIR, 0, N, N, N);
		break;
	case 258: /* mkdirat(dirfd, path, mode) */
		SC(FT_OP_MKDIR, 1, N, 0, N);
		break;
	case 84: /* rmdir(path) */
		SC(FT_OP_RMDIR, 0, N, N, N);
		break;
	case 86: /* link(old, new) */
		SC(FT_OP_LINK, 0, 1, N, N);
		break;
	case 265: /* linkat(olddirfd, old, newdirfd, new, flags) */
		SC(FT_OP_LINK, 1, 3, 0, 2);
		break;
	case 87: /* unlink(path) */
		SC(FT_OP_UNLINK, 0, N, N, N);
		break;
	case 263: /* unlinkat(dirfd, path, flags) */
		SC(FT_OP_UNLINK, 1, N, 0, N);
		break;
	case 88: /* symlink(target, linkpath) */
		SC(FT_OP_SYMLINK, 0, 1, N, N);
		break;
	case 266: /* symlinkat(target, newdirfd, linkpath) */
		SC(FT_OP_SYMLINK, 0, 2, 1, N);
		break;
	case 90: /* chmod(path, mode) */
		SC(FT_OP_CHMOD, 0, N, N, N);
		break;
	case 91: /* fchmod(fd, mode) */
		SC(FT_OP_CHMOD, N, N, 0, N);
		break;
	case 268: /* fchmodat(dirfd, path, mode) */
	case 452: /* fchmodat2(dirfd, path, mode, flags) */
		SC(FT_OP_CHMOD, 1, N, 0, N);
		break;
	case 92: /* chown(path, uid, gid) */
	case 94: /* lchown(path, uid, gid) */
		SC(FT_OP_CHOWN, 0, N, N, N);
		break;
	case 93: /* fchown(fd, uid, gid) */
		SC(FT_OP_CHOWN, N, N, 0, N);
		break;
	case 260: /* fchownat(dirfd, path, uid, gid, flags) */
		SC(FT_OP_CHOWN, 1, N, 0, N);
		break;
	case 133: /* mknod(path, mode, dev) */
		SC(FT_OP_MKNOD, 0, N, N, N);
		break;
	case 259: /* mknodat(dirfd, path, mode, dev) */
		SC(FT_OP_MKNOD, 1, N, 0, N);
		break;
	case 188: /* setxattr(path, name, value, size, flags) */
	case 189: /* lsetxattr */
		SC(FT_OP_SETXATTR, 0, 1, N, N);
		break;
	case 190: /* fsetxattr(fd, name, value, size, flags) */
		SC(FT_OP_SETXATTR, N, 1, 0, N);
		break;
	case 463: /* setxattrat(dirfd, path, at_flags, name, args, size) */
		SC(FT_OP_SETXATTR, 1, 3, 0, N);
		break;
	case 197: /* removexattr(path, name) */
	case 198: /* lremovexattr */
		SC(FT_OP_RMXATTR, 0, 1, N, N);
		break;
	case 199: /* fremovexattr(fd, name) */
		SC(FT_OP_RMXATTR, N, 1, 0, N);
		break;
	case 466: /* removexattrat(dirfd, path, at_flags, name) */
		SC(FT_OP_RMXATTR, 1, 3, 0, N);
		break;
	}
	return sc->op;
}

#undef N
#undef R

/* slot_of returns the settings of slot, or NULL. */
static __always_inline struct ft_slot *slot_of(__u32 slot)
{
	return bpf_map_lookup_elem(&ft_slots, &slot);
}

/* ring_of returns the ring buffer of slot, or NULL while the slot has
 * none (being set up or torn down: a record then counts as ring full). */
static __always_inline void *ring_of(__u32 slot)
{
	return bpf_map_lookup_elem(&ft_rings, &slot);
}

/* wakeup is the submit flag of a record of size bytes for ring rb of
 * slot: see struct ft_slot. reserved: the record is reserved already
 * (bpf_ringbuf_submit), so the ring's unread bytes include it; otherwise
 * (bpf_ringbuf_output) they do not yet. The byte threshold wakes the
 * reader once, with the record that takes the unread bytes over it, not
 * with every record while they stay over it: a reader that lags is awake
 * already (or woken by the period), and each forced wake-up is an
 * irq_work, a self-IPI (a VM exit under virtualisation) in the traced
 * process. */
static __always_inline __u64 wakeup(__u32 slot, void *rb, __u64 size, int reserved)
{
	struct ft_slot *s = slot_of(slot);
	if (!s)
		return 0;
	__u64 period = s->wakeup_ns;
	if (!period)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 after = bpf_ringbuf_query(rb, BPF_RB_AVAIL_DATA);
	if (!reserved)
		after += size;
	__u64 before = after > size ? after - size : 0;
	if (now - s->last_wakeup >= period ||
	    (after >= s->wakeup_bytes && before < s->wakeup_bytes)) {
		s->last_wakeup = now;
		return BPF_RB_FORCE_WAKEUP;
	}
	return BPF_RB_NO_WAKEUP;
}

static __always_inline void count(__u32 slot, __u32 idx)
{
	if (slot >= FT_MAX_SLOTS || idx >= FT_C_MAX)
		return;
	__u32 key = slot * FT_C_MAX + idx;
	__u64 *c = bpf_map_lookup_elem(&ft_counters, &key);
	if (c)
		*c += 1;
}

/* bump_read_gen: the agent of slot may have read something new
 * (read_gen.h). It comes after the record is submitted (or the loss
 * counted): a reader that sees the new generation and then syncs finds
 * the record before its marker. The add is atomic, a full barrier on
 * x86-64. */
static __always_inline void bump_read_gen(__u32 slot)
{
	void *inner = bpf_map_lookup_elem(&ft_gens, &slot);
	if (!inner)
		return;
	__u32 zero = 0;
	__u64 *g = bpf_map_lookup_elem(inner, &zero);
	if (g)
		__sync_fetch_and_add(g, 1);
}

/* count_loss counts a loss; a loss may hide a read, so it bumps too. */
static __always_inline void count_loss(__u32 slot, __u32 idx)
{
	count(slot, idx);
	bump_read_gen(slot);
}

static __always_inline int reads_op(__u8 op)
{
	return op == FT_OP_READ || op == FT_OP_MMAP || op == FT_OP_COPY;
}

/* lookup_target returns the entry that traces process tgid, or NULL. */
static __always_inline struct ft_target *lookup_target(__u32 tgid)
{
	struct ft_target *t = bpf_map_lookup_elem(&ft_pids, &tgid);
	if (t)
		return t;
	__u32 zero = 0;
	__u32 *lv = bpf_map_lookup_elem(&ft_levels, &zero);
	__u32 levels = lv ? *lv : 0;
	if (!levels)
		return NULL;
	for (int lvl = 0; lvl < FT_MAX_CGROUP_LEVEL; lvl++) {
		if (!(levels & (1u << lvl)))
			continue;
		__u64 id = bpf_get_current_ancestor_cgroup_id(lvl);
		if (!id)
			break; /* deeper than the current cgroup */
		t = bpf_map_lookup_elem(&ft_cgroups, &id);
		if (t)
			return t;
	}
	return NULL;
}

/* traced returns the target of the current process, or NULL; a slot's
 * owner (carbd) is never traced in its own slot, and an entry left by a
 * slot's earlier owner (another epoch) traces nothing. */
static __always_inline struct ft_target *traced(__u32 tgid)
{
	struct ft_target *t = lookup_target(tgid);
	if (!t)
		return NULL;
	struct ft_slot *s = slot_of(t->slot);
	if (!s || s->owner_tgid == tgid || s->epoch != t->epoch)
		return NULL;
	return t;
}

/* bpf_rdonly_cast (a kfunc of every program type since Linux 6.2) makes
 * an address a read-only BTF pointer of the given kernel type, whose
 * fields are then plain loads (faults read as zero) instead of one
 * bpf_probe_read_kernel each. Only the tp_btf programs use it: a kernel
 * without it refuses them and the raw_tracepoint set is loaded. */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

/* fd_walk_btf is fd_info's tp_btf branch: it reads the task's file table
 * with plain loads (one probe read for the descriptor's slot, whose type
 * the verifier does not track); it returns 0 when fd names an open file.
 * It starts from the task cast to a read-only (untrusted) pointer: each
 * load of a pointer through the trusted task that bpf_get_current_task_btf
 * returns makes the verifier look a type up by name in the kernel's BTF
 * (btf_nested_type_is_trusted, a linear search), at every path. */
static __always_inline int fd_walk_btf(long fd, struct ft_fdinfo *fi)
{
	struct task_struct *task = bpf_rdonly_cast(bpf_get_current_task_btf(),
						   bpf_core_type_id_kernel(struct task_struct));
	struct files_struct *files = task->files;
	if (!files)
		return -1;
	struct fdtable *fdt = files->fdt;
	if (!fdt || (__u32)fd >= fdt->max_fds)
		return -1;
	struct file **fds = fdt->fd;
	struct file *fp = NULL;
	if (bpf_probe_read_kernel(&fp, sizeof(fp), &fds[fd]) || !fp)
		return -1;
	struct file *f = bpf_rdonly_cast(fp, bpf_core_type_id_kernel(struct file));
	struct inode *ino = f->f_inode;
	if (!ino)
		return -1;
	fi->mode = ino->i_mode;
	fi->ino = ino->i_ino;
	fi->dev = ino->i_sb->s_dev;
	fi->pos = f->f_pos;
	fi->flags = f->f_flags;
	return 0;
}

/* fd_info_btf is fd_walk_btf as a global function, which the verifier
 * checks once, on its own, rather than on every path that reaches a call:
 * inlined at ft_exit_btf's two descriptors from the trusted task, on its
 * ~1,000 states' paths, the walk took the program's verification from 10
 * to 46 ms, most of a cold tracer's load; as a call from the untrusted
 * cast, 6.6 ms (docs/file-events.md, Load time). The call costs a few
 * nanoseconds per exit. fi is never NULL (the check is the verifier's). */
__noinline int fd_info_btf(long fd, struct ft_fdinfo *fi)
{
	if (!fi)
		return -1;
	return fd_walk_btf(fd, fi);
}

/* How fd_info reads the file table: with bpf_probe_read_kernel
 * (raw_tracepoint), with plain loads inlined (tp_btf, one call site) or
 * through fd_info_btf (tp_btf, call sites on many paths). */
enum { FD_PROBE, FD_BTF_INLINE, FD_BTF_CALL };

/* fd_info describes descriptor fd of the current task from its file
 * table the way how says; it returns 0 when fd names an open file. */
static __always_inline int fd_info(long fd, struct ft_fdinfo *fi, int how)
{
	fi->fd = (__s32)fd;
	if (fd < 0 || fd > 0x7fffffff)
		return -1;
	if (how == FD_BTF_INLINE)
		return fd_walk_btf(fd, fi);
	if (how == FD_BTF_CALL)
		return fd_info_btf(fd, fi);
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return -1;
	if ((__u32)fd >= BPF_CORE_READ(fdt, max_fds))
		return -1;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return -1;
	struct inode *ino = BPF_CORE_READ(f, f_inode);
	if (!ino)
		return -1;
	fi->mode = BPF_CORE_READ(ino, i_mode);
	fi->ino = BPF_CORE_READ(ino, i_ino);
	fi->dev = BPF_CORE_READ(ino, i_sb, s_dev);
	fi->pos = BPF_CORE_READ(f, f_pos);
	fi->flags = BPF_CORE_READ(f, f_flags);
	return 0;
}

#define S_IFMT_ 00170000
#define S_IFREG_ 0100000
#define S_IFDIR_ 0040000
#define S_IFLNK_ 0120000

static __always_inline int is_reg(__u32 mode) { return (mode & S_IFMT_) == S_IFREG_; }

static __always_inline __u64 arg_at(const __u64 *args, int i)
{
	switch (i) {
	case 0: return args[0];
	case 1: return args[1];
	case 2: return args[2];
	case 3: return args[3];
	case 4: return args[4];
	case 5: return args[5];
	}
	return 0;
}

/* read_args copies the syscall's arguments from regs; btf: regs is a
 * BTF-typed pointer (tp_btf), read with plain loads. */
static __always_inline void read_args(struct pt_regs *regs, __u64 *args, int btf)
{
	/* x86-64 syscall convention: di si dx r10 r8 r9 */
	if (btf) {
		args[0] = regs->di;
		args[1] = regs->si;
		args[2] = regs->dx;
		args[3] = regs->r10;
		args[4] = regs->r8;
		args[5] = regs->r9;
		return;
	}
	args[0] = BPF_CORE_READ(regs, di);
	args[1] = BPF_CORE_READ(regs, si);
	args[2] = BPF_CORE_READ(regs, dx);
	args[3] = BPF_CORE_READ(regs, r10);
	args[4] = BPF_CORE_READ(regs, r8);
	args[5] = BPF_CORE_READ(regs, r9);
}

#define TS_COMPAT_ 0x0002           /* x86 thread_info.status: ia32 syscall active */
#define X32_SYSCALL_BIT_ 0x40000000 /* x32 ABI syscall numbers */

/* on_enter: btf says the program may read the task directly (tp_btf). */
static __always_inline int on_enter(struct pt_regs *regs, long nr, int btf)
{
	struct ft_sc sc;
	/* ia32 (int 0x80) and x32 syscalls have other numbers and argument
	 * layouts: they are not decoded, but a traced process making them
	 * counts as a loss, so the daemon re-scans. */
	__u32 status;
	if (btf)
		status = bpf_get_current_task_btf()->thread_info.status;
	else
		status = BPF_CORE_READ((struct task_struct *)bpf_get_current_task(), thread_info.status);
	if ((status & TS_COMPAT_) || (nr & X32_SYSCALL_BIT_)) {
		struct ft_target *ct = traced(bpf_get_current_pid_tgid() >> 32);
		if (ct)
			count_loss(ct->slot, FT_C_COMPAT);
		return 0;
	}
	if (describe(nr, &sc) == FT_OP_NONE)
		return 0;
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct ft_target *t = traced(pid_tgid >> 32);
	if (!t)
		return 0;

	struct ft_inflight local = {};
	struct ft_inflight *in = &local;
	if (btf) {
		in = bpf_task_storage_get(&ft_task, bpf_get_current_task_btf(), 0,
					  BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!in) {
			/* Counted before the syscall runs: a read it makes
			 * is in the loss a sync reports. */
			if (reads_op(sc.op))
				count_loss(t->slot, FT_C_INFLIGHT);
			else
				count(t->slot, FT_C_INFLIGHT);
			return 0;
		}
		in->live = 0;
	}
	read_args(regs, in->args, btf);
	in->nr = nr;
	in->target = t->id;
	in->slot = t->slot;
	in->epoch = t->epoch;
	in->fi.fd = -1;
	switch (sc.op) {
	case FT_OP_DUP:
		if (nr == 72 && (__u32)in->args[1] != 0 /* F_DUPFD */ &&
		    (__u32)in->args[1] != 1030 /* F_DUPFD_CLOEXEC */)
			return 0;
		break;
	case FT_OP_MMAP:
		/* only file mappings: fd >= 0 and not MAP_ANONYMOUS */
		if ((__s32)in->args[4] < 0 || (in->args[3] & 0x20))
			return 0;
		break;
	case FT_OP_CLOSE: {
		if (fd_info((long)(__s32)in->args[0], &in->fi, btf ? FD_BTF_INLINE : FD_PROBE))
			return 0;
		__u32 fmt = in->fi.mode & S_IFMT_;
		if (fmt != S_IFREG_ && fmt != S_IFDIR_ && fmt != S_IFLNK_)
			return 0;
		break;
	}
	}
	if (btf) {
		in->live = 1;
		return 0;
	}
	__u32 tid = (__u32)pid_tgid;
	if (bpf_map_update_elem(&ft_inflight, &tid, in, BPF_ANY)) {
		/* Counted before the syscall runs, as above. */
		if (reads_op(sc.op))
			count_loss(in->slot, FT_C_INFLIGHT);
		else
			count(in->slot, FT_C_INFLIGHT);
	}
	return 0;
}

static __always_inline void fill_header(struct ft_event *e, const struct ft_inflight *in,
					 const struct ft_sc *sc, __u64 pid_tgid, long ret)
{
	e->ts = bpf_ktime_get_ns();
	e->tgid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->target = in->target;
	e->kind = FT_K_SYSCALL;
	e->op = sc->op;
	e->nr = in->nr;
	e->flags = 0;
	e->ret = ret;
	__builtin_memcpy(e->args, in->args, sizeof(e->args));
	e->aux[0] = 0;
	e->aux[1] = 0;
	e->plen[0] = 0;
	e->plen[1] = 0;
	e->dlen = 0;
}

/* describe_fd describes the descriptor named by which (an argument
 * index or ARG_RET) into fi; it returns 1 when fi describes an open file. */
static __always_inline int describe_fd(struct ft_fdinfo *fi, int which,
					const struct ft_inflight *in, long ret, int btf)
{
	long fd;
	fi->fd = -1;
	if (which == ARG_NONE)
		return 0;
	if (which == ARG_RET)
		fd = ret;
	else
		fd = (long)(__s32)arg_at(in->args, which);
	return fd_info(fd, fi, btf ? FD_BTF_CALL : FD_PROBE) == 0;
}

static __always_inline void read_aux(struct ft_event *e, const struct ft_sc *sc,
				     const struct ft_inflight *in)
{
	if (sc->how) {
		__u64 how[2]; /* struct open_how: flags, mode */
		const void *p = (const void *)in->args[2];
		if (p && bpf_probe_read_user(how, sizeof(how), p) == 0) {
			e->aux[0] = how[0];
			e->aux[1] = how[1];
			e->flags |= FT_F_AUX0 | FT_F_AUX1;
		} else {
			e->flags |= FT_F_AUX_FAULT;
		}
		return;
	}
	if (sc->uoff0 != ARG_NONE) {
		const void *p = (const void *)arg_at(in->args, sc->uoff0);
		if (p) {
			if (bpf_probe_read_user(&e->aux[0], sizeof(__u64), p) == 0)
				e->flags |= FT_F_AUX0;
			else
				e->flags |= FT_F_AUX_FAULT;
		}
	}
	if (sc->uoff1 != ARG_NONE) {
		const void *p = (const void *)arg_at(in->args, sc->uoff1);
		if (p) {
			if (bpf_probe_read_user(&e->aux[1], sizeof(__u64), p) == 0)
				e->flags |= FT_F_AUX1;
			else
				e->flags |= FT_F_AUX_FAULT;
		}
	}
}

/* read_path copies the user string at p into buf, path argument i of
 * record e (FT_PATH_MAX bytes, NUL included): its length, or the
 * truncated or fault flag. */
static __always_inline void read_path(struct ft_event *e, char *buf, int i, __u64 p)
{
	buf[0] = 0;
	if (!p)
		return;
	long n = bpf_probe_read_user_str(buf, FT_PATH_MAX, (const char *)p);
	if (n < 0) {
		e->flags |= i ? FT_F_P1_FAULT : FT_F_P0_FAULT;
		buf[0] = 0;
		return;
	}
	e->plen[i] = n;
	if (n >= FT_PATH_MAX)
		e->flags |= i ? FT_F_P1_TRUNC : FT_F_P0_TRUNC;
}

/* on_exit: btf as for on_enter. */
static __always_inline int on_exit(struct pt_regs *regs, long ret, int btf)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)pid_tgid;
	struct ft_inflight *in;
	if (btf) {
		in = bpf_task_storage_get(&ft_task, bpf_get_current_task_btf(), 0, 0);
		if (!in || !in->live)
			return 0;
	} else {
		in = bpf_map_lookup_elem(&ft_inflight, &tid);
		if (!in)
			return 0;
	}
	struct ft_sc sc;
	long nr = btf ? regs->orig_ax : BPF_CORE_READ(regs, orig_ax);
	if (nr != in->nr || describe(nr, &sc) == FT_OP_NONE)
		goto out; /* a stale entry (the exit of its syscall was not seen) */

	/* Describe the descriptors before reserving: data operations on
	 * pipes, sockets, eventfds and the like are dropped here. */
	struct ft_fdinfo fi[2] = {};
	__u32 fl = 0;
	if (sc.op == FT_OP_CLOSE) {
		fi[0] = in->fi;
		fi[1].fd = -1;
		fl |= FT_F_FI0;
	} else {
		if (describe_fd(&fi[0], sc.fd0, in, ret, btf))
			fl |= FT_F_FI0;
		if (describe_fd(&fi[1], sc.fd1, in, ret, btf))
			fl |= FT_F_FI1;
	}
	if (sc.op == FT_OP_READ || sc.op == FT_OP_WRITE || sc.op == FT_OP_MMAP ||
	    sc.op == FT_OP_COPY) {
		int reg = ((fl & FT_F_FI0) && is_reg(fi[0].mode)) ||
			  ((fl & FT_F_FI1) && is_reg(fi[1].mode));
		if (!reg)
			goto out;
	}
	__u32 slot = in->slot;
	struct ft_slot *cfg = slot_of(slot);
	if (!cfg || cfg->epoch != in->epoch)
		goto out; /* the slot changed owner during the syscall */
	__u32 gen_dev = cfg->gen_dev;
	__u32 data_max = cfg->data_max;
	/* A read of a regular file of M (a read or a copy that returned
	 * bytes, from fi[0]; any mmap, whose pages may be made readable
	 * later without a syscall traced here). */
	int gen = reads_op(sc.op) && (fl & FT_F_FI0) && is_reg(fi[0].mode) &&
		  (!gen_dev || fi[0].dev == gen_dev) &&
		  (sc.op == FT_OP_MMAP || ret > 0);
	void *rb = ring_of(slot);
	if (!rb) {
		count(slot, FT_C_RINGBUF);
		if (gen)
			bump_read_gen(slot);
		goto out;
	}

	/* A read or write of one buffer on M's filesystem that moved bytes
	 * carries them: the buffer holds exactly what was read or written
	 * now, whatever happens to the file before the reader gets to it. */
	if ((in->nr == 0 || in->nr == 1 || in->nr == 17 || in->nr == 18) && ret > 0 &&
	    data_max && (fl & FT_F_FI0) && is_reg(fi[0].mode) &&
	    (!gen_dev || fi[0].dev == gen_dev)) {
		__u32 zero = 0;
		struct ft_data_event *de = bpf_map_lookup_elem(&ft_scratch, &zero);
		if (de) {
			fill_header(&de->h, in, &sc, pid_tgid, ret);
			de->h.fi[0] = fi[0];
			de->h.fi[1] = fi[1];
			de->h.flags |= fl;
			__u64 n = data_max;
			if (n > FT_DATA_MAX)
				n = FT_DATA_MAX;
			if (n > (__u64)ret)
				n = ret;
			__u64 size = sizeof(de->h);
			/* Only while the unread bytes, with this record,
			 * stay under twice the wake-up threshold (at most half
			 * the ring; an eighth when there is no threshold): a
			 * reader that lags (a loaded machine) gets header-only
			 * records, 176 bytes as before, and reads content
			 * back, instead of a ring filled many times faster
			 * and lost records (each of which counts as reading
			 * everything). The reader is woken at the threshold,
			 * before capture stops (until 2026-12-02 both were an
			 * eighth of the ring: capture stopped the moment the
			 * reader was woken, and every record it had not read
			 * by the time it ran was read back, or lost to an
			 * unlink). */
			__u64 ring = bpf_ringbuf_query(rb, BPF_RB_RING_SIZE);
			__u64 cap = cfg->wakeup_bytes ? 2 * cfg->wakeup_bytes : ring / 8;
			if (cap > ring / 2)
				cap = ring / 2;
			if (bpf_ringbuf_query(rb, BPF_RB_AVAIL_DATA) + sizeof(*de) > cap)
				n = 0;
			if (n && bpf_probe_read_user(de->data, n, (const void *)in->args[1]) == 0) {
				de->h.dlen = n;
				de->h.flags |= FT_F_DATA;
				if (n == (__u64)ret)
					de->h.flags |= FT_F_DATA_WHOLE;
				size += n;
			}
			/* else: a record without data; the reader reads back */
			if (bpf_ringbuf_output(rb, de, size, wakeup(slot, rb, size, 0)))
				count(slot, FT_C_RINGBUF);
			if (gen)
				bump_read_gen(slot);
			goto out;
		}
	}

	if (sc.path0 == ARG_NONE && sc.path1 == ARG_NONE) {
		struct ft_event *e = bpf_ringbuf_reserve(rb, sizeof(*e), 0);
		if (!e) {
			count(slot, FT_C_RINGBUF);
			if (gen)
				bump_read_gen(slot);
			goto out;
		}
		fill_header(e, in, &sc, pid_tgid, ret);
		e->fi[0] = fi[0];
		e->fi[1] = fi[1];
		e->flags |= fl;
		read_aux(e, &sc, in);
		bpf_ringbuf_submit(e, wakeup(slot, rb, sizeof(*e), 1));
		if (gen)
			bump_read_gen(slot);
		goto out;
	}

	/* A one-path syscall (most of them) takes a record with one path
	 * slot: 688 bytes through the ring and the reader's copy, not 1,200. */
	if (sc.path1 == ARG_NONE) {
		struct ft_path1_event *p1 = bpf_ringbuf_reserve(rb, sizeof(*p1), 0);
		if (!p1) {
			count(slot, FT_C_RINGBUF);
			goto out;
		}
		fill_header(&p1->h, in, &sc, pid_tgid, ret);
		p1->h.fi[0] = fi[0];
		p1->h.fi[1] = fi[1];
		p1->h.flags |= FT_F_PATHS | FT_F_PATH1 | fl;
		read_aux(&p1->h, &sc, in);
		read_path(&p1->h, p1->path, 0, arg_at(in->args, sc.path0));
		bpf_ringbuf_submit(p1, wakeup(slot, rb, sizeof(*p1), 1));
		goto out;
	}
	struct ft_path_event *pe = bpf_ringbuf_reserve(rb, sizeof(*pe), 0);
	if (!pe) {
		count(slot, FT_C_RINGBUF);
		goto out;
	}
	fill_header(&pe->h, in, &sc, pid_tgid, ret);
	pe->h.fi[0] = fi[0];
	pe->h.fi[1] = fi[1];
	pe->h.flags |= FT_F_PATHS | fl;
	read_aux(&pe->h, &sc, in);
	pe->path[0][0] = 0;
	if (sc.path0 != ARG_NONE)
		read_path(&pe->h, pe->path[0], 0, arg_at(in->args, sc.path0));
	read_path(&pe->h, pe->path[1], 1, arg_at(in->args, sc.path1));
	bpf_ringbuf_submit(pe, wakeup(slot, rb, sizeof(*pe), 1));
out:
	if (btf)
		in->live = 0;
	else
		bpf_map_delete_elem(&ft_inflight, &tid);
	return 0;
}

static __always_inline void emit_simple(__u16 kind, __u32 tgid, __u32 tid,
					const struct ft_target *t, __u64 arg0)
{
	__u32 slot = t->slot;
	__u32 target = t->id;
	void *rb = ring_of(slot);
	if (!rb) {
		count(slot, FT_C_RINGBUF);
		return;
	}
	struct ft_event *e = bpf_ringbuf_reserve(rb, sizeof(*e), 0);
	if (!e) {
		count(slot, FT_C_RINGBUF);
		return;
	}
	__builtin_memset(e, 0, sizeof(*e));
	e->ts = bpf_ktime_get_ns();
	e->tgid = tgid;
	e->tid = tid;
	e->target = target;
	e->kind = kind;
	e->args[0] = arg0;
	e->fi[0].fd = -1;
	e->fi[1].fd = -1;
	bpf_ringbuf_submit(e, wakeup(slot, rb, sizeof(*e), 1));
}

/* on_fork, on_task_exit: btf as for on_enter (the tasks are BTF-typed). */
static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child, int btf)
{
	__u32 ptgid = btf ? parent->tgid : BPF_CORE_READ(parent, tgid);
	__u32 ctgid = btf ? child->tgid : BPF_CORE_READ(child, tgid);
	if (ptgid == ctgid)
		return 0; /* a new thread */
	struct ft_target *t = traced(ptgid);
	if (!t)
		return 0;
	struct ft_target copy = *t;
	/* Children of a pid target follow it; children of a cgroup target
	 * are in the cgroup already. */
	struct ft_target *byPid = bpf_map_lookup_elem(&ft_pids, &ptgid);
	if (byPid && (byPid->flags & FT_T_FOLLOW)) {
		if (bpf_map_update_elem(&ft_pids, &ctgid, &copy, BPF_ANY))
			count_loss(copy.slot, FT_C_FORK);
	}
	emit_simple(FT_K_FORK, ptgid, btf ? parent->pid : BPF_CORE_READ(parent, pid), &copy, ctgid);
	return 0;
}

static __always_inline int on_task_exit(struct task_struct *task, int btf)
{
	__u32 tid = btf ? task->pid : BPF_CORE_READ(task, pid);
	__u32 tgid = btf ? task->tgid : BPF_CORE_READ(task, tgid);
	if (!btf) /* a task's ft_task storage goes with it */
		bpf_map_delete_elem(&ft_inflight, &tid);
	if ((btf ? task->signal->live.counter : BPF_CORE_READ(task, signal, live.counter)) != 0)
		return 0; /* other threads of the group live on */
	struct ft_target *t = traced(tgid);
	if (!t)
		return 0;
	struct ft_target copy = *t;
	bpf_map_delete_elem(&ft_pids, &tgid);
	emit_simple(FT_K_EXIT, tgid, tid, &copy, 0);
	return 0;
}

/* tp_btf programs (BTF-typed raw tracepoints). */

SEC("tp_btf/sys_enter")
int BPF_PROG(ft_enter_btf, struct pt_regs *regs, long id)
{
	return on_enter(regs, id, 1);
}

SEC("tp_btf/sys_exit")
int BPF_PROG(ft_exit_btf, struct pt_regs *regs, long ret)
{
	return on_exit(regs, ret, 1);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(ft_fork_btf, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child, 1);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(ft_pexit_btf, struct task_struct *task)
{
	return on_task_exit(task, 1);
}

/* raw_tracepoint programs: the same, with untyped arguments. */

SEC("raw_tp/sys_enter")
int ft_enter_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_enter((struct pt_regs *)ctx->args[0], (long)ctx->args[1], 0);
}

SEC("raw_tp/sys_exit")
int ft_exit_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_exit((struct pt_regs *)ctx->args[0], (long)ctx->args[1], 0);
}

SEC("raw_tp/sched_process_fork")
int ft_fork_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_fork((struct task_struct *)ctx->args[0], (struct task_struct *)ctx->args[1], 0);
}

SEC("raw_tp/sched_process_exit")
int ft_pexit_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_task_exit((struct task_struct *)ctx->args[0], 0);
}

/* ft_marker is run by userspace (BPF_PROG_TEST_RUN) with two arguments,
 * a cookie and a slot: its record in the slot's ring tells the reader
 * that everything submitted before it has been read. It always wakes the
 * reader: it is the flush point of the records submitted without a
 * wake-up. It returns 1 when the record was submitted, 0 when the ring
 * buffer is full (userspace retries; not a loss), 2 when the slot has no
 * ring. */
SEC("raw_tp")
int ft_marker(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 slot = (__u32)ctx->args[1];
	void *rb = ring_of(slot);
	if (!rb)
		return 2;
	struct ft_event *e = bpf_ringbuf_reserve(rb, sizeof(*e), 0);
	if (!e)
		return 0;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts = bpf_ktime_get_ns();
	e->tgid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->kind = FT_K_MARKER;
	e->args[0] = ctx->args[0];
	e->fi[0].fd = -1;
	e->fi[1].fd = -1;
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 1;
}
