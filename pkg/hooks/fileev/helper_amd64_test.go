//go:build linux && amd64

package fileev

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The test binary doubles as the traced child: with FILEEV_HELPER set it
// runs a script in its working directory instead of the tests. It prints
// "ready" once the Go runtime has started (the runtime reads a few files
// at start-up), reads one line from stdin before starting (the parent
// traces it meanwhile), and prints "ok" or the error when done. Scripts
// use raw syscalls so the expected event sequence is exact; the parent
// turns off the runtime's periodic cgroup CPU limit reads (GODEBUG).

func runHelper(script string) int {
	fmt.Println("ready")
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		fmt.Println("helper: read go:", err)
		return 1
	}
	var err error
	switch script {
	case "ops":
		err = helperOps()
	case "burst":
		err = helperBurst(2000)
	case "long":
		err = helperLongPath()
	case "fork":
		err = helperFork()
	case "bench":
		err = helperBench(in, true)
	case "bench-nofsync":
		err = helperBench(in, false)
	case "readloop":
		err = helperReadLoop(in)
	case "migrate":
		err = helperMigrate()
	default:
		err = fmt.Errorf("unknown script %q", script)
	}
	if err != nil {
		fmt.Println("helper:", err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// sys is a raw syscall that returns the result or -errno, like the
// kernel reports it.
func sys(nr uintptr, a ...uintptr) int64 {
	var args [6]uintptr
	copy(args[:], a)
	r, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	if e != 0 {
		return -int64(e)
	}
	return int64(r)
}

func cstr(s string) uintptr {
	p, err := unix.BytePtrFromString(s)
	if err != nil {
		panic(err)
	}
	return uintptr(unsafe.Pointer(p))
}

func bufp(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

const fdcwd = uintptr(0xffffffffffffff9c) // AT_FDCWD (-100) as a register value

// must panics when a step that has to succeed did not: the parent then
// sees "helper: ..." instead of "ok".
func must(step string, r int64) uintptr {
	if r < 0 {
		panic(fmt.Sprintf("%s: %v", step, syscall.Errno(-r)))
	}
	return uintptr(r)
}

// helperOps performs every operation class once; opsExpected in
// fileev_linux_test.go lists the records they produce, in order.
func helperOps() (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	fd := must("openat a", sys(unix.SYS_OPENAT, fdcwd, cstr("a.txt"), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644))
	must("write", sys(unix.SYS_WRITE, fd, bufp([]byte("hello world\n")), 12))
	must("pwrite64", sys(unix.SYS_PWRITE64, fd, bufp([]byte("HELLO")), 5, 0))
	iov := []unix.Iovec{{Base: &[]byte("ab")[0], Len: 2}, {Base: &[]byte("cd")[0], Len: 2}}
	must("writev", sys(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), 2))
	must("ftruncate", sys(unix.SYS_FTRUNCATE, fd, 10))
	must("fallocate", sys(unix.SYS_FALLOCATE, fd, 0, 0, 100))
	must("fchmod", sys(unix.SYS_FCHMOD, fd, 0o600))
	must("fsetxattr", sys(unix.SYS_FSETXATTR, fd, cstr("user.k"), bufp([]byte("v")), 1, 0))
	must("close", sys(unix.SYS_CLOSE, fd))

	fd = must("open a", sys(unix.SYS_OPEN, cstr("a.txt"), unix.O_RDONLY|unix.O_CLOEXEC))
	buf := make([]byte, 16)
	must("read", sys(unix.SYS_READ, fd, bufp(buf), 4))
	must("pread64", sys(unix.SYS_PREAD64, fd, bufp(buf), 3, 5))
	riov := []unix.Iovec{{Base: &buf[0], Len: 2}, {Base: &buf[8], Len: 2}}
	must("readv", sys(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&riov[0])), 2))
	fd2 := must("dup", sys(unix.SYS_DUP, fd))
	must("read dup", sys(unix.SYS_READ, fd2, bufp(buf), 2))
	addr := must("mmap", sys(unix.SYS_MMAP, 0, 4096, unix.PROT_READ, unix.MAP_PRIVATE, fd, 0))
	must("munmap", sys(unix.SYS_MUNMAP, addr, 4096))
	must("close dup", sys(unix.SYS_CLOSE, fd2))
	must("close a", sys(unix.SYS_CLOSE, fd))

	must("mkdir", sys(unix.SYS_MKDIR, cstr("sub"), 0o755))
	dfd := must("openat sub", sys(unix.SYS_OPENAT, fdcwd, cstr("sub"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC))
	must("mkdirat", sys(unix.SYS_MKDIRAT, dfd, cstr("inner"), 0o700))
	fd = must("openat b", sys(unix.SYS_OPENAT, dfd, cstr("b.txt"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o640))
	must("write b", sys(unix.SYS_WRITE, fd, bufp([]byte("bee")), 3))
	must("close b", sys(unix.SYS_CLOSE, fd))
	must("renameat2", sys(unix.SYS_RENAMEAT2, dfd, cstr("b.txt"), fdcwd, cstr("c.txt"), 0))
	must("rename", sys(unix.SYS_RENAME, cstr("c.txt"), cstr("d.txt")))
	must("renameat", sys(unix.SYS_RENAMEAT, dfd, cstr("inner"), dfd, cstr("inner2")))
	must("link", sys(unix.SYS_LINK, cstr("d.txt"), cstr("e.txt")))
	must("linkat", sys(unix.SYS_LINKAT, fdcwd, cstr("d.txt"), dfd, cstr("f.txt"), 0))
	must("symlink", sys(unix.SYS_SYMLINK, cstr("d.txt"), cstr("s.lnk")))
	must("symlinkat", sys(unix.SYS_SYMLINKAT, cstr("../d.txt"), dfd, cstr("t.lnk")))
	must("chmod", sys(unix.SYS_CHMOD, cstr("d.txt"), 0o640))
	must("fchmodat", sys(unix.SYS_FCHMODAT, dfd, cstr("f.txt"), 0o600))
	must("chown", sys(unix.SYS_CHOWN, cstr("d.txt"), 0, 0))
	must("lchown", sys(unix.SYS_LCHOWN, cstr("s.lnk"), ^uintptr(0), 0))
	must("fchownat", sys(unix.SYS_FCHOWNAT, dfd, cstr("f.txt"), 0, ^uintptr(0), 0))
	must("truncate", sys(unix.SYS_TRUNCATE, cstr("d.txt"), 2))
	must("setxattr", sys(unix.SYS_SETXATTR, cstr("d.txt"), cstr("user.x"), bufp([]byte("1")), 1, 0))
	must("removexattr", sys(unix.SYS_REMOVEXATTR, cstr("d.txt"), cstr("user.x")))

	g := must("creat", sys(unix.SYS_CREAT, cstr("g.txt"), 0o600))
	src := must("openat d", sys(unix.SYS_OPENAT, fdcwd, cstr("d.txt"), unix.O_RDONLY|unix.O_CLOEXEC))
	must("copy_file_range", sys(unix.SYS_COPY_FILE_RANGE, src, 0, g, 0, 2, 0))
	var off int64
	must("sendfile", sys(unix.SYS_SENDFILE, g, src, uintptr(unsafe.Pointer(&off)), 2))
	must("close src", sys(unix.SYS_CLOSE, src))
	must("close g", sys(unix.SYS_CLOSE, g))

	must("unlink", sys(unix.SYS_UNLINK, cstr("e.txt")))
	must("unlinkat", sys(unix.SYS_UNLINKAT, fdcwd, cstr("s.lnk"), 0))
	must("unlinkat sub", sys(unix.SYS_UNLINKAT, dfd, cstr("t.lnk"), 0))
	must("unlinkat rmdir", sys(unix.SYS_UNLINKAT, dfd, cstr("inner2"), unix.AT_REMOVEDIR))
	must("mknodat", sys(unix.SYS_MKNODAT, fdcwd, cstr("fifo"), unix.S_IFIFO|0o600, 0))
	if r := sys(unix.SYS_UNLINK, cstr("nonexistent")); r != -int64(unix.ENOENT) {
		return fmt.Errorf("unlink nonexistent: %d", r)
	}

	rfd := must("openat .", sys(unix.SYS_OPENAT, fdcwd, cstr("."), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC))
	must("chdir", sys(unix.SYS_CHDIR, cstr("sub")))
	fd = must("openat h", sys(unix.SYS_OPENAT, fdcwd, cstr("h.txt"), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600))
	must("close h", sys(unix.SYS_CLOSE, fd))
	must("fchdir", sys(unix.SYS_FCHDIR, rfd))
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC}
	fd = must("openat2", sys(unix.SYS_OPENAT2, fdcwd, cstr("d.txt"), uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how)))
	must("close d", sys(unix.SYS_CLOSE, fd))
	fd = must("open passwd", sys(unix.SYS_OPEN, cstr("/etc/passwd"), unix.O_RDONLY|unix.O_CLOEXEC))
	must("read passwd", sys(unix.SYS_READ, fd, bufp(buf), 5))
	must("close passwd", sys(unix.SYS_CLOSE, fd))

	must("unlinkat f", sys(unix.SYS_UNLINKAT, dfd, cstr("f.txt"), 0))
	must("unlinkat h", sys(unix.SYS_UNLINKAT, dfd, cstr("h.txt"), 0))
	must("rmdir", sys(unix.SYS_RMDIR, cstr("sub")))
	must("close sub", sys(unix.SYS_CLOSE, dfd))
	must("close .", sys(unix.SYS_CLOSE, rfd))
	return nil
}

// helperBurst changes a file's mode n times as fast as it can.
func helperBurst(n int) error {
	fd, err := unix.Open("burst.txt", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for i := range n {
		if err := unix.Fchmod(fd, uint32(0o600+i%2)); err != nil {
			return err
		}
	}
	return nil
}

// helperLongPath creates a directory whose path is over 511 bytes.
func helperLongPath() error {
	p := ""
	for i := range 4 {
		if i > 0 {
			p += "/"
		}
		p += strings.Repeat(strconv.Itoa(i), 200)
		if err := unix.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// helperFork runs a shell that writes a file: a forked, exec'd child.
func helperFork() error {
	out, err := exec.Command("/bin/sh", "-c", "echo hi > forked.txt").CombinedOutput()
	if err != nil {
		return fmt.Errorf("sh: %v: %s", err, out)
	}
	return nil
}

// helperBench runs the benchmark's cycle on request: each line on stdin
// is a count; it answers "done" after that many cycles. The cycle:
// create, write 4 KiB, fsync (unless !fsync), read them back, close,
// unlink.
func helperBench(in *bufio.Reader, fsync bool) error {
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte('a' + i%26)
	}
	buf := make([]byte, 4096)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return nil // parent closed stdin
		}
		n, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			return err
		}
		for range n {
			fd, err := unix.Open("cycle.bin", unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			if _, err := unix.Write(fd, data); err != nil {
				return err
			}
			if fsync {
				if err := unix.Fsync(fd); err != nil {
					return err
				}
			}
			if _, err := unix.Pread(fd, buf, 0); err != nil {
				return err
			}
			unix.Close(fd)
			if err := unix.Unlink("cycle.bin"); err != nil {
				return err
			}
		}
		fmt.Println("done")
	}
}

// helperReadLoop reads 64 bytes of a file with pread on request: each
// stdin line is a count.
func helperReadLoop(in *bufio.Reader) error {
	if err := os.WriteFile("r.bin", make([]byte, 4096), 0o644); err != nil {
		return err
	}
	fd, err := unix.Open("r.bin", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	buf := make([]byte, 64)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return nil
		}
		n, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			return err
		}
		for i := range n {
			if _, err := unix.Pread(fd, buf, int64(i%64)*64); err != nil {
				return err
			}
		}
		fmt.Println("done")
	}
}
