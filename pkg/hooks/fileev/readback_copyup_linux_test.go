package fileev

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// A file of the lower layer with a second link (carbd's frozen base is a
// hard-link farm of the working directory), changed by the agent (a
// copy-up) and then read in more than the capture holds: its content is
// read back. The kernel's inode for the open file (what the record
// carries) is the overlay's, stat of the re-opened file gives the upper
// file's: the read-back must still recognise the same file, not report
// it "replaced" (an unattributed read: every sensitive file would count
// as read).
func TestReadBackCopiedUpLinkedFile(t *testing.T) {
	testutil.RequireRoot(t)
	root := mountOverlay(t)
	lower := filepath.Join(filepath.Dir(root), "lower")
	body := strings.Repeat("0123456789abcdef", 1024) // 16 KiB: past the capture
	if err := os.WriteFile(filepath.Join(lower, "notes.txt"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(lower, "notes.txt"), filepath.Join(filepath.Dir(root), "second-link")); err != nil {
		t.Fatal(err)
	}
	cg, err := NewCgroup(testutil.UniqueName("fcopy"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Remove() })
	tr, col := newTracer(t, Config{Root: root})
	if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
		t.Fatal(err)
	}
	f, err := cg.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Append (the copy-up), then read the whole file in one call.
	cmd := exec.Command("/usr/bin/python3", "-S", "-c", `
with open("notes.txt", "a") as f: f.write("appended\n")
with open("notes.txt", "rb", buffering=0) as f: f.read(1 << 20)
`)
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python3: %v %s", err, out)
	}
	syncTracer(t, tr)
	col.mu.Lock()
	defer col.mu.Unlock()
	var read *Record
	for _, r := range col.recs {
		if r.Kind == KindSyscall && r.Op == OpRead && r.Path == "notes.txt" && r.Ret > 0 {
			read = &r
		}
	}
	if read == nil {
		t.Fatal("no read record of notes.txt")
	}
	if read.ContentErr != "" || read.ContentCaptured || !strings.HasPrefix(read.Content, "0123456789abcdef") {
		t.Errorf("read of the copied-up file: captured %v, content %d bytes, error %q; want its bytes read back", read.ContentCaptured, len(read.Content), read.ContentErr)
	}
}
