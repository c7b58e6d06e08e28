package fileev

import (
	"strconv"

	"github.com/carbd/carbd/pkg/decide"
)

// Decide operations of the file channel (decide.Event.Op).
const (
	OpNameRead        = "file:read"
	OpNameWrite       = "file:write"
	OpNameCreate      = "file:create"
	OpNameTruncate    = "file:truncate"
	OpNameUnlink      = "file:unlink"
	OpNameRename      = "file:rename"
	OpNameMkdir       = "file:mkdir"
	OpNameRmdir       = "file:rmdir"
	OpNameChmod       = "file:chmod"
	OpNameChown       = "file:chown"
	OpNameSymlink     = "file:symlink"
	OpNameLink        = "file:link"
	OpNameSetxattr    = "file:setxattr"
	OpNameRemovexattr = "file:removexattr"
)

// Events maps a resolved Record to the decide.Events it stands for:
//
//   - reads (read family, mmap with PROT_READ, the source of a copy) of a
//     file inside M: one incoming event, Obj the path relative to M,
//     Content what was read (bounded), Source "file:<path>";
//   - effects on M (writes, creates, truncations, unlink, rename, mkdir,
//     rmdir, chmod, chown, symlink, link, xattrs): one outgoing,
//     stageable event with the path fields in role target and the data
//     in role content.
//
// Failed syscalls (Ret < 0), operations outside M, malformed records and
// bookkeeping (close, dup, chdir, fork, exit, loss) map to none: the
// staging layer, not this stream, is the record of what is staged, and a
// malformed or lost record asks the daemon for a re-scan instead.
func Events(r *Record) []decide.Event {
	if r.Kind != KindSyscall || r.Ret < 0 || r.Malformed != "" {
		return nil
	}
	out := func(op string, fields ...decide.Field) decide.Event {
		obj, in := r.Path, r.InRoot
		if !in && r.InRoot2 {
			obj = r.Path2
		}
		return decide.Event{Time: r.Time, Ch: decide.ChanFile, Dir: decide.Out, Obj: obj, Op: op,
			Kind: decide.Stageable, Fields: fields}
	}
	target := func(name, p string) decide.Field {
		return decide.Field{Name: name, Role: decide.RoleTarget, Value: p}
	}
	control := func(name, v string) decide.Field {
		return decide.Field{Name: name, Role: decide.RoleControl, Value: v}
	}
	octal := func(m uint32) string { return "0" + strconv.FormatUint(uint64(m&0o7777), 8) }
	dec := func(v int64) string { return strconv.FormatInt(v, 10) }
	read := func(p string) decide.Event {
		return decide.Event{Time: r.Time, Ch: decide.ChanFile, Dir: decide.In, Obj: p, Op: OpNameRead,
			Content: r.Content, Source: "file:" + p}
	}
	write := func(p string) decide.Event {
		ev := out(OpNameWrite, target("path", p), control("offset", dec(r.Offset)),
			decide.Field{Name: "data", Role: decide.RoleContent, Value: r.Content})
		ev.Obj = p
		ev.Content = r.Content
		return ev
	}

	switch r.Op {
	case OpRead:
		if r.InRoot && r.Ret > 0 {
			return []decide.Event{read(r.Path)}
		}
	case OpWrite:
		if r.InRoot && r.Ret > 0 {
			return []decide.Event{write(r.Path)}
		}
	case OpMmap:
		if !r.InRoot {
			return nil
		}
		var evs []decide.Event
		if r.Mode&protRead != 0 {
			evs = append(evs, read(r.Path))
		}
		if r.Mode&protWrite != 0 && (r.Flags&mapSharedVal == mapShared || r.Flags&mapSharedVal == mapSharedVal) {
			// The bytes are written later through memory: only the
			// staging layer sees them.
			ev := out(OpNameWrite, target("path", r.Path), control("offset", dec(r.Offset)),
				control("length", dec(r.Length)), control("via", "mmap"))
			evs = append(evs, ev)
		}
		return evs
	case OpCopy:
		var evs []decide.Event
		if r.Ret <= 0 {
			return nil
		}
		if r.InRoot && r.Path != "" {
			evs = append(evs, read(r.Path))
		}
		if r.InRoot2 && r.Path2 != "" {
			ev := write(r.Path2)
			ev.Fields[1].Value = dec(r.Offset2)
			evs = append(evs, ev)
		}
		return evs
	case OpOpen:
		if !r.InRoot {
			return nil
		}
		acc := r.Flags & oAccMode
		switch {
		case r.Flags&oTmpfile == oTmpfile:
			return nil // unnamed until linkat: that is the effect
		case r.Flags&oCreat != 0:
			// O_CREAT: the file may have been created (and, with
			// O_TRUNC, an existing one emptied).
			fields := []decide.Field{target("path", r.Path), control("mode", octal(r.Mode))}
			if r.Flags&oTrunc != 0 && acc != 0 {
				fields = append(fields, control("truncate", "true"))
			}
			return []decide.Event{out(OpNameCreate, fields...)}
		case r.Flags&oTrunc != 0 && (acc == oWronly || acc == oRdwr):
			return []decide.Event{out(OpNameTruncate, target("path", r.Path), control("length", "0"))}
		}
	case OpTruncate:
		if r.InRoot {
			return []decide.Event{out(OpNameTruncate, target("path", r.Path), control("length", dec(r.Length)))}
		}
	case OpFallocate:
		if r.InRoot {
			return []decide.Event{out(OpNameWrite, target("path", r.Path), control("offset", dec(r.Offset)),
				control("length", dec(r.Length)), control("fallocate", "0x"+strconv.FormatUint(r.Flags, 16)))}
		}
	case OpUnlink:
		if r.InRoot {
			return []decide.Event{out(OpNameUnlink, target("path", r.Path))}
		}
	case OpRmdir:
		if r.InRoot {
			return []decide.Event{out(OpNameRmdir, target("path", r.Path))}
		}
	case OpMkdir:
		if r.InRoot {
			return []decide.Event{out(OpNameMkdir, target("path", r.Path), control("mode", octal(r.Mode)))}
		}
	case OpMknod:
		if r.InRoot {
			return []decide.Event{out(OpNameCreate, target("path", r.Path),
				control("mode", "0"+strconv.FormatUint(uint64(r.Mode), 8)))}
		}
	case OpRename, OpLink:
		if !r.InRoot && !r.InRoot2 {
			return nil
		}
		op := OpNameRename
		if r.Op == OpLink {
			op = OpNameLink
		}
		fields := []decide.Field{target("path", r.Path), target("newpath", r.Path2)}
		if r.Flags != 0 {
			fields = append(fields, control("flags", "0x"+strconv.FormatUint(r.Flags, 16)))
		}
		return []decide.Event{out(op, fields...)}
	case OpSymlink:
		if r.InRoot {
			return []decide.Event{out(OpNameSymlink, target("path", r.Path), target("linkto", r.Name))}
		}
	case OpChmod:
		if r.InRoot {
			return []decide.Event{out(OpNameChmod, target("path", r.Path), control("mode", octal(r.Mode)))}
		}
	case OpChown:
		if r.InRoot {
			return []decide.Event{out(OpNameChown, target("path", r.Path), control("uid", dec(r.UID)),
				control("gid", dec(r.GID)))}
		}
	case OpSetxattr, OpRemovexattr:
		if r.InRoot {
			op := OpNameSetxattr
			if r.Op == OpRemovexattr {
				op = OpNameRemovexattr
			}
			return []decide.Event{out(op, target("path", r.Path), control("name", r.Name))}
		}
	}
	return nil
}
