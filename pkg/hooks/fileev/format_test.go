package fileev

import (
	"fmt"

	"github.com/carbd/carbd/pkg/decide"
)

// recLine renders a record for comparison: op, syscall, return value,
// paths (outside M: prefixed "!") and the op's own fields.
func recLine(r *Record) string {
	p := func(s string, in bool) string {
		if in {
			return s
		}
		return "!" + s
	}
	ret := fmt.Sprint(r.Ret)
	if r.Ret >= 0 && (r.Op == OpOpen || r.Op == OpDup) {
		ret = "fd"
	}
	if r.Ret >= 0 && r.Op == OpMmap {
		ret = "addr"
	}
	s := fmt.Sprintf("%s %s ret=%s", r.Op, r.Syscall, ret)
	if r.Path != "" {
		s += " " + p(r.Path, r.InRoot)
	}
	if r.Path2 != "" {
		s += " -> " + p(r.Path2, r.InRoot2)
	}
	switch r.Op {
	case OpOpen:
		s += fmt.Sprintf(" flags=%#o mode=%#o", r.Flags, r.Mode)
	case OpRead, OpWrite:
		s += fmt.Sprintf(" off=%d len=%d", r.Offset, r.Length)
	case OpCopy:
		s += fmt.Sprintf(" off=%d off2=%d len=%d", r.Offset, r.Offset2, r.Length)
	case OpMmap:
		s += fmt.Sprintf(" off=%d len=%d prot=%d flags=%#x", r.Offset, r.Length, r.Mode, r.Flags)
	case OpTruncate:
		s += fmt.Sprintf(" len=%d", r.Length)
	case OpFallocate:
		s += fmt.Sprintf(" mode=%d off=%d len=%d", r.Flags, r.Offset, r.Length)
	case OpChmod, OpMkdir, OpMknod:
		s += fmt.Sprintf(" mode=%#o", r.Mode)
	case OpChown:
		s += fmt.Sprintf(" uid=%d gid=%d", r.UID, r.GID)
	case OpSetxattr, OpRemovexattr:
		s += " name=" + r.Name
	case OpSymlink:
		s += " linkto=" + r.Name
	case OpRename, OpLink, OpUnlink, OpRmdir:
		if r.Flags != 0 {
			s += fmt.Sprintf(" flags=%#x", r.Flags)
		}
	}
	if r.Malformed != "" {
		s += " MALFORMED: " + r.Malformed
	}
	return s
}

// evLine renders a decide.Event without its content.
func evLine(e *decide.Event) string {
	s := fmt.Sprintf("%s %s %s %s", e.Dir, e.Op, e.Obj, e.Kind)
	if e.Source != "" {
		s += " source=" + e.Source
	}
	for _, f := range e.Fields {
		if f.Role == decide.RoleContent {
			s += fmt.Sprintf(" %s(%s)", f.Name, f.Role)
			continue
		}
		s += fmt.Sprintf(" %s(%s)=%s", f.Name, f.Role, f.Value)
	}
	return s
}
