// Package pvh finds the PVH entry point note of an x86-64 ELF kernel:
// the Xen ELF note of type XEN_ELFNOTE_PHYS32_ENTRY that Cloud
// Hypervisor's loader (linux-loader's Elf::load, used by Vm::load_kernel
// in vmm/src/vm.rs) needs to boot an ELF vmlinux ("Kernel lacks PVH
// header" otherwise). Pure Go; its note parser has a fuzz target.
package pvh

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// NoteType is XEN_ELFNOTE_PHYS32_ENTRY, under the note name "Xen".
const NoteType = 18

// HasEntry reports whether the ELF file at path has the PVH entry note
// in a PT_NOTE segment.
func HasEntry(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, fmt.Errorf("pvh: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			return false, fmt.Errorf("pvh: %s: note segment: %w", path, err)
		}
		if FindEntry(b, f.ByteOrder) {
			return true, nil
		}
	}
	return false, nil
}

// FindEntry reports whether the notes in b (a PT_NOTE segment's bytes)
// hold the PVH entry note.
func FindEntry(b []byte, order binary.ByteOrder) bool {
	for len(b) >= 12 {
		namesz := uint64(order.Uint32(b[0:]))
		descsz := uint64(order.Uint32(b[4:]))
		typ := order.Uint32(b[8:])
		nameEnd := 12 + align4(namesz)
		end := nameEnd + align4(descsz)
		if nameEnd > uint64(len(b)) || end > uint64(len(b)) {
			return false
		}
		if typ == NoteType && bytes.Equal(bytes.TrimRight(b[12:12+namesz], "\x00"), []byte("Xen")) {
			return true
		}
		b = b[end:]
	}
	return false
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// WriteKernel writes a minimal ELF64 x86-64 file whose only segment is
// a PT_NOTE with the PVH entry note: a stand-in for a vmlinux in tests.
func WriteKernel(path string) error {
	const ehsize, phsize = 64, 56
	var note []byte
	note = binary.LittleEndian.AppendUint32(note, 4) // namesz: "Xen\0"
	note = binary.LittleEndian.AppendUint32(note, 4) // descsz
	note = binary.LittleEndian.AppendUint32(note, NoteType)
	note = append(note, 'X', 'e', 'n', 0)
	note = binary.LittleEndian.AppendUint32(note, 0x1000000) // the 32-bit entry
	hdr := elf.Header64{
		Ident:     [16]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:      uint16(elf.ET_EXEC),
		Machine:   uint16(elf.EM_X86_64),
		Version:   uint32(elf.EV_CURRENT),
		Entry:     0x1000000,
		Phoff:     ehsize,
		Ehsize:    ehsize,
		Phentsize: phsize,
		Phnum:     1,
	}
	prog := elf.Prog64{Type: uint32(elf.PT_NOTE), Off: ehsize + phsize, Filesz: uint64(len(note)), Memsz: uint64(len(note)), Align: 4}
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, hdr)
	binary.Write(&b, binary.LittleEndian, prog)
	b.Write(note)
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("pvh: %w", err)
	}
	return nil
}
