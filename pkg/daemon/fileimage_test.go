package daemon

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/staging"
)

// sysRecord is a successful system call's record on path, inside M, as f
// completes it.
func sysRecord(op fileev.Op, path string, f func(r *fileev.Record)) *fileev.Record {
	r := &fileev.Record{Kind: fileev.KindSyscall, Op: op, Path: path, InRoot: true}
	if f != nil {
		f(r)
	}
	return r
}

// The image of a file follows its records: what proves a staged file,
// and what drops or forbids its image.
func TestFileImages(t *testing.T) {
	create := func(p string) *fileev.Record {
		return sysRecord(fileev.OpOpen, p, func(r *fileev.Record) { r.Flags = unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC; r.Ret = 3 })
	}
	write := func(p string, off int64, data string) *fileev.Record {
		return sysRecord(fileev.OpWrite, p, func(r *fileev.Record) {
			r.Offset, r.Content, r.Ret, r.ContentCaptured = off, data, int64(len(data)), true
		})
	}
	mmapW := func(p string) *fileev.Record {
		return sysRecord(fileev.OpMmap, p, func(r *fileev.Record) { r.Mode, r.Flags = 0x3, 0x1 })
	}
	rename := func(from, to string) *fileev.Record {
		return sysRecord(fileev.OpRename, from, func(r *fileev.Record) { r.Path2, r.InRoot2 = to, true })
	}
	for _, tc := range []struct {
		name    string
		recs    []*fileev.Record
		content string // the staged file a
		want    bool
	}{
		{"created and written", []*fileev.Record{create("a"), write("a", 0, "hello "), write("a", 6, "world")}, "hello world", true},
		{"written at an offset", []*fileev.Record{create("a"), write("a", 2, "xy")}, "\x00\x00xy", true},
		{"other content", []*fileev.Record{create("a"), write("a", 0, "hello")}, "hellO", false},
		{"never created here", []*fileev.Record{write("a", 0, "hello")}, "hello", false},
		{"open without O_TRUNC", []*fileev.Record{sysRecord(fileev.OpOpen, "a", func(r *fileev.Record) { r.Flags = unix.O_WRONLY | unix.O_CREAT; r.Ret = 3 }), write("a", 0, "hello")}, "hello", false},
		{"O_EXCL", []*fileev.Record{sysRecord(fileev.OpOpen, "a", func(r *fileev.Record) { r.Flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL; r.Ret = 3 }), write("a", 0, "hi")}, "hi", true},
		{"write not captured", []*fileev.Record{create("a"), sysRecord(fileev.OpWrite, "a", func(r *fileev.Record) { r.Content, r.Ret = "hello", 5 })}, "hello", false},
		{"write cut", []*fileev.Record{create("a"), sysRecord(fileev.OpWrite, "a", func(r *fileev.Record) {
			r.Content, r.Ret, r.ContentCaptured, r.ContentTruncated = "hel", 5, true, true
		})}, "hel", false},
		{"truncated to empty again", []*fileev.Record{create("a"), sysRecord(fileev.OpWrite, "a", func(r *fileev.Record) { r.Content, r.Ret = "x", 1 }),
			sysRecord(fileev.OpTruncate, "a", nil), write("a", 0, "ok")}, "ok", true},
		{"truncated to a size", []*fileev.Record{create("a"), write("a", 0, "hello"), sysRecord(fileev.OpTruncate, "a", func(r *fileev.Record) { r.Length = 2 })}, "he", false},
		{"copied into", []*fileev.Record{create("a"), sysRecord(fileev.OpCopy, "b", func(r *fileev.Record) { r.Path2, r.InRoot2, r.Ret = "a", true, 5 })}, "", false},
		{"mapped, then emptied", []*fileev.Record{create("a"), mmapW("a"), create("a"), write("a", 0, "hi")}, "hi", false},
		{"mapped, its directory renamed, emptied", []*fileev.Record{mmapW("d/c"), rename("d", "e"), create("e/c"), write("e/c", 0, "x"), rename("e/c", "a"), create("a"), write("a", 0, "hi")}, "hi", false},
		{"renamed onto", []*fileev.Record{create("a"), write("a", 0, "hi"), create("b"), rename("b", "a")}, "hi", false},
		{"linked", []*fileev.Record{create("a"), write("a", 0, "hi"), sysRecord(fileev.OpLink, "a", func(r *fileev.Record) { r.Path2, r.InRoot2 = "b", true })}, "hi", false},
		{"records lost", []*fileev.Record{create("a"), write("a", 0, "hi"), {Kind: fileev.KindLoss, Lost: 1}, create("a"), write("a", 0, "hi")}, "hi", false},
		{"malformed", []*fileev.Record{create("a"), {Kind: fileev.KindSyscall, Op: fileev.OpWrite, Ret: 1, Malformed: "unknown fd"}, write("a", 0, "hi")}, "hi", false},
		{"too large", []*fileev.Record{create("a"), write("a", maxImage, "x")}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fi fileImages
			for _, r := range tc.recs {
				fi.note(r)
			}
			c := staging.Change{Op: staging.OpCreate, Path: "a", Type: staging.TypeFile, Size: int64(len(tc.content))}
			img, ok := fi.imageOf(c)
			if got := ok && string(img) == tc.content; got != tc.want {
				t.Errorf("proved %v, want %v", got, tc.want)
			}
			c.Op = staging.OpChmod // no content of its own
			if _, ok := fi.imageOf(c); ok {
				t.Errorf("a chmod has an image")
			}
		})
	}
}
