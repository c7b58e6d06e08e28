package staging

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sampleSeen() []byte {
	b := []byte(seenMagic)
	b = appendSeenSet(b, "a", wstamp{Type: TypeFile, Ino: 12, Size: 3, Mtime: 1700000000123456789, Ctime: 1700000000987654321})
	b = appendSeenSet(b, "d", wstamp{Type: TypeDir, Ino: 13})
	b = appendSeenSet(b, "d/x\nname\xff", wstamp{Type: TypeFile, Ino: 14, Size: 1 << 40, Mtime: -5, Ctime: 7})
	b = appendSeenSet(b, "d/sub", wstamp{Type: TypeDir, Ino: 15})
	b = appendSeenSet(b, "d/sub/y", wstamp{Type: TypeSymlink, Ino: 16, Size: 1})
	b = appendSeenSet(b, "a", wstamp{Type: TypeFile, Ino: 17, Size: 4, Mtime: 8, Ctime: 9}) // a commit replaced it
	b = appendSeenDel(b, "d/sub")                                                           // removed with what is below
	return b
}

func TestSeenLog(t *testing.T) {
	got, err := decodeSeen(sampleSeen(), "seen")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]wstamp{
		"a":             {Type: TypeFile, Ino: 17, Size: 4, Mtime: 8, Ctime: 9},
		"d":             {Type: TypeDir, Ino: 13},
		"d/x\nname\xff": {Type: TypeFile, Ino: 14, Size: 1 << 40, Mtime: -5, Ctime: 7},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("replayed seen log (-want +got):\n%s", d)
	}
	// A record torn by a crash ends the log; the records before it stand.
	full := sampleSeen()
	for cut := len(seenMagic); cut < len(full); cut++ {
		m, err := decodeSeen(full[:cut], "seen")
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if len(m) > 5 {
			t.Fatalf("cut at %d: %d entries", cut, len(m))
		}
	}
	// Damage elsewhere is reported.
	bad := sampleSeen()
	bad[len(seenMagic)+3] ^= 0xff
	if _, err := decodeSeen(bad, "seen"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flipped byte: %v, want ErrCorrupt", err)
	}
	if _, err := decodeSeen([]byte("CARBDX1\nxx"), "seen"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bad magic: %v, want ErrCorrupt", err)
	}
	if _, err := decodeSeen(appendSeenSet([]byte(seenMagic), "../x", wstamp{Type: TypeFile}), "seen"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("unclean path: %v, want ErrCorrupt", err)
	}
}

func TestStampSameEntry(t *testing.T) {
	f := wstamp{Type: TypeFile, Ino: 1, Size: 2, Mtime: 3, Ctime: 4}
	for _, c := range []struct {
		name string
		b    wstamp
		same bool
	}{
		{"identical", f, true},
		{"write in place (ctime)", wstamp{Type: TypeFile, Ino: 1, Size: 2, Mtime: 3, Ctime: 5}, false},
		{"write in place, mtime restored", wstamp{Type: TypeFile, Ino: 1, Size: 2, Mtime: 3, Ctime: 6}, false},
		{"replaced (inode)", wstamp{Type: TypeFile, Ino: 9, Size: 2, Mtime: 3, Ctime: 4}, false},
		{"resized", wstamp{Type: TypeFile, Ino: 1, Size: 3, Mtime: 3, Ctime: 4}, false},
		{"became a directory", wstamp{Type: TypeDir, Ino: 1}, false},
	} {
		if got := f.sameEntry(c.b); got != c.same {
			t.Errorf("%s: sameEntry = %v, want %v", c.name, got, c.same)
		}
	}
	d := wstamp{Type: TypeDir, Ino: 5, Mtime: 1, Ctime: 1}
	if !d.sameEntry(wstamp{Type: TypeDir, Ino: 5, Mtime: 2, Ctime: 2}) {
		t.Errorf("a directory whose entries changed is still the same directory")
	}
}

func FuzzSeen(f *testing.F) {
	f.Add(sampleSeen())
	f.Add([]byte(seenMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeSeen(data, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		// What decodes re-encodes to a log that decodes the same.
		b := []byte(seenMagic)
		for p, st := range m {
			if checkRel(p) != nil || st.Type == TypeNone || !validType(st.Type) {
				t.Fatalf("decoded an invalid entry %q %+v", p, st)
			}
			b = appendSeenSet(b, p, st)
		}
		again, err := decodeSeen(b, "again")
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(m, again); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}
