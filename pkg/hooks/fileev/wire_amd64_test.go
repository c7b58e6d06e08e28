//go:build linux && amd64

package fileev

import (
	"reflect"
	"testing"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// TestWireLayout checks wire.go against the BTF of the compiled object:
// sizes and offsets of the records and the values of the enums.
func TestWireLayout(t *testing.T) {
	spec, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	structOf := func(name string) *btf.Struct {
		var s *btf.Struct
		if err := spec.Types.TypeByName(name, &s); err != nil {
			t.Fatalf("type %s: %v", name, err)
		}
		return s
	}
	offsets := func(s *btf.Struct) map[string]uint32 {
		m := map[string]uint32{}
		for _, mb := range s.Members {
			m[mb.Name] = mb.Offset.Bytes()
		}
		return m
	}
	ev := structOf("ft_event")
	if ev.Size != eventSize {
		t.Errorf("sizeof(ft_event) = %d, wire.go says %d", ev.Size, eventSize)
	}
	want := map[string]uint32{"ts": offTS, "tgid": offTgid, "tid": offTid, "target": offTarget, "kind": offKind,
		"op": offOp, "nr": offNr, "flags": offFlags, "ret": offRet, "args": offArgs, "aux": offAux, "fi": offFi,
		"plen": offPlen, "dlen": offDlen}
	for name, off := range offsets(ev) {
		if want[name] != off {
			t.Errorf("ft_event.%s at %d, wire.go says %d", name, off, want[name])
		}
	}
	fi := structOf("ft_fdinfo")
	if fi.Size != fdinfoLen {
		t.Errorf("sizeof(ft_fdinfo) = %d, wire.go says %d", fi.Size, fdinfoLen)
	}
	wantFI := map[string]uint32{"ino": fiIno, "pos": fiPos, "dev": fiDev, "mode": fiMode, "flags": fiFlags, "fd": fiFD}
	for name, off := range offsets(fi) {
		if wantFI[name] != off {
			t.Errorf("ft_fdinfo.%s at %d, wire.go says %d", name, off, wantFI[name])
		}
	}
	pe := structOf("ft_path_event")
	if pe.Size != pathEventSize {
		t.Errorf("sizeof(ft_path_event) = %d, wire.go says %d", pe.Size, pathEventSize)
	}
	if o := offsets(pe)["path"]; o != offPath {
		t.Errorf("ft_path_event.path at %d, wire.go says %d", o, offPath)
	}
	p1 := structOf("ft_path1_event")
	if p1.Size != path1EventSize {
		t.Errorf("sizeof(ft_path1_event) = %d, wire.go says %d", p1.Size, path1EventSize)
	}
	if o := offsets(p1)["path"]; o != offPath {
		t.Errorf("ft_path1_event.path at %d, wire.go says %d", o, offPath)
	}
	de := structOf("ft_data_event")
	if de.Size != offData+dataMax {
		t.Errorf("sizeof(ft_data_event) = %d, wire.go says %d", de.Size, offData+dataMax)
	}
	if o := offsets(de)["data"]; o != offData {
		t.Errorf("ft_data_event.data at %d, wire.go says %d", o, offData)
	}

	// The map values userspace writes: struct ft_target and ft_slot
	// (host_linux.go), field by field.
	for _, v := range []struct {
		name string
		val  any
	}{{"ft_target", ftTarget{}}, {"ft_slot", ftSlot{}}} {
		s := structOf(v.name)
		rt := reflect.TypeOf(v.val)
		if uintptr(s.Size) != rt.Size() || len(s.Members) != rt.NumField() {
			t.Errorf("%s: %d bytes, %d fields; Go %s: %d bytes, %d fields", v.name, s.Size, len(s.Members), rt, rt.Size(), rt.NumField())
			continue
		}
		for i, mb := range s.Members {
			if f := rt.Field(i); uintptr(mb.Offset.Bytes()) != f.Offset {
				t.Errorf("%s.%s at %d, Go %s.%s at %d", v.name, mb.Name, mb.Offset.Bytes(), rt, f.Name, f.Offset)
			}
		}
	}

	enums := map[string]map[string]uint64{
		"ft_kind": {"FT_K_SYSCALL": kSyscall, "FT_K_FORK": kFork, "FT_K_EXIT": kExit, "FT_K_MARKER": kMarker},
		"ft_flag": {"FT_F_FI0": fFI0, "FT_F_FI1": fFI1, "FT_F_P0_TRUNC": fP0Trunc, "FT_F_P1_TRUNC": fP1Trunc,
			"FT_F_P0_FAULT": fP0Fault, "FT_F_P1_FAULT": fP1Fault, "FT_F_AUX0": fAux0, "FT_F_AUX1": fAux1,
			"FT_F_AUX_FAULT": fAuxFlt, "FT_F_PATHS": fPaths, "FT_F_DATA": fData, "FT_F_DATA_WHOLE": fWhole,
			"FT_F_PATH1": fPath1},
		"ft_counter": {"FT_C_RINGBUF": cRingbuf, "FT_C_INFLIGHT": cInflight, "FT_C_FORK": cFork, "FT_C_COMPAT": cCompat,
			"FT_C_MAX": cMax},
	}
	ops := map[string]uint64{}
	for o := OpNone; o <= opMax; o++ {
		name := "FT_OP_MAX"
		if o < opMax {
			name = "FT_OP_" + map[Op]string{OpRemovexattr: "RMXATTR"}[o]
			if name == "FT_OP_" {
				name += upper(o.String())
			}
		}
		ops[name] = uint64(o)
	}
	enums["ft_op"] = ops
	for ename, vals := range enums {
		var en *btf.Enum
		if err := spec.Types.TypeByName(ename, &en); err != nil {
			t.Errorf("enum %s: %v", ename, err)
			continue
		}
		seen := map[string]bool{}
		for _, v := range en.Values {
			seen[v.Name] = true
			if want, ok := vals[v.Name]; !ok || want != v.Value {
				t.Errorf("%s %s = %d, Go has %d (known %v)", ename, v.Name, v.Value, want, ok)
			}
		}
		for name := range vals {
			if !seen[name] {
				t.Errorf("%s: Go constant %s has no C counterpart", ename, name)
			}
		}
	}
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// TestSyscallTable checks the traced syscall numbers against x/sys/unix.
func TestSyscallTable(t *testing.T) {
	known := map[string]uintptr{
		"read": unix.SYS_READ, "write": unix.SYS_WRITE, "open": unix.SYS_OPEN, "close": unix.SYS_CLOSE,
		"mmap": unix.SYS_MMAP, "pread64": unix.SYS_PREAD64, "pwrite64": unix.SYS_PWRITE64,
		"readv": unix.SYS_READV, "writev": unix.SYS_WRITEV, "dup": unix.SYS_DUP, "dup2": unix.SYS_DUP2,
		"sendfile": unix.SYS_SENDFILE, "fcntl": unix.SYS_FCNTL, "truncate": unix.SYS_TRUNCATE,
		"ftruncate": unix.SYS_FTRUNCATE, "chdir": unix.SYS_CHDIR, "fchdir": unix.SYS_FCHDIR,
		"rename": unix.SYS_RENAME, "mkdir": unix.SYS_MKDIR, "rmdir": unix.SYS_RMDIR, "creat": unix.SYS_CREAT,
		"link": unix.SYS_LINK, "unlink": unix.SYS_UNLINK, "symlink": unix.SYS_SYMLINK, "chmod": unix.SYS_CHMOD,
		"fchmod": unix.SYS_FCHMOD, "chown": unix.SYS_CHOWN, "fchown": unix.SYS_FCHOWN, "lchown": unix.SYS_LCHOWN,
		"mknod": unix.SYS_MKNOD, "setxattr": unix.SYS_SETXATTR, "lsetxattr": unix.SYS_LSETXATTR,
		"fsetxattr": unix.SYS_FSETXATTR, "removexattr": unix.SYS_REMOVEXATTR,
		"lremovexattr": unix.SYS_LREMOVEXATTR, "fremovexattr": unix.SYS_FREMOVEXATTR,
		"openat": unix.SYS_OPENAT, "mkdirat": unix.SYS_MKDIRAT, "mknodat": unix.SYS_MKNODAT,
		"fchownat": unix.SYS_FCHOWNAT, "unlinkat": unix.SYS_UNLINKAT, "renameat": unix.SYS_RENAMEAT,
		"linkat": unix.SYS_LINKAT, "symlinkat": unix.SYS_SYMLINKAT, "fchmodat": unix.SYS_FCHMODAT,
		"splice": unix.SYS_SPLICE, "fallocate": unix.SYS_FALLOCATE, "dup3": unix.SYS_DUP3,
		"preadv": unix.SYS_PREADV, "pwritev": unix.SYS_PWRITEV, "open_by_handle_at": unix.SYS_OPEN_BY_HANDLE_AT,
		"renameat2": unix.SYS_RENAMEAT2, "copy_file_range": unix.SYS_COPY_FILE_RANGE,
		"preadv2": unix.SYS_PREADV2, "pwritev2": unix.SYS_PWRITEV2, "openat2": unix.SYS_OPENAT2,
		"fchmodat2": unix.SYS_FCHMODAT2,
		// Newer than golang.org/x/sys v0.50 knows (Linux 6.13).
		"setxattrat": 463, "removexattrat": 466,
	}
	for nr, name := range syscallNames {
		want, ok := known[name]
		if !ok {
			t.Errorf("syscall %s (%d) has no reference number", name, nr)
			continue
		}
		if uintptr(nr) != want {
			t.Errorf("syscall %s is %d here, %d in x/sys/unix", name, nr, want)
		}
		delete(known, name)
	}
	for name := range known {
		t.Errorf("syscall %s missing from syscallNames", name)
	}
}
