package vmimage

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// extract unpacks a cpio archive with GNU cpio and returns the directory.
func extract(t *testing.T, archive []byte) string {
	t.Helper()
	testutil.RequireTool(t, "cpio")
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-i", "-d", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v\n%s", err, out)
	}
	return dir
}

func TestWriteOverlayExtracts(t *testing.T) {
	var buf bytes.Buffer
	files := []File{
		{Path: CAPath, Data: []byte("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")},
		{Path: "/etc/carbd/odd", Mode: 0o600, Data: []byte("abc")},
		{Path: "/empty", Data: nil},
	}
	if err := WriteOverlay(&buf, files); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive of %d bytes is not 4-aligned", buf.Len())
	}
	dir := extract(t, buf.Bytes())
	for _, f := range files {
		p := filepath.Join(dir, f.Path)
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, f.Data) {
			t.Errorf("%s: %q %v, want %q", f.Path, b, err, f.Data)
		}
		st, _ := os.Stat(p)
		want := f.Mode
		if want == 0 {
			want = 0o644
		}
		if st != nil && st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", f.Path, st.Mode().Perm(), want)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "etc/ssl/certs")); err != nil || !st.IsDir() {
		t.Errorf("parent directory: %v", err)
	}
	// Same files, same bytes, whatever the order given.
	var again bytes.Buffer
	if err := WriteOverlay(&again, []File{files[2], files[0], files[1]}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("the overlay depends on the order of the files")
	}
}

func TestWriteOverlayRejects(t *testing.T) {
	for _, files := range [][]File{
		{{Path: "etc/x"}},
		{{Path: "/"}},
		{{Path: "/a"}, {Path: "/a/"}},
		{{Path: "/a"}, {Path: "/a/b"}},
		{{Path: "/a", Mode: os.ModeSymlink | 0o777}},
	} {
		if err := WriteOverlay(&bytes.Buffer{}, files); err == nil || !strings.HasPrefix(err.Error(), "vmimage: ") {
			t.Errorf("WriteOverlay(%v) = %v, want a vmimage error", files, err)
		}
	}
}

func TestWithOverlayAppendsAligned(t *testing.T) {
	// A base initramfs: a gzip-compressed archive of one file, of a
	// length that is not a multiple of 4.
	var arch bytes.Buffer
	if err := WriteOverlay(&arch, []File{{Path: "/init", Mode: 0o755, Data: []byte("#!/bin/sh\n")}}); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(arch.Bytes())
	zw.Close()
	gz.WriteByte(0) // make the length odd: WithOverlay must pad it
	for gz.Len()%4 == 0 {
		gz.WriteByte(0)
	}
	dir := t.TempDir()
	base := filepath.Join(dir, "base.cpio.gz")
	os.WriteFile(base, gz.Bytes(), 0o644)
	dst := filepath.Join(dir, "boot.img")
	if err := WithOverlay(dst, base, []File{{Path: CAPath, Data: []byte("ca")}}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(dst)
	if !bytes.HasPrefix(b, gz.Bytes()) {
		t.Fatal("the base is not kept as it is")
	}
	off := gz.Len()
	for off%4 != 0 {
		if b[off] != 0 {
			t.Fatalf("padding byte %d is %#x", off, b[off])
		}
		off++
	}
	if !bytes.HasPrefix(b[off:], []byte("070701")) {
		t.Fatalf("no newc archive at the aligned offset %d", off)
	}
	out := extract(t, b[off:])
	if got, _ := os.ReadFile(filepath.Join(out, CAPath)); string(got) != "ca" {
		t.Errorf("overlay CA %q", got)
	}
	if err := WithOverlay(filepath.Join(dir, "x"), filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("a missing base is accepted")
	}
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	if _, err := Find(dir); !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Find(empty) = %v", err)
	}
	os.WriteFile(filepath.Join(dir, "vmlinuz"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "initramfs.cpio.gz"), nil, 0o644)
	img, err := Find(dir)
	if err != nil || img.Kernel != filepath.Join(dir, "vmlinuz") {
		t.Fatalf("Find = %+v, %v", img, err)
	}
}
