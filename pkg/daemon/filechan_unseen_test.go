package daemon

import (
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/hooks/fileev"
)

// TestNoteUnseen: a write whose content the tracer could not read back,
// or captured from the caller's buffer (which can change after the
// kernel's copy), marks its path to be decided from the staging layer; the mark follows
// the file to its new name (rename, its directory renamed) and to a
// second one (link); removing a path forgets it; taking it once clears
// it.
func TestNoteUnseen(t *testing.T) {
	sc := func(op fileev.Op, ret int64, path, path2 string, f func(r *fileev.Record)) *fileev.Record {
		r := &fileev.Record{Kind: fileev.KindSyscall, Op: op, Ret: ret, Path: path, InRoot: path != "", Path2: path2, InRoot2: path2 != ""}
		if f != nil {
			f(r)
		}
		return r
	}
	gone := func(r *fileev.Record) { r.ContentErr = "open t.tmp in root: no such file or directory" }
	fc := &fileChannel{unseen: map[string]bool{}}
	for _, r := range []*fileev.Record{
		sc(fileev.OpWrite, 5, "seen.txt", "", nil),                                                          // content read back: seen
		sc(fileev.OpWrite, -28, "failed.txt", "", gone),                                                     // failed write: no effect
		sc(fileev.OpWrite, 5, "t.tmp", "", gone),                                                            // unseen
		sc(fileev.OpRename, 0, "t.tmp", "out.txt", nil),                                                     // follows it
		sc(fileev.OpWrite, 5, "big.bin", "", func(r *fileev.Record) { r.ContentTruncated = true }),          // cut at MaxContent
		sc(fileev.OpWrite, 5, "cap.txt", "", func(r *fileev.Record) { r.ContentCaptured = true }),           // captured: the buffer at sys_exit
		sc(fileev.OpCopy, 5, "/etc/passwd", "d/copy", func(r *fileev.Record) { r.InRoot = false; gone(r) }), // copy into M
		sc(fileev.OpRename, 0, "d", "e", nil),                                                               // its directory renamed
		sc(fileev.OpLink, 0, "big.bin", "big2.bin", nil),                                                    // a second name
		sc(fileev.OpMmap, 1, "db", "", func(r *fileev.Record) { r.Mode, r.Flags = 0x3, 0x1 }),               // shared writable mapping
		sc(fileev.OpMmap, 1, "lib.so", "", func(r *fileev.Record) { r.Mode, r.Flags = 0x3, 0x2 }),           // private: nothing written
		sc(fileev.OpWrite, 5, "tmp2", "", gone),
		sc(fileev.OpUnlink, 0, "tmp2", "", nil), // removed: forgotten
		sc(fileev.OpWrite, 5, "x", "", func(r *fileev.Record) { gone(r); r.Malformed = "cut" }),
		sc(fileev.OpRename, 0, "/outside/f", "in.txt", func(r *fileev.Record) { r.InRoot = false }), // into M untraced
		sc(fileev.OpWrite, 5, "s1", "", gone),
		sc(fileev.OpRename, 0, "s1", "s2", func(r *fileev.Record) { r.Flags = 0x2 }),                  // RENAME_EXCHANGE: both
		sc(fileev.OpRename, 0, "out.txt", "/outside/o", func(r *fileev.Record) { r.InRoot2 = false }), // out of M: kept
	} {
		fc.noteUnseen(r)
	}
	var got []string
	for p := range fc.unseen {
		got = append(got, p)
	}
	sort.Strings(got)
	want := []string{"big.bin", "big2.bin", "cap.txt", "db", "e/copy", "in.txt", "out.txt", "s1", "s2"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("unseen paths (-want +got):\n%s", d)
	}
	if !fc.takeUnseen("out.txt") || fc.takeUnseen("out.txt") || fc.takeUnseen("seen.txt") {
		t.Errorf("takeUnseen: out.txt is taken once, seen.txt never")
	}
}
