//go:build linux && amd64

package fileev

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// captureScript is a real python3 doing what editors and tools do: write
// a small file, read it, rename it and unlink it, as fast as it can (the
// file is gone long before the reader could read it back); then one
// write over the kernel's copy cap and one writev, kept in place.
const captureScript = `
import os
for i in range(%d):
    data = ("secret-%%d-" %% i).encode() + b"x" * 100
    with open("tmp%%d" %% i, "wb") as f:
        f.write(data)
    with open("tmp%%d" %% i, "rb") as f:
        f.read()
    os.rename("tmp%%d" %% i, "f%%d" %% i)
    os.unlink("f%%d" %% i)
fd = os.open("big.bin", os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"B" * 10000)
os.close(fd)
fd = os.open("vec.bin", os.O_WRONLY | os.O_CREAT, 0o644)
os.writev(fd, [b"vec-", b"tor"])
os.close(fd)
`

// TestContentCaptured: the bytes of a small write and of a read are
// copied by the kernel at the syscall, so a file renamed and unlinked at
// once still has its content seen (the write decided on the real bytes,
// the read attributed with what it returned); a write over the cap and a
// writev are read back from M. With ReadBack the kernel copies nothing.
func TestContentCaptured(t *testing.T) {
	testutil.RequireRoot(t)
	const n = 30
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"captured", Config{}},
		{"captured raw_tp", Config{Attach: MechRawTP}},
		{"cap 16", Config{MaxContent: 16}},
		{"read back", Config{ReadBack: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := mountOverlay(t)
			cg, err := NewCgroup(testutil.UniqueName("fcap"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cg.Remove() })
			cfg := tc.cfg
			cfg.Root = root
			tr, col := newTracer(t, cfg)
			if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
				t.Fatal(err)
			}
			f, err := cg.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			cmd := exec.Command("/usr/bin/python3", "-S", "-c", fmt.Sprintf(captureScript, n))
			cmd.Dir = root
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("python3: %v %s", err, out)
			}
			syncTracer(t, tr)

			maxContent := cfg.MaxContent
			if maxContent == 0 {
				maxContent = DefaultMaxContent
			}
			want := func(i int) string {
				s := fmt.Sprintf("secret-%d-", i) + strings.Repeat("x", 100)
				return s[:min(len(s), maxContent)]
			}
			writes, reads := map[string]Record{}, map[string]Record{}
			readEvents := map[string]string{}
			col.mu.Lock()
			for k, r := range col.recs {
				if r.Kind != KindSyscall || r.Ret <= 0 || !r.InRoot {
					continue
				}
				switch r.Op {
				case OpWrite:
					writes[r.Path] = r
				case OpRead:
					reads[r.Path] = r
					for _, ev := range col.evs[k] {
						if ev.Op == OpNameRead && ev.Dir == decide.In {
							readEvents[r.Path] = ev.Content
						}
					}
				}
			}
			col.mu.Unlock()

			lost := 0
			for i := range n {
				p := fmt.Sprintf("tmp%d", i)
				w, ok := writes[p]
				if !ok {
					t.Fatalf("no write record of %s", p)
				}
				r, ok := reads[p]
				if !ok {
					t.Fatalf("no read record of %s", p)
				}
				if cfg.ReadBack {
					if w.ContentCaptured || r.ContentCaptured {
						t.Errorf("%s: content captured with ReadBack", p)
					}
					if w.Content != want(i) || r.Content != want(i) {
						lost++
					}
					continue
				}
				for _, rec := range []Record{w, r} {
					if !rec.ContentCaptured || rec.Content != want(i) || rec.ContentErr != "" {
						t.Errorf("%s %s: captured %v content %q err %q, want %q captured",
							p, rec.Op, rec.ContentCaptured, rec.Content, rec.ContentErr, want(i))
					}
					if trunc := maxContent < len(fmt.Sprintf("secret-%d-", i))+100; rec.ContentTruncated != trunc {
						t.Errorf("%s %s: truncated %v, want %v", p, rec.Op, rec.ContentTruncated, trunc)
					}
				}
				if readEvents[p] != want(i) {
					t.Errorf("%s: read event content %q, want %q", p, readEvents[p], want(i))
				}
			}
			if cfg.ReadBack {
				t.Logf("read back: %d of %d files lost their content before the reader got to them", lost, n)
			}

			// Over the cap, and a writev: read back from M, where the
			// files stay.
			for p, content := range map[string]string{"big.bin": strings.Repeat("B", 10000), "vec.bin": "vec-tor"} {
				w, ok := writes[p]
				if !ok {
					t.Fatalf("no write record of %s", p)
				}
				content = content[:min(len(content), maxContent)]
				if w.Content != content || w.ContentErr != "" {
					t.Errorf("%s: content %.20q (%d bytes) err %q, want %d bytes", p, w.Content, len(w.Content), w.ContentErr, len(content))
				}
				// A copy of the first MaxContent bytes covers a write
				// larger than MaxContent; else a write over the cap
				// is read back.
				captured := !cfg.ReadBack && p == "big.bin" && maxContent <= dataMax
				if w.ContentCaptured != captured {
					t.Errorf("%s: captured %v, want %v", p, w.ContentCaptured, captured)
				}
				got, err := os.ReadFile(filepath.Join(root, p))
				if err != nil || !strings.HasPrefix(string(got), content) {
					t.Errorf("%s in M: %v", p, err)
				}
			}
		})
	}
}

// TestCaptureYieldsToLaggingReader: while twice the wake-up threshold (a
// quarter of the ring by default) or more waits unread, a read or write
// is recorded without its bytes (176 bytes, not
// up to 4,272) and its content is read back instead, so that a reader
// that lags does not lose records. The reader is held while a python3
// writes 150 files of 4 KiB into a 1 MiB ring: the first writes are
// captured, the last are not, every content is right, nothing is lost.
func TestCaptureYieldsToLaggingReader(t *testing.T) {
	testutil.RequireRoot(t)
	const n = 150
	root := mountOverlay(t)
	cg, err := NewCgroup(testutil.UniqueName("fcap"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cg.Remove() })
	tr, err := New(Config{Root: root, RingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	var gate sync.Mutex
	col := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	gate.Lock()
	go func() {
		done <- tr.Run(ctx, func(r *Record, evs []decide.Event) {
			gate.Lock()
			gate.Unlock() //lint:ignore SA2001 a gate, not a critical section
			col.handle(r, evs)
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		tr.Close()
	})
	if _, err := tr.Trace(Target{Cgroup: cg.Path}); err != nil {
		gate.Unlock()
		t.Fatal(err)
	}
	f, err := cg.Open()
	if err != nil {
		gate.Unlock()
		t.Fatal(err)
	}
	defer f.Close()
	script := fmt.Sprintf(`
import os
for i in range(%d):
    fd = os.open("w%%d" %% i, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, (b"%%04d" %% i) * 1024)
    os.close(fd)
`, n)
	cmd := exec.Command("/usr/bin/python3", "-S", "-c", script)
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
	out, err := cmd.CombinedOutput()
	gate.Unlock()
	if err != nil {
		t.Fatalf("python3: %v %s", err, out)
	}
	syncTracer(t, tr)
	if lost := tr.Lost(); lost != 0 {
		t.Fatalf("%d records lost", lost)
	}
	captured := map[int]bool{}
	for _, r := range col.all() {
		var i int
		if r.Op != OpWrite || r.Ret <= 0 || !r.InRoot {
			continue
		}
		if _, err := fmt.Sscanf(r.Path, "w%d", &i); err != nil {
			continue
		}
		if want := strings.Repeat(fmt.Sprintf("%04d", i), 1024); r.Content != want || r.ContentErr != "" {
			t.Errorf("%s: content %.12q (%d bytes) err %q", r.Path, r.Content, len(r.Content), r.ContentErr)
		}
		captured[i] = r.ContentCaptured
	}
	if len(captured) != n {
		t.Fatalf("%d writes recorded, want %d", len(captured), n)
	}
	if !captured[0] || captured[n-1] {
		t.Errorf("first write captured %v, last %v: want the first captured, the last read back", captured[0], captured[n-1])
	}
	k := 0
	for i := range n {
		if captured[i] {
			k++
		}
	}
	t.Logf("%d of %d writes captured before a quarter of the ring waited", k, n)
}
