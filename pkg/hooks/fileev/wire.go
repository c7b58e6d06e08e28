package fileev

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The wire format of bpf/include/ftrace_events.h. TestWireLayout checks
// these offsets against the BTF of the compiled object.
const (
	pathMax = 512  // FT_PATH_MAX
	dataMax = 4096 // FT_DATA_MAX

	eventSize      = 176                   // sizeof(struct ft_event)
	pathEventSize  = eventSize + 2*pathMax // sizeof(struct ft_path_event)
	path1EventSize = eventSize + pathMax   // sizeof(struct ft_path1_event)

	offTS     = 0
	offTgid   = 8
	offTid    = 12
	offTarget = 16
	offKind   = 20
	offOp     = 22
	offNr     = 24
	offFlags  = 28
	offRet    = 32
	offArgs   = 40
	offAux    = 88
	offFi     = 104
	fdinfoLen = 32
	offPlen   = 168
	offDlen   = 172
	offPath   = eventSize
	offData   = eventSize // struct ft_data_event: data follows the header

	// struct ft_fdinfo
	fiIno   = 0
	fiPos   = 8
	fiDev   = 16
	fiMode  = 20
	fiFlags = 24
	fiFD    = 28
)

// record kinds (enum ft_kind)
const (
	kSyscall = 1
	kFork    = 2
	kExit    = 3
	kMarker  = 4
)

// flags (enum ft_flag)
const (
	fFI0     = 1 << 0
	fFI1     = 1 << 1
	fP0Trunc = 1 << 2
	fP1Trunc = 1 << 3
	fP0Fault = 1 << 4
	fP1Fault = 1 << 5
	fAux0    = 1 << 6
	fAux1    = 1 << 7
	fAuxFlt  = 1 << 8
	fPaths   = 1 << 9
	fData    = 1 << 10 // a struct ft_data_event: dlen bytes of the call's buffer follow
	fWhole   = 1 << 11 // with fData: dlen == ret, the bytes are all the call moved
	fPath1   = 1 << 12 // with fPaths: a struct ft_path1_event, one path slot (path[0])
)

// loss counters (enum ft_counter)
const (
	cRingbuf  = 0
	cInflight = 1
	cFork     = 2
	cCompat   = 3
	cMax      = 4
)

// fdInfo is struct ft_fdinfo: what the kernel said about a descriptor.
type fdInfo struct {
	Ino   uint64
	Pos   int64
	Dev   uint32 // kernel encoding: major<<20 | minor
	Mode  uint32
	Flags uint32
	FD    int32
	Valid bool
}

// rawEvent is one decoded ring buffer record.
type rawEvent struct {
	TS     uint64
	Tgid   uint32
	Tid    uint32
	Target uint32
	Kind   uint16
	Op     Op
	Nr     uint32
	Flags  uint32
	Ret    int64
	Args   [6]uint64
	Aux    [2]uint64
	FI     [2]fdInfo
	Path   [2]string
	HasP   [2]bool // a path argument was given (non-NULL pointer, readable)

	// Data is the first bytes of a read's or write's buffer, copied by
	// the kernel at the syscall's exit (fData); Whole: they are all the
	// call moved (len(Data) == Ret).
	Data    string
	HasData bool
	Whole   bool
}

// errWire is the sentinel of records that do not decode.
var errWire = errors.New("fileev: malformed ring buffer record")

// decodeEvent decodes one ring buffer record. It never panics: a record
// of the wrong size, an unknown kind or op, or a path length that does
// not fit is an error naming the field.
func decodeEvent(b []byte) (rawEvent, error) {
	var e rawEvent
	err := decodeInto(&e, b, nil)
	return e, err
}

// decodeInto is decodeEvent into *e, which it overwrites. last, when not
// nil, holds the last path decoded into each slot: a path equal to it is
// that string again instead of a copy (a process tends to name the same
// file over and over).
func decodeInto(e *rawEvent, b []byte, last *[2]string) error {
	*e = rawEvent{}
	if len(b) < eventSize {
		return fmt.Errorf("%w: %d bytes, want at least %d", errWire, len(b), eventSize)
	}
	le := binary.LittleEndian
	e.TS = le.Uint64(b[offTS:])
	e.Tgid = le.Uint32(b[offTgid:])
	e.Tid = le.Uint32(b[offTid:])
	e.Target = le.Uint32(b[offTarget:])
	e.Kind = le.Uint16(b[offKind:])
	e.Op = Op(le.Uint16(b[offOp:]))
	e.Nr = le.Uint32(b[offNr:])
	e.Flags = le.Uint32(b[offFlags:])
	e.Ret = int64(le.Uint64(b[offRet:]))
	for i := range e.Args {
		e.Args[i] = le.Uint64(b[offArgs+8*i:])
	}
	e.Aux[0] = le.Uint64(b[offAux:])
	e.Aux[1] = le.Uint64(b[offAux+8:])
	for i := range e.FI {
		o := offFi + fdinfoLen*i
		e.FI[i] = fdInfo{
			Ino:   le.Uint64(b[o+fiIno:]),
			Pos:   int64(le.Uint64(b[o+fiPos:])),
			Dev:   le.Uint32(b[o+fiDev:]),
			Mode:  le.Uint32(b[o+fiMode:]),
			Flags: le.Uint32(b[o+fiFlags:]),
			FD:    int32(le.Uint32(b[o+fiFD:])),
			Valid: e.Flags&(fFI0<<i) != 0,
		}
	}
	switch e.Kind {
	case kSyscall:
		if e.Op == OpNone || e.Op >= opMax {
			return fmt.Errorf("%w: op %d", errWire, e.Op)
		}
		if _, ok := syscallNames[e.Nr]; !ok {
			return fmt.Errorf("%w: syscall number %d is not traced", errWire, e.Nr)
		}
	case kFork, kExit, kMarker:
	default:
		return fmt.Errorf("%w: kind %d", errWire, e.Kind)
	}
	if e.Flags&fWhole != 0 && e.Flags&fData == 0 {
		return fmt.Errorf("%w: whole-data flag without data", errWire)
	}
	if e.Flags&fData != 0 {
		return decodeData(e, b)
	}
	if e.Flags&fPaths == 0 {
		if e.Flags&fPath1 != 0 {
			return fmt.Errorf("%w: one-path flag without paths", errWire)
		}
		return nil
	}
	slots, size := 2, pathEventSize
	if e.Flags&fPath1 != 0 {
		slots, size = 1, path1EventSize
		if le.Uint16(b[offPlen+2:]) != 0 {
			return fmt.Errorf("%w: one-path record with a second path", errWire)
		}
	}
	if len(b) < size {
		return fmt.Errorf("%w: path record of %d bytes, want %d", errWire, len(b), size)
	}
	for i := range slots {
		n := int(le.Uint16(b[offPlen+2*i:]))
		if n == 0 {
			continue
		}
		if n > pathMax {
			return fmt.Errorf("%w: path %d length %d over %d", errWire, i, n, pathMax)
		}
		p := b[offPath+pathMax*i : offPath+pathMax*i+n]
		// n counts the NUL the kernel copied.
		if p[n-1] == 0 {
			p = p[:n-1]
		}
		switch {
		case last == nil:
			e.Path[i] = string(p)
		case string(p) == last[i]: // compared without a copy
			e.Path[i] = last[i]
		default:
			e.Path[i] = string(p)
			last[i] = e.Path[i]
		}
		e.HasP[i] = true
	}
	return nil
}

// decodeData decodes the data of a struct ft_data_event: a read or a
// write whose record carries dlen bytes after the header.
func decodeData(e *rawEvent, b []byte) error {
	if e.Flags&fPaths != 0 {
		return fmt.Errorf("%w: record has both paths and data", errWire)
	}
	if e.Kind != kSyscall || (e.Op != OpRead && e.Op != OpWrite) {
		return fmt.Errorf("%w: data in a record of kind %d op %s", errWire, e.Kind, e.Op)
	}
	n := int(binary.LittleEndian.Uint32(b[offDlen:]))
	switch {
	case n == 0 || n > dataMax:
		return fmt.Errorf("%w: data length %d not in 1..%d", errWire, n, dataMax)
	case len(b) < offData+n:
		return fmt.Errorf("%w: data record of %d bytes, want %d", errWire, len(b), offData+n)
	case int64(n) > e.Ret:
		return fmt.Errorf("%w: data length %d over the return value %d", errWire, n, e.Ret)
	case e.Flags&fWhole != 0 && int64(n) != e.Ret:
		return fmt.Errorf("%w: whole data of %d bytes, return value %d", errWire, n, e.Ret)
	}
	e.Data = string(b[offData : offData+n])
	e.HasData = true
	e.Whole = e.Flags&fWhole != 0
	return nil
}

// fi returns the description of descriptor fd carried by the record, if
// any.
func (e *rawEvent) fi(fd int64) (fdInfo, bool) {
	for _, f := range e.FI {
		if f.Valid && int64(f.FD) == fd {
			return f, true
		}
	}
	return fdInfo{}, false
}
