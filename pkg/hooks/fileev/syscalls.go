package fileev

import "fmt"

// Op is the class of a traced file operation (enum ft_op in
// bpf/include/ftrace_events.h); Record.Syscall names the variant.
type Op uint16

const (
	OpNone        Op = iota
	OpOpen           // open openat openat2 creat open_by_handle_at
	OpRead           // read pread64 readv preadv preadv2
	OpWrite          // write pwrite64 writev pwritev pwritev2
	OpTruncate       // truncate ftruncate
	OpFallocate      // fallocate
	OpUnlink         // unlink unlinkat
	OpRename         // rename renameat renameat2
	OpMkdir          // mkdir mkdirat
	OpRmdir          // rmdir, unlinkat(AT_REMOVEDIR)
	OpSymlink        // symlink symlinkat
	OpLink           // link linkat
	OpChmod          // chmod fchmod fchmodat fchmodat2
	OpChown          // chown fchown lchown fchownat
	OpSetxattr       // setxattr lsetxattr fsetxattr setxattrat
	OpRemovexattr    // removexattr lremovexattr fremovexattr removexattrat
	OpClose          // close of a file, directory or O_PATH descriptor
	OpDup            // dup dup2 dup3 fcntl(F_DUPFD, F_DUPFD_CLOEXEC)
	OpChdir          // chdir fchdir
	OpMmap           // mmap of a regular file
	OpCopy           // copy_file_range sendfile splice
	OpMknod          // mknod mknodat
	opMax
)

var opNames = [...]string{OpNone: "none", OpOpen: "open", OpRead: "read", OpWrite: "write",
	OpTruncate: "truncate", OpFallocate: "fallocate", OpUnlink: "unlink", OpRename: "rename",
	OpMkdir: "mkdir", OpRmdir: "rmdir", OpSymlink: "symlink", OpLink: "link", OpChmod: "chmod",
	OpChown: "chown", OpSetxattr: "setxattr", OpRemovexattr: "removexattr", OpClose: "close",
	OpDup: "dup", OpChdir: "chdir", OpMmap: "mmap", OpCopy: "copy", OpMknod: "mknod"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint16(o))
}

// syscallNames are the x86-64 syscalls bpf/ftrace.c records, by number.
// The BPF side and this table must agree: TestSyscallTable checks the
// numbers against golang.org/x/sys/unix on amd64.
var syscallNames = map[uint32]string{
	0: "read", 1: "write", 2: "open", 3: "close", 9: "mmap",
	17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
	32: "dup", 33: "dup2", 40: "sendfile", 72: "fcntl",
	76: "truncate", 77: "ftruncate", 80: "chdir", 81: "fchdir",
	82: "rename", 83: "mkdir", 84: "rmdir", 85: "creat", 86: "link",
	87: "unlink", 88: "symlink", 90: "chmod", 91: "fchmod",
	92: "chown", 93: "fchown", 94: "lchown", 133: "mknod",
	188: "setxattr", 189: "lsetxattr", 190: "fsetxattr",
	197: "removexattr", 198: "lremovexattr", 199: "fremovexattr",
	257: "openat", 258: "mkdirat", 259: "mknodat", 260: "fchownat",
	263: "unlinkat", 264: "renameat", 265: "linkat", 266: "symlinkat",
	268: "fchmodat", 275: "splice", 285: "fallocate", 292: "dup3",
	295: "preadv", 296: "pwritev", 304: "open_by_handle_at",
	316: "renameat2", 326: "copy_file_range", 327: "preadv2", 328: "pwritev2",
	437: "openat2", 452: "fchmodat2", 463: "setxattrat", 466: "removexattrat",
}

// Linux flag values the decoder needs (the same on every architecture
// this package supports; kept here so the pure code needs no x/sys/unix).
const (
	atFDCWD       = -100
	atRemoveDir   = 0x200
	atEmptyPath   = 0x1000
	oAccMode      = 0x3
	oWronly       = 0x1
	oRdwr         = 0x2
	oCreat        = 0x40
	oTrunc        = 0x200
	oTmpfile      = 0x410000
	protRead      = 0x1
	protWrite     = 0x2
	mapShared     = 0x01
	mapSharedVal  = 0x03
	sIFMT         = 0o170000
	sIFREG        = 0o100000
	sIFDIR        = 0o040000
	sIFLNK        = 0o120000
	sIFCHR        = 0o020000
	sIFBLK        = 0o060000
	errnoENOENT   = 2
	rwfOffsetNone = ^uint64(0) // preadv2/pwritev2 offset -1: use the file position
)
