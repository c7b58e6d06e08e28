package fileev

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unsafe"
)

// encodeEvent is decodeEvent's inverse, for tests and the fuzz corpus.
func encodeEvent(e *rawEvent) []byte {
	n := eventSize
	if e.Flags&fPaths != 0 {
		n = pathEventSize
		if e.Flags&fPath1 != 0 {
			n = path1EventSize
		}
	}
	if e.HasData {
		n = offData + len(e.Data)
	}
	b := make([]byte, n)
	le := binary.LittleEndian
	le.PutUint64(b[offTS:], e.TS)
	le.PutUint32(b[offTgid:], e.Tgid)
	le.PutUint32(b[offTid:], e.Tid)
	le.PutUint32(b[offTarget:], e.Target)
	le.PutUint16(b[offKind:], e.Kind)
	le.PutUint16(b[offOp:], uint16(e.Op))
	le.PutUint32(b[offNr:], e.Nr)
	flags := e.Flags
	for i, f := range e.FI {
		if f.Valid {
			flags |= fFI0 << i
		}
	}
	flags &^= fData | fWhole
	if e.HasData {
		flags |= fData
		if e.Whole {
			flags |= fWhole
		}
		le.PutUint32(b[offDlen:], uint32(len(e.Data)))
		copy(b[offData:], e.Data)
	}
	le.PutUint32(b[offFlags:], flags)
	le.PutUint64(b[offRet:], uint64(e.Ret))
	for i, a := range e.Args {
		le.PutUint64(b[offArgs+8*i:], a)
	}
	le.PutUint64(b[offAux:], e.Aux[0])
	le.PutUint64(b[offAux+8:], e.Aux[1])
	for i, f := range e.FI {
		o := offFi + fdinfoLen*i
		le.PutUint64(b[o+fiIno:], f.Ino)
		le.PutUint64(b[o+fiPos:], uint64(f.Pos))
		le.PutUint32(b[o+fiDev:], f.Dev)
		le.PutUint32(b[o+fiMode:], f.Mode)
		le.PutUint32(b[o+fiFlags:], f.Flags)
		le.PutUint32(b[o+fiFD:], uint32(f.FD))
	}
	if flags&fPaths != 0 {
		for i, p := range e.Path {
			if !e.HasP[i] || (i == 1 && flags&fPath1 != 0) {
				continue
			}
			copy(b[offPath+pathMax*i:], p)
			n := len(p) + 1 // with the NUL the kernel copies
			if n > pathMax {
				n = pathMax // a path filling its slot (decodeEvent accepts one without its NUL)
			}
			le.PutUint16(b[offPlen+2*i:], uint16(n))
		}
	}
	return b
}

func sampleEvents() []rawEvent {
	return []rawEvent{
		{TS: 1, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpOpen, Nr: 257, Flags: fPaths, Ret: 3,
			Args: [6]uint64{^uint64(99), 0x1000, 0o101, 0o644},
			FI:   [2]fdInfo{{Ino: 5, Dev: 1<<20 | 2, Mode: sIFREG | 0o644, FD: 3, Valid: true}, {FD: -100}},
			Path: [2]string{"a.txt"}, HasP: [2]bool{true}},
		// The same open as the kernel sends it: a one-path record.
		{TS: 9, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpOpen, Nr: 257, Flags: fPaths | fPath1, Ret: 3,
			Args: [6]uint64{^uint64(99), 0x1000, 0o101, 0o644},
			FI:   [2]fdInfo{{Ino: 5, Dev: 1<<20 | 2, Mode: sIFREG | 0o644, FD: 3, Valid: true}, {FD: -100}},
			Path: [2]string{"a.txt"}, HasP: [2]bool{true}},
		// An unlink whose path fills its slot.
		{TS: 10, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpUnlink, Nr: 87, Flags: fPaths | fPath1 | fP0Trunc,
			FI: [2]fdInfo{{FD: -1}, {FD: -1}}, Path: [2]string{strings.Repeat("d/", pathMax/2)}, HasP: [2]bool{true}},
		{TS: 2, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpWrite, Nr: 1, Ret: 12,
			Args: [6]uint64{3, 0x2000, 12},
			FI:   [2]fdInfo{{Ino: 5, Pos: 12, Dev: 1<<20 | 2, Mode: sIFREG | 0o644, FD: 3, Valid: true}, {FD: -1}}},
		{TS: 3, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpRename, Nr: 82, Flags: fPaths,
			Path: [2]string{"old", "new"}, HasP: [2]bool{true, true}, FI: [2]fdInfo{{FD: -1}, {FD: -1}}},
		{TS: 4, Tgid: 10, Tid: 10, Target: 1, Kind: kFork, Args: [6]uint64{12}, FI: [2]fdInfo{{FD: -1}, {FD: -1}}},
		{TS: 5, Tgid: 12, Tid: 12, Target: 1, Kind: kExit, FI: [2]fdInfo{{FD: -1}, {FD: -1}}},
		{TS: 6, Kind: kMarker, Args: [6]uint64{7}, FI: [2]fdInfo{{FD: -1}, {FD: -1}}},
		// A write and a pread whose bytes the kernel copied: all of them,
		// and the first dataMax of a larger read.
		{TS: 7, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpWrite, Nr: 1, Ret: 12,
			Args: [6]uint64{3, 0x2000, 12},
			FI:   [2]fdInfo{{Ino: 5, Pos: 12, Dev: 1<<20 | 2, Mode: sIFREG | 0o644, FD: 3, Valid: true}, {FD: -1}},
			Data: "hello world\n", HasData: true, Whole: true},
		{TS: 8, Tgid: 10, Tid: 11, Target: 1, Kind: kSyscall, Op: OpRead, Nr: 17, Ret: 10000,
			Args: [6]uint64{3, 0x2000, 20000, 0},
			FI:   [2]fdInfo{{Ino: 5, Pos: 0, Dev: 1<<20 | 2, Mode: sIFREG | 0o644, FD: 3, Valid: true}, {FD: -1}},
			Data: strings.Repeat("x\x00", dataMax/2), HasData: true},
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, want := range sampleEvents() {
		got, err := decodeEvent(encodeEvent(&want))
		if err != nil {
			t.Fatalf("decode %+v: %v", want, err)
		}
		// decodeEvent reports FI validity from the flags encodeEvent set.
		want.Flags = got.Flags
		if got != want {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	ok := sampleEvents()[0]
	good := encodeEvent(&ok)
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	withData := sampleEvents()[8]
	one := sampleEvents()[1]
	good1 := encodeEvent(&one)
	mod1 := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good1...)) }
	data := encodeEvent(&withData)
	modData := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), data...)) }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "0 bytes"},
		{"short header", good[:eventSize-1], "want at least"},
		{"short path record", good[:eventSize+10], "path record of"},
		{"short one-path record", good1[:path1EventSize-1], "path record of 687 bytes, want 688"},
		{"one-path record read as two", mod1(func(b []byte) []byte { b[offFlags+1] &^= fPath1 >> 8; return b }), "want 1200"},
		{"second path in a one-path record", mod1(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[offPlen+2:], 1); return b }), "with a second path"},
		{"one-path flag without paths", mod(func(b []byte) []byte { b[offFlags+1] = fPath1 >> 8; return b }), "one-path flag without paths"},
		{"kind", mod(func(b []byte) []byte { b[offKind] = 9; return b }), "kind 9"},
		{"op", mod(func(b []byte) []byte { b[offOp] = byte(opMax); return b }), "op"},
		{"nr", mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[offNr:], 999); return b }), "syscall number 999"},
		{"path length", mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[offPlen:], pathMax+1); return b }), "length 513"},
		{"data short", data[:len(data)-1], "data record of"},
		{"data length 0", modData(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[offDlen:], 0); return b }), "data length 0"},
		{"data length over cap", modData(func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[offDlen:], dataMax+1)
			return append(b, make([]byte, dataMax)...)
		}), "data length 4097"},
		{"data over ret", modData(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offRet:], 11); return b }), "over the return value 11"},
		{"whole but short", modData(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offRet:], 13); return b }), "whole data of 12 bytes, return value 13"},
		{"whole without data", mod(func(b []byte) []byte { b[offFlags+1] |= fWhole >> 8; return b }), "whole-data flag without data"},
		{"data and paths", mod(func(b []byte) []byte { b[offFlags+1] |= fData >> 8; return b }), "both paths and data"},
		{"data of an open", modData(func(b []byte) []byte { b[offOp] = byte(OpOpen); return b }), "data in a record"},
	} {
		_, err := decodeEvent(tc.b)
		if !errors.Is(err, errWire) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want errWire with %q", tc.name, err, tc.want)
		}
	}
}

// FuzzDecodeEvent: no input makes the decoder panic, and what decodes
// re-encodes to a record that decodes the same.
func FuzzDecodeEvent(f *testing.F) {
	for _, e := range sampleEvents() {
		f.Add(encodeEvent(&e))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEvent(b)
		if err != nil {
			return
		}
		again, err := decodeEvent(encodeEvent(&e))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		e.Flags, again.Flags = 0, 0
		// Paths are cut at their first NUL on the way back.
		for i := range e.Path {
			if j := strings.IndexByte(e.Path[i], 0); j >= 0 {
				e.Path[i] = e.Path[i][:j]
			}
			if j := strings.IndexByte(again.Path[i], 0); j >= 0 {
				again.Path[i] = again.Path[i][:j]
			}
			if again.Path[i] == "" && e.Path[i] == "" {
				again.HasP[i] = e.HasP[i]
			}
		}
		if again != e {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, e)
		}
	})
}

// TestDecodeIntoReused decodes a stream into one reused rawEvent, with
// the last-path table Run keeps: each record decodes as it would alone
// (nothing of the previous record is left: a path record after a record
// without paths, a record without paths after one with them), and a
// repeated path is the same string again.
func TestDecodeIntoReused(t *testing.T) {
	evs := sampleEvents()
	other := evs[0]
	other.Path[0] = "b.txt"
	again := other
	again.TS = 9
	stream := append(evs, other, again, evs[1])
	var e rawEvent
	var last [2]string
	var prev string
	for i, want := range stream {
		if err := decodeInto(&e, encodeEvent(&want), &last); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		alone, err := decodeEvent(encodeEvent(&want))
		if err != nil {
			t.Fatal(err)
		}
		if e != alone {
			t.Errorf("record %d decoded into a reused event as\n%+v\nalone as\n%+v", i, e, alone)
		}
		if i == len(evs)+1 && unsafe.StringData(e.Path[0]) != unsafe.StringData(prev) {
			t.Errorf("record %d: the repeated path %q was copied again", i, e.Path[0])
		}
		if e.HasP[0] {
			prev = e.Path[0]
		}
	}
}
