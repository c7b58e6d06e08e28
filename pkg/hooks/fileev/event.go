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
func Events(r *Record) []decide.Event { return appendEvents(nil, r) }

// appendEvents appends r's events (see Events) to dst: Run reuses one
// slice for every record.
func appendEvents(dst []decide.Event, r *Record) []decide.Event {
	if r.Kind != KindSyscall || r.Ret < 0 || r.Malformed != "" {
		return dst
	}
	if int(r.Op) >= len(eventMappers) || eventMappers[r.Op] == nil {
		return dst // bookkeeping: close, dup, chdir
	}
	return eventMappers[r.Op](dst, r)
}

// eventMappers append each operation class's decide.Events to dst; an
// operation without one (close, dup, chdir) maps to none.
var eventMappers = [opMax]func(dst []decide.Event, r *Record) []decide.Event{
	OpRead:        readEvents,
	OpWrite:       writeEvents,
	OpMmap:        mmapEvents,
	OpCopy:        copyEvents,
	OpOpen:        openEvents,
	OpTruncate:    inRoot(truncateEvent),
	OpFallocate:   inRoot(fallocateEvent),
	OpUnlink:      inRoot(pathEvent(OpNameUnlink)),
	OpRmdir:       inRoot(pathEvent(OpNameRmdir)),
	OpMkdir:       inRoot(modeEvent(OpNameMkdir, octal)),
	OpMknod:       inRoot(modeEvent(OpNameCreate, fullOctal)),
	OpRename:      twoPathEvents(OpNameRename),
	OpLink:        twoPathEvents(OpNameLink),
	OpSymlink:     inRoot(symlinkEvent),
	OpChmod:       inRoot(modeEvent(OpNameChmod, octal)),
	OpChown:       inRoot(chownEvent),
	OpSetxattr:    inRoot(xattrEvent(OpNameSetxattr)),
	OpRemovexattr: inRoot(xattrEvent(OpNameRemovexattr)),
}

// outEvent is an outgoing, stageable event of r: its object is r's path
// in M (the destination's when only that is in M).
func outEvent(r *Record, op string, fields ...decide.Field) decide.Event {
	obj := r.Path
	if !r.InRoot && r.InRoot2 {
		obj = r.Path2
	}
	return decide.Event{Time: r.Time, Ch: decide.ChanFile, Dir: decide.Out, Obj: obj, Op: op,
		Kind: decide.Stageable, Fields: fields}
}

func target(name, p string) decide.Field {
	return decide.Field{Name: name, Role: decide.RoleTarget, Value: p}
}

func control(name, v string) decide.Field {
	return decide.Field{Name: name, Role: decide.RoleControl, Value: v}
}

// octal is a mode's permission bits; fullOctal keeps the file type
// (mknod's mode says what it creates).
func octal(m uint32) string     { return "0" + strconv.FormatUint(uint64(m&0o7777), 8) }
func fullOctal(m uint32) string { return "0" + strconv.FormatUint(uint64(m), 8) }

func dec(v int64) string { return strconv.FormatInt(v, 10) }

// inRoot maps a record whose one object is r.Path to its event when
// that is inside M.
func inRoot(f func(r *Record) decide.Event) func(dst []decide.Event, r *Record) []decide.Event {
	return func(dst []decide.Event, r *Record) []decide.Event {
		if !r.InRoot {
			return dst
		}
		return append(dst, f(r))
	}
}

// readEvent is the incoming event of a read of p: its content is what
// was read.
func readEvent(r *Record, p string) decide.Event {
	return decide.Event{Time: r.Time, Ch: decide.ChanFile, Dir: decide.In, Obj: p, Op: OpNameRead,
		Content: r.Content, Source: "file:" + p}
}

// writeEvent is the outgoing event of a write of r.Content at offset
// into p.
func writeEvent(r *Record, p string, offset int64) decide.Event {
	ev := outEvent(r, OpNameWrite, target("path", p), control("offset", dec(offset)),
		decide.Field{Name: "data", Role: decide.RoleContent, Value: r.Content})
	ev.Obj = p
	ev.Content = r.Content
	return ev
}

func readEvents(dst []decide.Event, r *Record) []decide.Event {
	if r.InRoot && r.Ret > 0 {
		return append(dst, readEvent(r, r.Path))
	}
	return dst
}

func writeEvents(dst []decide.Event, r *Record) []decide.Event {
	if r.InRoot && r.Ret > 0 {
		return append(dst, writeEvent(r, r.Path, r.Offset))
	}
	return dst
}

func mmapEvents(dst []decide.Event, r *Record) []decide.Event {
	if !r.InRoot {
		return dst
	}
	evs := dst
	if r.Mode&protRead != 0 {
		evs = append(evs, readEvent(r, r.Path))
	}
	if r.Mode&protWrite != 0 && (r.Flags&mapSharedVal == mapShared || r.Flags&mapSharedVal == mapSharedVal) {
		// The bytes are written later through memory: only the
		// staging layer sees them.
		evs = append(evs, outEvent(r, OpNameWrite, target("path", r.Path), control("offset", dec(r.Offset)),
			control("length", dec(r.Length)), control("via", "mmap")))
	}
	return evs
}

func copyEvents(dst []decide.Event, r *Record) []decide.Event {
	if r.Ret <= 0 {
		return dst
	}
	evs := dst
	if r.InRoot && r.Path != "" {
		evs = append(evs, readEvent(r, r.Path))
	}
	if r.InRoot2 && r.Path2 != "" {
		evs = append(evs, writeEvent(r, r.Path2, r.Offset2))
	}
	return evs
}

func openEvents(dst []decide.Event, r *Record) []decide.Event {
	if !r.InRoot {
		return dst
	}
	acc := r.Flags & oAccMode
	switch {
	case r.Flags&oTmpfile == oTmpfile:
		return dst // unnamed until linkat: that is the effect
	case r.Flags&oCreat != 0:
		// O_CREAT: the file may have been created (and, with O_TRUNC,
		// an existing one emptied).
		fields := make([]decide.Field, 2, 3)
		fields[0], fields[1] = target("path", r.Path), control("mode", octal(r.Mode))
		if r.Flags&oTrunc != 0 && acc != 0 {
			fields = append(fields, control("truncate", "true"))
		}
		return append(dst, outEvent(r, OpNameCreate, fields...))
	case r.Flags&oTrunc != 0 && (acc == oWronly || acc == oRdwr):
		return append(dst, outEvent(r, OpNameTruncate, target("path", r.Path), control("length", "0")))
	}
	return dst
}

func truncateEvent(r *Record) decide.Event {
	return outEvent(r, OpNameTruncate, target("path", r.Path), control("length", dec(r.Length)))
}

func symlinkEvent(r *Record) decide.Event {
	return outEvent(r, OpNameSymlink, target("path", r.Path), target("linkto", r.Name))
}

func fallocateEvent(r *Record) decide.Event {
	return outEvent(r, OpNameWrite, target("path", r.Path), control("offset", dec(r.Offset)),
		control("length", dec(r.Length)), control("fallocate", "0x"+strconv.FormatUint(r.Flags, 16)))
}

func pathEvent(op string) func(r *Record) decide.Event {
	return func(r *Record) decide.Event { return outEvent(r, op, target("path", r.Path)) }
}

func modeEvent(op string, mode func(uint32) string) func(r *Record) decide.Event {
	return func(r *Record) decide.Event {
		return outEvent(r, op, target("path", r.Path), control("mode", mode(r.Mode)))
	}
}

func chownEvent(r *Record) decide.Event {
	return outEvent(r, OpNameChown, target("path", r.Path), control("uid", dec(r.UID)), control("gid", dec(r.GID)))
}

func xattrEvent(op string) func(r *Record) decide.Event {
	return func(r *Record) decide.Event { return outEvent(r, op, target("path", r.Path), control("name", r.Name)) }
}

// twoPathEvents maps rename and link: an effect on M when either path is
// in it.
func twoPathEvents(op string) func(dst []decide.Event, r *Record) []decide.Event {
	return func(dst []decide.Event, r *Record) []decide.Event {
		if !r.InRoot && !r.InRoot2 {
			return dst
		}
		fields := []decide.Field{target("path", r.Path), target("newpath", r.Path2)}
		if r.Flags != 0 {
			fields = append(fields, control("flags", "0x"+strconv.FormatUint(r.Flags, 16)))
		}
		return append(dst, outEvent(r, op, fields...))
	}
}
