package staging

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
)

func sampleRecords() []record {
	return []record{
		{N: 1, Op: OpCreate, Path: "a", New: TypeFile, NewUID: 1000, NewGID: 1000},
		{N: 2, Op: OpWrite, Path: "dir/new\nline", New: TypeFile, Pre: TypeFile},
		{N: 3, Op: OpMkdir, Path: "\xff\xfe/bad utf8", New: TypeDir, NewMode: 0o755,
			NewXattrs: []xattr{{Name: "user.a", Value: []byte{0, 1, 2}}}, Pre: TypeFile},
		{N: 4, Op: OpRmdir, Path: "gone", New: TypeNone, Pre: TypeDir, PreMode: 0o700,
			PreXattrs: []xattr{{Name: "user.x", Value: []byte{}}}},
		{N: 5, Op: OpSymlink, Path: "l", New: TypeSymlink, Pre: TypeNone, NewUID: 1 << 31},
	}
}

func encodeJournal(t testing.TB, h journalHeader, rs []record) []byte {
	var buf bytes.Buffer
	jw, err := newJournalWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for i := range rs {
		if err := jw.Write(&rs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := jw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func decodeJournal(data []byte) (journalHeader, []record, error) {
	jr, err := newJournalReader(bytes.NewReader(data), "test")
	if err != nil {
		return journalHeader{}, nil, err
	}
	var rs []record
	for {
		r, err := jr.Next()
		if err == io.EOF {
			return jr.Header, rs, nil
		}
		if err != nil {
			return jr.Header, rs, err
		}
		rs = append(rs, *r)
	}
}

var cmpXattr = cmp.Comparer(func(a, b xattr) bool { return a.Name == b.Name && bytes.Equal(a.Value, b.Value) })

func TestJournalRoundTrip(t *testing.T) {
	h := journalHeader{ID: [16]byte{1, 2, 3}, IndexPre: true}
	rs := sampleRecords()
	data := encodeJournal(t, h, rs)
	gh, got, err := decodeJournal(data)
	if err != nil {
		t.Fatal(err)
	}
	if gh != h {
		t.Errorf("header = %+v, want %+v", gh, h)
	}
	if d := cmp.Diff(rs, got, cmpXattr); d != "" {
		t.Errorf("records (-want +got):\n%s", d)
	}
}

func TestJournalCorruption(t *testing.T) {
	data := encodeJournal(t, journalHeader{}, sampleRecords())
	// Every truncation is detected: the end marker is missing.
	for n := 0; n < len(data); n++ {
		if _, _, err := decodeJournal(data[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: err = %v, want ErrCorrupt", n, err)
		}
	}
	// Every single flipped bit is detected by a checksum or the parser.
	for i := 0; i < len(data); i++ {
		for bit := 0; bit < 8; bit++ {
			c := bytes.Clone(data)
			c[i] ^= 1 << bit
			if _, _, err := decodeJournal(c); err == nil {
				t.Fatalf("bit %d of byte %d flipped: decoded without error", bit, i)
			}
		}
	}
	// Trailing data after the end marker is refused.
	if _, _, err := decodeJournal(append(bytes.Clone(data), 0)); err == nil || !strings.Contains(err.Error(), "after the end marker") {
		t.Errorf("trailing byte: err = %v", err)
	}
	// The error names the file and the offset.
	_, _, err := decodeJournal(data[:40])
	if err == nil || !strings.Contains(err.Error(), "journal test at offset") {
		t.Errorf("error %v does not name the place", err)
	}
}

func TestJournalRejectsBadRecord(t *testing.T) {
	for _, r := range []record{
		{N: 1, Op: OpCreate, Path: "../escape", New: TypeFile},
		{N: 1, Op: OpCreate, Path: "/abs", New: TypeFile},
		{N: 1, Op: OpCreate, Path: "", New: TypeFile},
		{N: 1, Op: 0, Path: "a", New: TypeFile},
		{N: 1, Op: OpCreate, Path: "a", New: TypeSpecial},
	} {
		data := encodeJournal(t, journalHeader{}, []record{r})
		if _, _, err := decodeJournal(data); !errors.Is(err, ErrCorrupt) {
			t.Errorf("record %+v: err = %v, want ErrCorrupt", r, err)
		}
	}
}

func sampleIndex() map[string]indexEntry {
	return map[string]indexEntry{
		"a":            {Label: decide.Label{Integrity: decide.Trusted, Level: 2}, HasLabel: true},
		"b/c":          {Created: true},
		"new\nline":    {Label: decide.Label{Level: 7}, HasLabel: true, Created: true},
		"\xff\xfe/zzz": {Label: decide.Label{}, HasLabel: true},
	}
}

func TestIndexRoundTrip(t *testing.T) {
	for _, idx := range []map[string]indexEntry{{}, sampleIndex()} {
		var buf bytes.Buffer
		if err := encodeIndex(&buf, idx); err != nil {
			t.Fatal(err)
		}
		got, err := decodeIndex(buf.Bytes(), "test")
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(idx, got); d != "" {
			t.Errorf("index (-want +got):\n%s", d)
		}
	}
}

func TestIndexCorruption(t *testing.T) {
	var buf bytes.Buffer
	if err := encodeIndex(&buf, sampleIndex()); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	for n := 0; n < len(data); n++ {
		if _, err := decodeIndex(data[:n], "test"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: err = %v", n, err)
		}
	}
	for i := 0; i < len(data); i++ {
		c := bytes.Clone(data)
		c[i] ^= 0x10
		if _, err := decodeIndex(c, "test"); err == nil {
			t.Fatalf("byte %d flipped: decoded without error", i)
		}
	}
}

func FuzzJournal(f *testing.F) {
	f.Add(encodeJournal(f, journalHeader{IndexPre: true}, sampleRecords()))
	f.Add(encodeJournal(f, journalHeader{}, nil))
	f.Add([]byte(journalMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, rs, err := decodeJournal(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// What decodes re-encodes and decodes to the same records.
		h2, rs2, err := decodeJournal(encodeJournal(t, h, rs))
		if err != nil {
			t.Fatalf("re-encoded journal does not decode: %v", err)
		}
		if h2 != h || !cmp.Equal(rs, rs2, cmpXattr) {
			t.Fatalf("round trip differs: %s", cmp.Diff(rs, rs2, cmpXattr))
		}
		for _, r := range rs {
			if checkRel(r.Path) != nil {
				t.Fatalf("decoded unsafe path %q", r.Path)
			}
		}
	})
}

func FuzzIndex(f *testing.F) {
	var buf bytes.Buffer
	encodeIndex(&buf, sampleIndex())
	f.Add(buf.Bytes())
	buf.Reset()
	encodeIndex(&buf, map[string]indexEntry{})
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := decodeIndex(data, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		var out bytes.Buffer
		if err := encodeIndex(&out, idx); err != nil {
			t.Fatal(err)
		}
		idx2, err := decodeIndex(out.Bytes(), "fuzz")
		if err != nil {
			t.Fatalf("re-encoded index does not decode: %v", err)
		}
		if !cmp.Equal(idx, idx2) {
			t.Fatalf("round trip differs: %s", cmp.Diff(idx, idx2))
		}
	})
}

func samplePending() ([]byte, map[string]decide.Label) {
	b := []byte(pendingMagic)
	b = appendPendingRecord(b, "a", decide.Label{Integrity: decide.Trusted, Level: 1})
	b = appendPendingRecord(b, "new\nline/\xff", decide.Label{Level: 3})
	b = appendPendingRecord(b, "a", decide.Label{Integrity: decide.Trusted, Level: 2})
	return b, map[string]decide.Label{
		"a":              {Integrity: decide.Trusted, Level: 2},
		"new\nline/\xff": {Level: 3},
	}
}

func TestPendingLog(t *testing.T) {
	data, want := samplePending()
	got, err := decodePending(data, "test")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("pending (-want +got):\n%s", d)
	}
	// A crash can tear the last record: every truncation decodes to the
	// records before it.
	for n := 0; n < len(data); n++ {
		got, err := decodePending(data[:n], "test")
		if err != nil {
			t.Fatalf("truncated to %d: %v", n, err)
		}
		for p, l := range got {
			if w, ok := want[p]; !ok || (p != "a" && w != l) {
				t.Fatalf("truncated to %d: unexpected %q %v", n, p, l)
			}
		}
	}
	// Damage inside the log is an error, never silently dropped labels.
	c := bytes.Clone(data)
	c[len(pendingMagic)+3] ^= 1 // inside the first record's path
	if _, err := decodePending(c, "test"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("damaged record: %v, want ErrCorrupt", err)
	}
	if _, err := decodePending([]byte("NOTMAGIC"), "test"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("bad magic: %v", err)
	}
}

func FuzzPending(f *testing.F) {
	data, _ := samplePending()
	f.Add(data)
	f.Add([]byte(pendingMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodePending(data, "fuzz")
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		b := []byte(pendingMagic)
		for p, l := range got {
			if checkRel(p) != nil {
				t.Fatalf("decoded unsafe path %q", p)
			}
			b = appendPendingRecord(b, p, l)
		}
		again, err := decodePending(b, "fuzz")
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("round trip: %v %s", err, cmp.Diff(got, again))
		}
	})
}
