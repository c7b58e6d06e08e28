package pvh

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteKernelHasEntry(t *testing.T) {
	p := filepath.Join(t.TempDir(), "vmlinux")
	if err := WriteKernel(p); err != nil {
		t.Fatal(err)
	}
	if ok, err := HasEntry(p); !ok || err != nil {
		t.Fatalf("HasEntry of WriteKernel's file: %v %v", ok, err)
	}
	// The test binary is an ELF file without the note.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := HasEntry(self); ok || err != nil {
		t.Fatalf("HasEntry of the test binary: %v %v", ok, err)
	}
	bz := filepath.Join(t.TempDir(), "bzImage")
	os.WriteFile(bz, []byte("MZ not an ELF"), 0o644)
	if _, err := HasEntry(bz); err == nil {
		t.Fatal("HasEntry of a non-ELF file: no error")
	}
}

func note(name string, typ uint32, desc []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(name)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = append(b, name...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	b = append(b, desc...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func TestFindEntry(t *testing.T) {
	gnu := note("GNU\x00", 3, []byte("build-id-bytes"))
	for _, tc := range []struct {
		name  string
		notes []byte
		want  bool
	}{
		{"pvh", note("Xen\x00", NoteType, []byte{0, 0, 0, 1}), true},
		{"after another note", append(gnu, note("Xen\x00", NoteType, []byte{0, 0, 0, 1})...), true},
		{"other xen note", note("Xen\x00", 1, []byte("linux")), false},
		{"type 18 of another owner", note("GNU\x00", NoteType, nil), false},
		{"truncated", note("Xen\x00", NoteType, []byte{0, 0, 0, 1})[:15], false},
		{"empty", nil, false},
	} {
		if got := FindEntry(tc.notes, binary.LittleEndian); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func FuzzFindEntry(f *testing.F) {
	f.Add(note("Xen\x00", NoteType, []byte{0, 0, 0, 1}))
	f.Add(append(note("GNU\x00", 3, []byte("id")), note("Xen\x00", NoteType, nil)...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 18, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		FindEntry(b, binary.LittleEndian)
		FindEntry(b, binary.BigEndian)
	})
}
