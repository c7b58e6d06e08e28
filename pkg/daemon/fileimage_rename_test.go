package daemon

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/staging"
)

// An image goes with its file through a rename within M (a temporary
// file saved over its target), an exchange swaps two, and what cannot be
// proved sound still drops it: each case says what proves the staged
// file a (and b), or why it is not proved.
func TestFileImageRenames(t *testing.T) {
	create := func(p string) *fileev.Record {
		return sysRecord(fileev.OpOpen, p, func(r *fileev.Record) { r.Flags = unix.O_RDWR | unix.O_CREAT | unix.O_EXCL; r.Ret = 3 })
	}
	write := func(p, data string) *fileev.Record {
		return sysRecord(fileev.OpWrite, p, func(r *fileev.Record) {
			r.Content, r.Ret, r.ContentCaptured = data, int64(len(data)), true
		})
	}
	rename := func(from, to string, flags uint64) *fileev.Record {
		return sysRecord(fileev.OpRename, from, func(r *fileev.Record) { r.Path2, r.InRoot2, r.Flags = to, true, flags })
	}
	type want struct {
		path, content, why string // why "": proved with content
	}
	for _, tc := range []struct {
		name string
		recs []*fileev.Record
		want []want
	}{
		{"saved over its target", []*fileev.Record{create("a"), write("a", "old"), create(".a.tmp"), write(".a.tmp", "new"), rename(".a.tmp", "a", 0)},
			[]want{{"a", "new", ""}, {".a.tmp", "", whyNotNew}}},
		{"saved over a file of W", []*fileev.Record{create("sedX1"), write("sedX1", "edited"), rename("sedX1", "a", 0)},
			[]want{{"a", "edited", ""}}},
		{"RENAME_NOREPLACE", []*fileev.Record{create("t"), write("t", "x"), rename("t", "a", renameNoreplace)}, []want{{"a", "x", ""}}},
		{"written after the rename", []*fileev.Record{create("t"), write("t", "ab"), rename("t", "a", 0), write("a", "AB")},
			[]want{{"a", "AB", ""}}},
		{"renamed twice", []*fileev.Record{create("t"), write("t", "x"), rename("t", "u", 0), rename("u", "a", 0)}, []want{{"a", "x", ""}}},
		{"its directory renamed", []*fileev.Record{create("d/a"), write("d/a", "x"), rename("d", "e", 0)},
			[]want{{"e/a", "x", whyDirRenamed}, {"d/a", "", whyNotNew}}},
		{"its directory exchanged", []*fileev.Record{create("d/a"), write("d/a", "x"), create("e/b"), write("e/b", "y"), rename("d", "e", renameExchange)},
			[]want{{"e/a", "x", whyDirRenamed}, {"d/b", "y", whyDirRenamed}}},
		{"exchanged", []*fileev.Record{create("a"), write("a", "one"), create("b"), write("b", "two"), rename("a", "b", renameExchange)},
			[]want{{"a", "two", ""}, {"b", "one", ""}}},
		{"exchanged with a file without an image", []*fileev.Record{create("t"), write("t", "new"), rename("t", "a", renameExchange)},
			[]want{{"a", "new", ""}, {"t", "", whyNotNew}}},
		{"exchanged with a mapped file", []*fileev.Record{create("t"), write("t", "new"), create("a"),
			sysRecord(fileev.OpMmap, "a", func(r *fileev.Record) { r.Mode, r.Flags = 0x3, 0x1 }), rename("t", "a", renameExchange)},
			[]want{{"a", "", whyMapping}, {"t", "", whyMapping}}},
		{"an uncaptured write, then renamed", []*fileev.Record{create("t"), sysRecord(fileev.OpWrite, "t", func(r *fileev.Record) { r.Content, r.Ret = "x", 1 }), rename("t", "a", 0)},
			[]want{{"a", "x", whyUncaptured}}},
		{"a write past the capture, then renamed", []*fileev.Record{create("t"), sysRecord(fileev.OpWrite, "t", func(r *fileev.Record) {
			r.Content, r.Ret, r.ContentCaptured, r.ContentTruncated = "x", 2, true, true
		}), rename("t", "a", 0)},
			[]want{{"a", "x", whyCut}}},
		{"mapped, then renamed", []*fileev.Record{create("t"), write("t", "x"), sysRecord(fileev.OpMmap, "t", func(r *fileev.Record) { r.Mode, r.Flags = 0x3, 0x1 }), rename("t", "a", 0)},
			[]want{{"a", "x", whyMapping}}},
		{"linked, then renamed", []*fileev.Record{create("t"), write("t", "x"), sysRecord(fileev.OpLink, "t", func(r *fileev.Record) { r.Path2, r.InRoot2 = "u", true }), rename("t", "a", 0)},
			[]want{{"a", "x", whyLink}}},
		{"renamed in from outside", []*fileev.Record{create("a"), write("a", "x"), sysRecord(fileev.OpRename, "/tmp/t", func(r *fileev.Record) { r.InRoot, r.Path2, r.InRoot2 = false, "a", true })},
			[]want{{"a", "x", whyRenamedIn}}},
		{"an unknown flag", []*fileev.Record{create("t"), write("t", "x"), rename("t", "a", 0x80)}, []want{{"a", "x", "a rename with unknown flags"}}},
		{"copied into after the rename", []*fileev.Record{create("t"), write("t", "x"), rename("t", "a", 0),
			sysRecord(fileev.OpCopy, "b", func(r *fileev.Record) { r.Path2, r.InRoot2, r.Ret = "a", true, 1 })},
			[]want{{"a", "x", whyCopy}}},
		{"records lost", []*fileev.Record{create("t"), write("t", "x"), {Kind: fileev.KindLoss, Lost: 1}, rename("t", "a", 0)}, []want{{"a", "x", whyLoss}}},
		{"removed", []*fileev.Record{create("a"), write("a", "x"), sysRecord(fileev.OpUnlink, "a", nil)}, []want{{"a", "x", whyRemoved}}},
		{"a failed rename", []*fileev.Record{create("a"), write("a", "x"), create("t"), write("t", "y"),
			sysRecord(fileev.OpRename, "t", func(r *fileev.Record) { r.Path2, r.InRoot2, r.Flags, r.Ret = "a", true, renameNoreplace, -17 })},
			[]want{{"a", "x", ""}, {"t", "y", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fi fileImages
			for _, r := range tc.recs {
				fi.note(r)
			}
			for _, w := range tc.want {
				c := staging.Change{Op: staging.OpWrite, Path: w.path, Type: staging.TypeFile, Size: int64(len(w.content))}
				img, why := fi.proof(c)
				switch {
				case why != w.why:
					t.Errorf("%s: not proved because %q, want %q", w.path, why, w.why)
				case why == "" && string(img) != w.content:
					t.Errorf("%s: image %q, want %q", w.path, img, w.content)
				}
			}
		})
	}
}

// An aborted change forgets its path's image: the merged view no longer
// holds what it says.
func TestFileImageAborted(t *testing.T) {
	var fi fileImages
	fi.note(&fileev.Record{Kind: fileev.KindSyscall, Op: fileev.OpOpen, Path: "a", InRoot: true, Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC, Ret: 3})
	fi.note(&fileev.Record{Kind: fileev.KindSyscall, Op: fileev.OpWrite, Path: "a", InRoot: true, Content: "x", Ret: 1, ContentCaptured: true})
	fi.aborted("a")
	if _, why := fi.proof(staging.Change{Op: staging.OpCreate, Path: "a", Type: staging.TypeFile, Size: 1}); why != whyAborted {
		t.Errorf("an aborted file is not proved because %q, want %q", why, whyAborted)
	}
}
