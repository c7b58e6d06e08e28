/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * ftrace_events.h: the wire format between bpf/ftrace.c and
 * pkg/hooks/fileev. Every record in a slot's ring buffer (ft_rings) starts with
 * struct ft_event; records for syscalls that take path arguments are a
 * struct ft_path1_event (one path argument, the first) or a struct
 * ft_path_event (two, or only the second). pkg/hooks/fileev/wire.go mirrors these layouts and
 * a test checks the offsets against the BTF of the compiled object.
 */
#ifndef CARBD_FTRACE_EVENTS_H
#define CARBD_FTRACE_EVENTS_H

/* Bytes copied for each path argument, NUL included. A path that fills
 * the buffer is flagged FT_F_P0_TRUNC / FT_F_P1_TRUNC. */
#define FT_PATH_MAX 512

/* Most bytes of a read's or a write's buffer copied into its record
 * (struct ft_data_event). */
#define FT_DATA_MAX 4096

/* Deepest cgroup level a traced cgroup may sit at (bits of
 * ft_levels). */
#define FT_MAX_CGROUP_LEVEL 16

/* Slots of the shared tracer: one per sandbox (per Tracer) on the host.
 * A slot has its own ring buffer (ft_rings), read generation (ft_gens),
 * settings and wake-up state (ft_slots) and loss counters (ft_counters). */
#define FT_MAX_SLOTS 256

/* Record kinds. */
enum ft_kind {
	FT_K_SYSCALL = 1, /* a traced syscall returned */
	FT_K_FORK = 2,    /* a traced process forked: args[0] = child tgid */
	FT_K_EXIT = 3,    /* the last thread of a traced process exited */
	FT_K_MARKER = 4,  /* userspace's sync marker: args[0] = cookie */
};

/* Operation classes; the syscall number (nr) says which variant. */
enum ft_op {
	FT_OP_NONE = 0,
	FT_OP_OPEN = 1,       /* open openat openat2 creat open_by_handle_at */
	FT_OP_READ = 2,       /* read pread64 readv preadv preadv2 */
	FT_OP_WRITE = 3,      /* write pwrite64 writev pwritev pwritev2 */
	FT_OP_TRUNCATE = 4,   /* truncate ftruncate */
	FT_OP_FALLOCATE = 5,  /* fallocate */
	FT_OP_UNLINK = 6,     /* unlink unlinkat (AT_REMOVEDIR: an rmdir) */
	FT_OP_RENAME = 7,     /* rename renameat renameat2 */
	FT_OP_MKDIR = 8,      /* mkdir mkdirat */
	FT_OP_RMDIR = 9,      /* rmdir */
	FT_OP_SYMLINK = 10,   /* symlink symlinkat */
	FT_OP_LINK = 11,      /* link linkat */
	FT_OP_CHMOD = 12,     /* chmod fchmod fchmodat fchmodat2 */
	FT_OP_CHOWN = 13,     /* chown fchown lchown fchownat */
	FT_OP_SETXATTR = 14,  /* setxattr lsetxattr fsetxattr setxattrat */
	FT_OP_RMXATTR = 15,   /* removexattr lremovexattr fremovexattr removexattrat */
	FT_OP_CLOSE = 16,     /* close (files, directories, O_PATH fds only) */
	FT_OP_DUP = 17,       /* dup dup2 dup3 fcntl(F_DUPFD, F_DUPFD_CLOEXEC) */
	FT_OP_CHDIR = 18,     /* chdir fchdir */
	FT_OP_MMAP = 19,      /* mmap of a regular file */
	FT_OP_COPY = 20,      /* copy_file_range sendfile splice */
	FT_OP_MKNOD = 21,     /* mknod mknodat */
	FT_OP_MAX = 22,
};

/* Flags of struct ft_event. */
enum ft_flag {
	FT_F_FI0 = 1 << 0,       /* fi[0] describes an open file */
	FT_F_FI1 = 1 << 1,       /* fi[1] describes an open file */
	FT_F_P0_TRUNC = 1 << 2,  /* path[0] filled its buffer: maybe cut */
	FT_F_P1_TRUNC = 1 << 3,
	FT_F_P0_FAULT = 1 << 4,  /* path[0] could not be read */
	FT_F_P1_FAULT = 1 << 5,
	FT_F_AUX0 = 1 << 6,      /* aux[0] holds a value read from the process */
	FT_F_AUX1 = 1 << 7,
	FT_F_AUX_FAULT = 1 << 8, /* a user value (offset, open_how) could not be read */
	FT_F_PATHS = 1 << 9,     /* the record is a struct ft_path_event */
	FT_F_DATA = 1 << 10,     /* the record is a struct ft_data_event: dlen bytes follow */
	FT_F_DATA_WHOLE = 1 << 11, /* with FT_F_DATA: dlen == ret, the bytes are all the call moved */
	FT_F_PATH1 = 1 << 12,    /* with FT_F_PATHS: a struct ft_path1_event, path[0] only */
};

/* Indices of the per-CPU loss counters of a slot (map ft_counters: the
 * counter of slot s is at s * FT_C_MAX + index). */
enum ft_counter {
	FT_C_RINGBUF = 0,  /* a record could not be reserved: ring buffer full */
	FT_C_INFLIGHT = 1, /* a syscall entry could not be remembered: map full */
	FT_C_FORK = 2,     /* a forked child could not be traced: map full */
	FT_C_COMPAT = 3,   /* a traced process made an ia32 or x32 syscall: not decoded */
	FT_C_MAX = 4,
};

/* What the kernel says about one file descriptor of the syscall, read
 * from the task's file table at syscall exit (at entry for close). */
struct ft_fdinfo {
	__u64 ino;   /* inode number */
	__s64 pos;   /* file position */
	__u32 dev;   /* superblock device, kernel encoding (major << 20 | minor) */
	__u32 mode;  /* inode mode: type and permission bits */
	__u32 flags; /* open flags of the file (f_flags) */
	__s32 fd;    /* the descriptor described; -1 for none */
};

struct ft_event {
	__u64 ts;      /* bpf_ktime_get_ns at syscall exit */
	__u32 tgid;    /* process (thread group) id, in the initial pid namespace */
	__u32 tid;     /* thread id */
	__u32 target;  /* id of the Trace target that matched */
	__u16 kind;    /* enum ft_kind */
	__u16 op;      /* enum ft_op */
	__u32 nr;      /* syscall number (x86-64) */
	__u32 flags;   /* enum ft_flag */
	__s64 ret;     /* syscall return value */
	__u64 args[6]; /* raw syscall arguments at entry */
	__u64 aux[2];  /* values read from the process at exit: updated offsets, open_how */
	struct ft_fdinfo fi[2];
	__u16 plen[2]; /* bytes copied into path[i], NUL included; 0 = none */
	__u32 dlen;    /* FT_F_DATA: bytes of data[] in the record; else 0 */
};

/* A syscall with two path arguments (rename, link, symlink, setxattr:
 * the path and the attribute's name), or with only the second (fsetxattr,
 * fremovexattr: the name). */
struct ft_path_event {
	struct ft_event h;
	char path[2][FT_PATH_MAX];
};

/* A syscall with one path argument, the first (open, unlink, mkdir, chmod
 * and most others): FT_F_PATH1 is set, plen[1] is 0, and the record is
 * 688 bytes instead of ft_path_event's 1,200. */
struct ft_path1_event {
	struct ft_event h;
	char path[FT_PATH_MAX];
};

/* A read or write (read, pread64, write, pwrite64) of a regular file on
 * M's filesystem that moved bytes: the first dlen bytes of the call's
 * buffer, copied at sys_exit (what the read returned, what the write
 * stored). The record in the ring is sizeof(struct ft_event) + dlen
 * bytes long, not the whole struct. */
struct ft_data_event {
	struct ft_event h;
	__u8 data[FT_DATA_MAX];
};

/* Value of ft_pids and ft_cgroups. */
struct ft_target {
	__u32 id;    /* the target's id, reported in every record */
	__u32 flags; /* FT_T_FOLLOW: children of a traced pid are traced too */
	__u32 slot;  /* the slot whose ring gets the records */
	__u32 level; /* ft_cgroups: the cgroup's level (ft_levels is their union) */
	__u32 epoch; /* the slot's epoch when the entry was made: a stale entry
		      * of a slot's previous owner traces nothing */
};

/* Value of ft_slots: one sandbox's settings (written by its carbd when it
 * takes the slot) and the programs' wake-up state for its ring. */
struct ft_slot {
	/* Wake-ups of the slot's reader are batched: a record is submitted
	 * with BPF_RB_FORCE_WAKEUP when the last forced wake-up is at least
	 * wakeup_ns old, or when it takes the bytes waiting in the ring to
	 * wakeup_bytes or over (once per crossing, not for every record
	 * while they stay over: each forced wake-up is a self-IPI in the
	 * traced process); otherwise with BPF_RB_NO_WAKEUP. 0: the
	 * kernel's default. */
	__u64 wakeup_ns;
	__u64 wakeup_bytes;
	/* bpf_ktime_get_ns of the last forced wake-up (read by userspace).
	 * Racy between CPUs by design: the worst case is one extra wake-up. */
	__u64 last_wakeup;
	/* The owning carbd's tgid, never traced in this slot (its content
	 * reads would feed back into the stream). */
	__u32 owner_tgid;
	/* The device (kernel encoding) of the traced tree M: only reads of
	 * regular files on it bump the read generation and carry data; 0:
	 * any regular file. */
	__u32 gen_dev;
	/* Most bytes of a read's or write's buffer copied into its record,
	 * at most FT_DATA_MAX; 0 copies none. */
	__u32 data_max;
	/* Moves each time the slot is taken: entries (targets, syscalls in
	 * flight) of an earlier owner never reach the new owner's ring. */
	__u32 epoch;
};

#define FT_T_FOLLOW 1

#endif /* CARBD_FTRACE_EVENTS_H */
