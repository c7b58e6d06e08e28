package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// wstamp identifies an entry of W as the agent's view has it: the base
// entry the run started from, or the entry a commit of this run put
// there. A staged change is committed only while W's entry still has its
// stamp (docs/staging.md, "Conflicts").
//
// The stamp is the inode number, size, mtime and ctime, not a content
// digest: taking it costs one stat per entry when the base is built
// (hashing would read all of W at every run), and it catches what a
// digest catches and more. A rename or a replacing write (editors,
// git checkout) brings another inode; a write in place changes mtime and
// ctime; a write that restores mtime (touch -d) still moves ctime, which
// no unprivileged call can set. Timestamps are fine-grained when
// queried (multigrain ctime, Linux 6.13 on ext4, xfs, btrfs and tmpfs),
// so two writes in one clock tick still differ. Directories are stamped
// by type and inode only: their times move with every entry below them,
// and what is below is checked entry by entry.
type wstamp struct {
	Type         Type
	Ino, Size    uint64
	Mtime, Ctime int64 // nanoseconds since the epoch
}

// sameEntry reports whether a and b stamp the same entry unchanged.
func (a wstamp) sameEntry(b wstamp) bool {
	if a.Type != b.Type || a.Ino != b.Ino {
		return false
	}
	return a.Type == TypeDir || (a.Size == b.Size && a.Mtime == b.Mtime && a.Ctime == b.Ctime)
}

// The seen log: the stamps of W's entries taken when the base is built,
// then one record per entry a commit changed. Replayed in order, later
// records win. Appended without fsync: a record lost to a power cut makes
// a later change of that path a reported conflict, never a lost edit.
//
//	'S' uvarint(len(path)) path type uvarint(ino) uvarint(size) uvarint(mtime) uvarint(ctime) crc32c
//	'D' uvarint(len(path)) path crc32c     (the path and everything below it are gone)
const seenMagic = "CARBDS1\n"

func appendSeenSet(b []byte, path string, st wstamp) []byte {
	start := len(b)
	b = append(b, 'S')
	b = appendBytes(b, []byte(path))
	b = append(b, byte(st.Type))
	b = binary.AppendUvarint(b, st.Ino)
	b = binary.AppendUvarint(b, st.Size)
	b = binary.AppendUvarint(b, uint64(st.Mtime))
	b = binary.AppendUvarint(b, uint64(st.Ctime))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

func appendSeenDel(b []byte, path string) []byte {
	start := len(b)
	b = append(b, 'D')
	b = appendBytes(b, []byte(path))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

// decodeSeen replays a seen log. A record cut short by the end of the
// file (a write torn by a crash) ends the log; any other damage is
// ErrCorrupt.
func decodeSeen(data []byte, name string) (map[string]wstamp, error) {
	out := make(map[string]wstamp)
	if len(data) < len(seenMagic) {
		return out, nil
	}
	if string(data[:len(seenMagic)]) != seenMagic {
		return nil, fmt.Errorf("%w: seen log %s: bad magic", ErrCorrupt, name)
	}
	off := len(seenMagic)
	for off < len(data) {
		br := &byteReader{b: data[off:]}
		tag := br.byte1()
		p := br.bytes(maxPathBytes, "path")
		var st wstamp
		if tag == 'S' {
			st.Type = Type(br.byte1())
			st.Ino = br.uvarint()
			st.Size = br.uvarint()
			st.Mtime = int64(br.uvarint())
			st.Ctime = int64(br.uvarint())
		}
		switch {
		case br.err == nil && len(br.b) < 4, errors.Is(br.err, io.ErrUnexpectedEOF):
			return out, nil // a record torn by a crash ends the log
		case br.err != nil:
			return nil, fmt.Errorf("%w: seen log %s at offset %d: %v", ErrCorrupt, name, off, br.err)
		}
		n := len(data[off:]) - len(br.b)
		if (tag != 'S' && tag != 'D') || crc32.Checksum(data[off:off+n], castagnoli) != binary.LittleEndian.Uint32(br.b) {
			return nil, fmt.Errorf("%w: seen log %s at offset %d: bad record", ErrCorrupt, name, off)
		}
		path := string(p)
		if err := checkRel(path); err != nil {
			return nil, fmt.Errorf("%w: seen log %s at offset %d: %v", ErrCorrupt, name, off, err)
		}
		if tag == 'S' {
			if st.Type == TypeNone || !validType(st.Type) {
				return nil, fmt.Errorf("%w: seen log %s at offset %d: type %d", ErrCorrupt, name, off, st.Type)
			}
			out[path] = st
		} else {
			forgetBelow(out, path)
		}
		off += n + 4
	}
	return out, nil
}

// forgetBelow removes path and everything below it from m.
func forgetBelow(m map[string]wstamp, path string) {
	st, ok := m[path]
	delete(m, path)
	if ok && st.Type != TypeDir {
		return
	}
	for q := range m {
		if under(q, path) {
			delete(m, q)
		}
	}
}
