package staging

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"

	"github.com/carbd/carbd/pkg/decide"
)

// The journal and the index are binary files: every path is a
// length-prefixed byte string, so names with newlines, invalid UTF-8 or
// any byte but NUL round-trip exactly.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	journalMagic = "CARBDJ1\n"
	indexMagic   = "CARBDX1\n"

	maxRecordBody = 1 << 20
	maxPathBytes  = 1 << 16
	maxXattrs     = 1024
	maxXattrName  = 255
	maxXattrValue = 64 << 10
)

// xattr is one extended attribute.
type xattr struct {
	Name  string
	Value []byte
}

func sortXattrs(xs []xattr) {
	sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
}

func equalXattrs(a, b []xattr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name || !bytes.Equal(a[i].Value, b[i].Value) {
			return false
		}
	}
	return true
}

// record is one journaled operation on W. The new image of a file or
// symlink is journal/new/<N>; the pre-image of a non-directory is
// journal/pre/<N> (a hard link made before applying); the pre-image of a
// removed or replaced directory is the directory itself, moved to
// journal/pre/<N> while applying.
type record struct {
	N         uint64
	Op        Op
	Path      string
	New       Type // TypeNone: removed; TypeFile/TypeSymlink: new image; TypeDir: mkdir or attributes
	NewMode   uint32
	NewUID    uint32
	NewGID    uint32
	NewXattrs []xattr // directories only
	Pre       Type    // W's entry before the commit
	PreMode   uint32  // directories only
	PreXattrs []xattr // directories only
}

// journalHeader opens the journal's record file.
type journalHeader struct {
	ID       [16]byte
	IndexPre bool // an index file existed before the commit (linked at journal/pre/index)
}

// journalWriter appends records; Close writes the end marker.
type journalWriter struct {
	w     *bufio.Writer
	count uint64
	buf   []byte
}

func newJournalWriter(w io.Writer, h journalHeader) (*journalWriter, error) {
	jw := &journalWriter{w: bufio.NewWriterSize(w, 64<<10)}
	var flags byte
	if h.IndexPre {
		flags |= 1
	}
	hdr := append([]byte(journalMagic), h.ID[:]...)
	hdr = append(hdr, flags)
	hdr = binary.LittleEndian.AppendUint32(hdr, crc32.Checksum(hdr, castagnoli))
	if _, err := jw.w.Write(hdr); err != nil {
		return nil, err
	}
	return jw, nil
}

func appendBytes(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendXattrs(b []byte, xs []xattr) []byte {
	b = binary.AppendUvarint(b, uint64(len(xs)))
	for _, x := range xs {
		b = appendBytes(b, []byte(x.Name))
		b = appendBytes(b, x.Value)
	}
	return b
}

func (jw *journalWriter) Write(r *record) error {
	b := jw.buf[:0]
	b = binary.AppendUvarint(b, r.N)
	b = append(b, byte(r.Op))
	b = appendBytes(b, []byte(r.Path))
	b = append(b, byte(r.New))
	b = binary.AppendUvarint(b, uint64(r.NewMode))
	b = binary.AppendUvarint(b, uint64(r.NewUID))
	b = binary.AppendUvarint(b, uint64(r.NewGID))
	b = appendXattrs(b, r.NewXattrs)
	b = append(b, byte(r.Pre))
	b = binary.AppendUvarint(b, uint64(r.PreMode))
	b = appendXattrs(b, r.PreXattrs)
	jw.buf = b
	if len(b) > maxRecordBody {
		return fmt.Errorf("staging: journal record for %q is %d bytes, over the %d limit", r.Path, len(b), maxRecordBody)
	}
	var pre [1 + binary.MaxVarintLen64]byte
	pre[0] = 'R'
	n := binary.PutUvarint(pre[1:], uint64(len(b)))
	if _, err := jw.w.Write(pre[:1+n]); err != nil {
		return err
	}
	if _, err := jw.w.Write(b); err != nil {
		return err
	}
	var c [4]byte
	binary.LittleEndian.PutUint32(c[:], crc32.Checksum(b, castagnoli))
	if _, err := jw.w.Write(c[:]); err != nil {
		return err
	}
	jw.count++
	return nil
}

// Close writes the end marker (the record count) and flushes.
func (jw *journalWriter) Close() error {
	b := []byte{'E'}
	b = binary.AppendUvarint(b, jw.count)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	if _, err := jw.w.Write(b); err != nil {
		return err
	}
	return jw.w.Flush()
}

// journalReader reads a record file written by journalWriter.
type journalReader struct {
	r      *bufio.Reader
	name   string
	off    int64
	count  uint64
	Header journalHeader
	body   []byte
	done   bool
}

func newJournalReader(r io.Reader, name string) (*journalReader, error) {
	jr := &journalReader{r: bufio.NewReaderSize(r, 64<<10), name: name}
	hdr := make([]byte, len(journalMagic)+16+1+4)
	if _, err := io.ReadFull(jr.r, hdr); err != nil {
		return nil, jr.errf("header: %v", err)
	}
	if string(hdr[:len(journalMagic)]) != journalMagic {
		return nil, jr.errf("bad magic %q", hdr[:len(journalMagic)])
	}
	n := len(hdr) - 4
	if crc32.Checksum(hdr[:n], castagnoli) != binary.LittleEndian.Uint32(hdr[n:]) {
		return nil, jr.errf("header checksum mismatch")
	}
	copy(jr.Header.ID[:], hdr[len(journalMagic):])
	flags := hdr[len(journalMagic)+16]
	if flags&^1 != 0 {
		return nil, jr.errf("unknown header flags %#x", flags)
	}
	jr.Header.IndexPre = flags&1 != 0
	jr.off = int64(len(hdr))
	return jr, nil
}

func (jr *journalReader) errf(format string, args ...any) error {
	return fmt.Errorf("%w: journal %s at offset %d: %s", ErrCorrupt, jr.name, jr.off, fmt.Sprintf(format, args...))
}

func (jr *journalReader) readUvarint() (uint64, error) {
	v, err := binary.ReadUvarint(jr.r)
	if err != nil {
		return 0, err
	}
	jr.off += int64(uvarintLen(v))
	return v, nil
}

func uvarintLen(v uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], v)
}

// Next returns the next record, or io.EOF after the end marker. A file
// that ends without the end marker is corrupt.
func (jr *journalReader) Next() (*record, error) {
	if jr.done {
		return nil, io.EOF
	}
	tag, err := jr.r.ReadByte()
	if err != nil {
		return nil, jr.errf("missing end marker after %d records: %v", jr.count, err)
	}
	jr.off++
	switch tag {
	case 'E':
		n, err := jr.readUvarint()
		if err != nil {
			return nil, jr.errf("end marker: %v", err)
		}
		var c [4]byte
		if _, err := io.ReadFull(jr.r, c[:]); err != nil {
			return nil, jr.errf("end marker checksum: %v", err)
		}
		b := []byte{'E'}
		b = binary.AppendUvarint(b, n)
		if crc32.Checksum(b, castagnoli) != binary.LittleEndian.Uint32(c[:]) {
			return nil, jr.errf("end marker checksum mismatch")
		}
		if n != jr.count {
			return nil, jr.errf("end marker counts %d records, file has %d", n, jr.count)
		}
		if _, err := jr.r.ReadByte(); err != io.EOF {
			return nil, jr.errf("data after the end marker")
		}
		jr.done = true
		return nil, io.EOF
	case 'R':
	default:
		return nil, jr.errf("unknown tag %#x", tag)
	}
	n, err := jr.readUvarint()
	if err != nil {
		return nil, jr.errf("record length: %v", err)
	}
	if n > maxRecordBody {
		return nil, jr.errf("record length %d over the %d limit", n, maxRecordBody)
	}
	if cap(jr.body) < int(n)+4 {
		jr.body = make([]byte, int(n)+4)
	}
	b := jr.body[:int(n)+4]
	if _, err := io.ReadFull(jr.r, b); err != nil {
		return nil, jr.errf("record body: %v", err)
	}
	if crc32.Checksum(b[:n], castagnoli) != binary.LittleEndian.Uint32(b[n:]) {
		return nil, jr.errf("record %d checksum mismatch", jr.count)
	}
	start := jr.off
	jr.off += int64(n) + 4
	r, err := decodeRecord(b[:n])
	if err != nil {
		jr.off = start
		return nil, jr.errf("record %d: %v", jr.count, err)
	}
	jr.count++
	return r, nil
}

// byteReader decodes fields from a record body.
type byteReader struct {
	b   []byte
	err error
}

func (br *byteReader) uvarint() uint64 {
	if br.err != nil {
		return 0
	}
	v, n := binary.Uvarint(br.b)
	if n == 0 {
		br.err = io.ErrUnexpectedEOF
		return 0
	}
	if n < 0 {
		br.err = errors.New("bad varint")
		return 0
	}
	br.b = br.b[n:]
	return v
}

func (br *byteReader) u32(what string) uint32 {
	v := br.uvarint()
	if v > 1<<32-1 && br.err == nil {
		br.err = fmt.Errorf("%s %d overflows 32 bits", what, v)
	}
	return uint32(v)
}

func (br *byteReader) byte1() byte {
	if br.err != nil {
		return 0
	}
	if len(br.b) == 0 {
		br.err = io.ErrUnexpectedEOF
		return 0
	}
	c := br.b[0]
	br.b = br.b[1:]
	return c
}

func (br *byteReader) bytes(limit int, what string) []byte {
	n := br.uvarint()
	if br.err != nil {
		return nil
	}
	if n > uint64(limit) {
		br.err = fmt.Errorf("%s length %d over the %d limit", what, n, limit)
		return nil
	}
	if uint64(len(br.b)) < n {
		br.err = fmt.Errorf("%s: %w", what, io.ErrUnexpectedEOF)
		return nil
	}
	v := br.b[:n:n]
	br.b = br.b[n:]
	return v
}

func (br *byteReader) xattrs() []xattr {
	n := br.uvarint()
	if br.err != nil {
		return nil
	}
	if n > maxXattrs {
		br.err = fmt.Errorf("%d xattrs over the %d limit", n, maxXattrs)
		return nil
	}
	var xs []xattr
	for i := uint64(0); i < n && br.err == nil; i++ {
		name := br.bytes(maxXattrName, "xattr name")
		val := br.bytes(maxXattrValue, "xattr value")
		xs = append(xs, xattr{Name: string(name), Value: append([]byte(nil), val...)})
	}
	return xs
}

func validOp(o Op) bool     { return o >= OpCreate && o <= OpMknod }
func validType(t Type) bool { return t <= TypeSpecial }

func decodeRecord(b []byte) (*record, error) {
	br := &byteReader{b: b}
	r := &record{}
	r.N = br.uvarint()
	r.Op = Op(br.byte1())
	r.Path = string(br.bytes(maxPathBytes, "path"))
	r.New = Type(br.byte1())
	r.NewMode = br.u32("mode")
	r.NewUID = br.u32("uid")
	r.NewGID = br.u32("gid")
	r.NewXattrs = br.xattrs()
	r.Pre = Type(br.byte1())
	r.PreMode = br.u32("mode")
	r.PreXattrs = br.xattrs()
	if br.err != nil {
		return nil, br.err
	}
	if len(br.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes", len(br.b))
	}
	if !validOp(r.Op) {
		return nil, fmt.Errorf("unknown op %d", r.Op)
	}
	if !validType(r.New) || r.New == TypeSpecial || !validType(r.Pre) {
		return nil, fmt.Errorf("bad entry type (new %d, pre %d)", r.New, r.Pre)
	}
	if err := checkRel(r.Path); err != nil {
		return nil, err
	}
	return r, nil
}

// indexEntry is what the index remembers of one path of W.
type indexEntry struct {
	Label    decide.Label
	HasLabel bool
	// Created marks a path carbd committed that the frozen base B does
	// not have: when the upper layer loses it (the guest deleted a purely
	// upper entry, which leaves no whiteout), Scan reports its removal.
	Created bool
}

// encodeIndex writes the index, sorted by path.
func encodeIndex(w io.Writer, idx map[string]indexEntry) error {
	paths := make([]string, 0, len(idx))
	for p := range idx {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	bw := bufio.NewWriterSize(w, 64<<10)
	crc := crc32.New(castagnoli)
	mw := io.MultiWriter(bw, crc)
	if _, err := io.WriteString(mw, indexMagic); err != nil {
		return err
	}
	var b []byte
	for _, p := range paths {
		e := idx[p]
		b = append(b[:0], 'P')
		b = appendBytes(b, []byte(p))
		var flags byte
		if e.HasLabel {
			flags |= 1
		}
		if e.Created {
			flags |= 2
		}
		b = append(b, flags)
		if e.HasLabel {
			b = append(b, byte(e.Label.Integrity), byte(e.Label.Level))
		}
		if _, err := mw.Write(b); err != nil {
			return err
		}
	}
	b = append(b[:0], 'E')
	b = binary.AppendUvarint(b, uint64(len(paths)))
	if _, err := mw.Write(b); err != nil {
		return err
	}
	var c [4]byte
	binary.LittleEndian.PutUint32(c[:], crc.Sum32())
	if _, err := bw.Write(c[:]); err != nil {
		return err
	}
	return bw.Flush()
}

// decodeIndex parses an index file; name is used in errors.
func decodeIndex(data []byte, name string) (map[string]indexEntry, error) {
	errf := func(off int, format string, args ...any) error {
		return fmt.Errorf("%w: index %s at offset %d: %s", ErrCorrupt, name, off, fmt.Sprintf(format, args...))
	}
	if len(data) < len(indexMagic)+4 || string(data[:len(indexMagic)]) != indexMagic {
		return nil, errf(0, "bad magic")
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, errf(len(body), "checksum mismatch")
	}
	idx := make(map[string]indexEntry)
	br := &byteReader{b: body[len(indexMagic):]}
	off := func() int { return len(body) - len(br.b) }
	var last string
	for {
		at := off()
		tag := br.byte1()
		if br.err != nil {
			return nil, errf(at, "missing end marker")
		}
		if tag == 'E' {
			n := br.uvarint()
			if br.err != nil {
				return nil, errf(at, "end marker: %v", br.err)
			}
			if n != uint64(len(idx)) {
				return nil, errf(at, "end marker counts %d entries, file has %d", n, len(idx))
			}
			if len(br.b) != 0 {
				return nil, errf(off(), "data after the end marker")
			}
			return idx, nil
		}
		if tag != 'P' {
			return nil, errf(at, "unknown tag %#x", tag)
		}
		p := string(br.bytes(maxPathBytes, "path"))
		flags := br.byte1()
		var e indexEntry
		if flags&1 != 0 {
			e.HasLabel = true
			integ := br.byte1()
			lvl := br.byte1()
			if integ > byte(decide.Trusted) && br.err == nil {
				return nil, errf(at, "integrity %d out of range", integ)
			}
			e.Label = decide.Label{Integrity: decide.Integrity(integ), Level: decide.Level(lvl)}
		}
		e.Created = flags&2 != 0
		if br.err != nil {
			return nil, errf(at, "entry: %v", br.err)
		}
		if flags&^3 != 0 || flags == 0 {
			return nil, errf(at, "bad flags %#x", flags)
		}
		if err := checkRel(p); err != nil {
			return nil, errf(at, "%v", err)
		}
		if len(idx) > 0 && p <= last {
			return nil, errf(at, "path %q out of order", p)
		}
		last = p
		idx[p] = e
	}
}

// The pending-label log: one record per Stage call, appended without
// fsync; rewritten compacted after every commit and abort.
//
//	'P' uvarint(len(path)) path integrity level crc32c(everything before)
const pendingMagic = "CARBDP1\n"

func appendPendingRecord(b []byte, path string, lb decide.Label) []byte {
	start := len(b)
	b = append(b, 'P')
	b = appendBytes(b, []byte(path))
	b = append(b, byte(lb.Integrity), byte(lb.Level))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decodePending replays a pending-label log: later records combine with
// earlier ones for the same path. A record cut short by the end of the
// file (a write torn by a crash) ends the log; any other damage is
// ErrCorrupt.
func decodePending(data []byte, name string) (map[string]decide.Label, error) {
	out := make(map[string]decide.Label)
	if len(data) == 0 {
		return out, nil
	}
	if len(data) < len(pendingMagic) {
		return out, nil // torn while writing the magic
	}
	if string(data[:len(pendingMagic)]) != pendingMagic {
		return nil, fmt.Errorf("%w: pending labels %s: bad magic", ErrCorrupt, name)
	}
	off := len(pendingMagic)
	for off < len(data) {
		br := &byteReader{b: data[off:]}
		tag := br.byte1()
		p := br.bytes(maxPathBytes, "path")
		integ := br.byte1()
		lvl := br.byte1()
		switch {
		case br.err == nil && len(br.b) < 4, errors.Is(br.err, io.ErrUnexpectedEOF):
			return out, nil // a record torn by a crash ends the log
		case br.err != nil:
			return nil, fmt.Errorf("%w: pending labels %s at offset %d: %v", ErrCorrupt, name, off, br.err)
		}
		n := len(data[off:]) - len(br.b)
		if tag != 'P' || crc32.Checksum(data[off:off+n], castagnoli) != binary.LittleEndian.Uint32(br.b) {
			return nil, fmt.Errorf("%w: pending labels %s at offset %d: bad record", ErrCorrupt, name, off)
		}
		if integ > byte(decide.Trusted) {
			return nil, fmt.Errorf("%w: pending labels %s at offset %d: integrity %d out of range", ErrCorrupt, name, off, integ)
		}
		path := string(p)
		if err := checkRel(path); err != nil {
			return nil, fmt.Errorf("%w: pending labels %s at offset %d: %v", ErrCorrupt, name, off, err)
		}
		lb := decide.Label{Integrity: decide.Integrity(integ), Level: decide.Level(lvl)}
		if old, ok := out[path]; ok {
			lb = old.Combine(lb)
		}
		out[path] = lb
		off += n + 4
	}
	return out, nil
}
