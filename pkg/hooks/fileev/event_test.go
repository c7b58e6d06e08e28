package fileev

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
)

func TestEvents(t *testing.T) {
	now := time.Unix(100, 0)
	base := Record{Kind: KindSyscall, Time: now, PID: 1, FD: 3, UID: -1, GID: -1}
	rec := func(f func(r *Record)) *Record {
		r := base
		f(&r)
		return &r
	}
	for _, tc := range []struct {
		name string
		r    *Record
		want []string
	}{
		{"failed write", rec(func(r *Record) { r.Op, r.Ret, r.Path, r.InRoot = OpWrite, -28, "a", true }), nil},
		{"empty write", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpWrite, "a", true }), nil},
		{"outside write", rec(func(r *Record) { r.Op, r.Ret, r.Path = OpWrite, 3, "/etc/x" }), nil},
		{"malformed", rec(func(r *Record) { r.Op, r.Ret, r.Path, r.InRoot, r.Malformed = OpUnlink, 0, "a", true, "cut" }), nil},
		{"fork", rec(func(r *Record) { r.Kind, r.Child = KindFork, 2 }), nil},
		{"loss", rec(func(r *Record) { r.Kind, r.Lost = KindLoss, 3 }), nil},
		{"close", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpClose, "a", true }), nil},
		{"read eof", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpRead, "a", true }), nil},
		{"read", rec(func(r *Record) { r.Op, r.Ret, r.Path, r.InRoot, r.Content = OpRead, 3, "d/a", true, "abc" }),
			[]string{"in file:read d/a unset source=file:d/a content=abc"}},
		{"write", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.InRoot, r.Content, r.Offset = OpWrite, 3, "a", true, "xyz", 7
		}), []string{"out file:write a stageable path(target)=a offset(control)=7 data(content)=xyz content=xyz"}},
		{"open for reading", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Flags = OpOpen, "a", true, 0 }), nil},
		{"open O_TRUNC", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Flags = OpOpen, "a", true, oWronly|oTrunc }),
			[]string{"out file:truncate a stageable path(target)=a length(control)=0"}},
		{"open O_TRUNC read-only", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Flags = OpOpen, "a", true, oTrunc }), nil},
		{"open O_CREAT", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Flags, r.Mode = OpOpen, "a", true, oRdwr|oCreat, 0o640 }),
			[]string{"out file:create a stageable path(target)=a mode(control)=0640"}},
		{"open O_TMPFILE", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Flags = OpOpen, "d", true, oRdwr|oTmpfile }), nil},
		{"open outside", rec(func(r *Record) { r.Op, r.Path, r.Flags = OpOpen, "/tmp/x", oWronly|oCreat }), nil},
		{"mmap private read", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.InRoot, r.Mode, r.Flags, r.Content = OpMmap, 1, "lib.so", true, protRead, 0x2, "ELF"
		}), []string{"in file:read lib.so unset source=file:lib.so content=ELF"}},
		{"mmap shared write", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.InRoot, r.Mode, r.Flags, r.Length = OpMmap, 1, "db", true, protRead|protWrite, mapShared, 4096
		}), []string{"in file:read db unset source=file:db",
			"out file:write db stageable path(target)=db offset(control)=0 length(control)=4096 via(control)=mmap"}},
		{"mmap private write", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.InRoot, r.Mode, r.Flags = OpMmap, 1, "db", true, protWrite, 0x2
		}), nil},
		{"rename into M", rec(func(r *Record) {
			r.Op, r.Path, r.Path2, r.InRoot2, r.Flags = OpRename, "/tmp/x", "x", true, 1
		}), []string{"out file:rename x stageable path(target)=/tmp/x newpath(target)=x flags(control)=0x1"}},
		{"copy from outside", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.Path2, r.InRoot2, r.Offset2, r.Content = OpCopy, 2, "/etc/passwd", "p", true, 5, "ro"
		}), []string{"out file:write p stageable path(target)=p offset(control)=5 data(content)=ro content=ro"}},
		{"copy out of M", rec(func(r *Record) {
			r.Op, r.Ret, r.Path, r.InRoot, r.Path2, r.Content = OpCopy, 2, "s", true, "/tmp/o", "ro"
		}), []string{"in file:read s unset source=file:s content=ro"}},
		{"mknod", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Mode = OpMknod, "f", true, 0o10600 }),
			[]string{"out file:create f stageable path(target)=f mode(control)=010600"}},
		{"fallocate", rec(func(r *Record) {
			r.Op, r.Path, r.InRoot, r.Flags, r.Offset, r.Length = OpFallocate, "f", true, 2, 10, 20
		}), []string{"out file:write f stageable path(target)=f offset(control)=10 length(control)=20 fallocate(control)=0x2"}},
		{"truncate", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Length = OpTruncate, "f", true, 9 }),
			[]string{"out file:truncate f stageable path(target)=f length(control)=9"}},
		{"truncate outside", rec(func(r *Record) { r.Op, r.Path, r.Length = OpTruncate, "/tmp/f", 9 }), nil},
		{"unlink", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpUnlink, "f", true }),
			[]string{"out file:unlink f stageable path(target)=f"}},
		{"rmdir", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpRmdir, "d", true }),
			[]string{"out file:rmdir d stageable path(target)=d"}},
		{"mkdir", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Mode = OpMkdir, "d", true, 0o40755 }),
			[]string{"out file:mkdir d stageable path(target)=d mode(control)=0755"}},
		{"rename within M", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Path2, r.InRoot2 = OpRename, "a", true, "b", true }),
			[]string{"out file:rename a stageable path(target)=a newpath(target)=b"}},
		{"rename outside", rec(func(r *Record) { r.Op, r.Path, r.Path2 = OpRename, "/tmp/a", "/tmp/b" }), nil},
		{"link out of M", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Path2, r.Flags = OpLink, "a", true, "/tmp/b", 0x1000 }),
			[]string{"out file:link a stageable path(target)=a newpath(target)=/tmp/b flags(control)=0x1000"}},
		{"symlink", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Name = OpSymlink, "l", true, "/etc/passwd" }),
			[]string{"out file:symlink l stageable path(target)=l linkto(target)=/etc/passwd"}},
		{"chmod", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Mode = OpChmod, "f", true, 0o104755 }),
			[]string{"out file:chmod f stageable path(target)=f mode(control)=04755"}},
		{"chown", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.UID = OpChown, "f", true, 0 }),
			[]string{"out file:chown f stageable path(target)=f uid(control)=0 gid(control)=-1"}},
		{"setxattr", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Name = OpSetxattr, "f", true, "user.k" }),
			[]string{"out file:setxattr f stageable path(target)=f name(control)=user.k"}},
		{"removexattr", rec(func(r *Record) { r.Op, r.Path, r.InRoot, r.Name = OpRemovexattr, "f", true, "user.k" }),
			[]string{"out file:removexattr f stageable path(target)=f name(control)=user.k"}},
		{"setxattr outside", rec(func(r *Record) { r.Op, r.Path, r.Name = OpSetxattr, "/tmp/f", "user.k" }), nil},
		{"dup", rec(func(r *Record) { r.Op, r.Ret, r.Path, r.InRoot = OpDup, 4, "f", true }), nil},
		{"chdir", rec(func(r *Record) { r.Op, r.Path, r.InRoot = OpChdir, "d", true }), nil},
		{"unknown op", rec(func(r *Record) { r.Op, r.Path, r.InRoot = opMax, "f", true }), nil},
	} {
		evs := Events(tc.r)
		var got []string
		for _, e := range evs {
			if e.Ch != decide.ChanFile || !e.Time.Equal(now) {
				t.Errorf("%s: event %+v: channel or time wrong", tc.name, e)
			}
			s := evLine(&e)
			s = strings.Replace(s, "data(content)", "data(content)="+fieldValue(e, "data"), 1)
			if e.Content != "" {
				s += " content=" + e.Content
			}
			got = append(got, s)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
		// Run appends into a reused slice: what is there stays, the
		// record's events follow it.
		prev := decide.Event{Obj: "previous"}
		more := appendEvents([]decide.Event{prev}, tc.r)
		if len(more) != 1+len(evs) || more[0].Obj != prev.Obj || (len(evs) > 0 && more[1].Obj != evs[0].Obj) {
			t.Errorf("%s: appended to one event: %d events, want %d", tc.name, len(more), 1+len(evs))
		}
	}
}

func fieldValue(e decide.Event, name string) string {
	for _, f := range e.Fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}
