package vmimage

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// Image is a kernel and its initramfs.
type Image struct {
	Kernel    string // bzImage (vmlinuz)
	Initramfs string // gzip-compressed newc cpio
}

// ErrNotBuilt is returned by Find when the image is not there.
var ErrNotBuilt = errors.New("vmimage: image not built (run make vmimage)")

// Find returns the image in dir (the build's output directory,
// vmimage/out).
func Find(dir string) (Image, error) {
	img := Image{Kernel: filepath.Join(dir, "vmlinuz"), Initramfs: filepath.Join(dir, "initramfs.cpio.gz")}
	for _, p := range []string{img.Kernel, img.Initramfs} {
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return Image{}, fmt.Errorf("%w: %s missing", ErrNotBuilt, p)
			}
			return Image{}, fmt.Errorf("vmimage: %w", err)
		}
	}
	return img, nil
}

// File is a regular file to add to the guest's root file system.
type File struct {
	Path string      // absolute path in the guest, e.g. /etc/ssl/certs/carbd-ca.pem
	Mode fs.FileMode // permission bits; 0 means 0644
	Data []byte
}

// CAPath is where the image's /init looks for the CA certificate it
// trusts (it adds it to the system bundle that curl and OpenSSL use).
const CAPath = "/etc/ssl/certs/carbd-ca.pem"

// BundlePath is where the image's /init looks for a whole CA bundle (the
// host's roots and carbd's interception CA): when present it becomes the
// system bundle, /etc/ssl/certs/ca-certificates.crt, in place of the
// image's, and CAPath is not added to it.
const BundlePath = "/etc/carbd/ca-bundle.pem"

// GuestBundle is the system bundle in the guest, where /init installs
// the CAs it trusts and at which it points SSL_CERT_FILE,
// REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS and
// GIT_SSL_CAINFO.
const GuestBundle = "/etc/ssl/certs/ca-certificates.crt"

// WriteOverlay writes files as an uncompressed newc cpio archive that the
// kernel unpacks over the initramfs when it is appended to it. Parent
// directories are created as needed (mode 0755); entries are sorted, owned
// by root and dated 0, so the same files give the same bytes.
func WriteOverlay(w io.Writer, files []File) error {
	dirs := map[string]bool{}
	var names []string
	byPath := map[string]File{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(f.Path) || p == "/" || strings.ContainsRune(p, 0) {
			return fmt.Errorf("vmimage: overlay path %q is not an absolute file path", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return fmt.Errorf("vmimage: overlay path %q given twice", p)
		}
		if f.Mode&^fs.ModePerm != 0 {
			return fmt.Errorf("vmimage: overlay %s: mode %v is not a permission", p, f.Mode)
		}
		f.Path = p
		byPath[p] = f
		names = append(names, p)
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	for d := range dirs {
		if _, clash := byPath[d]; clash {
			return fmt.Errorf("vmimage: overlay path %q is both a file and a directory", d)
		}
		names = append(names, d)
	}
	sort.Strings(names) // a directory sorts before what it holds
	ino := uint32(1)
	for _, n := range names {
		if f, ok := byPath[n]; ok {
			mode := f.Mode
			if mode == 0 {
				mode = 0o644
			}
			if err := writeEntry(w, ino, n[1:], 0o100000|uint32(mode), f.Data); err != nil {
				return err
			}
		} else if err := writeEntry(w, ino, n[1:], 0o040755, nil); err != nil {
			return err
		}
		ino++
	}
	return writeEntry(w, 0, "TRAILER!!!", 0, nil)
}

// writeEntry writes one newc header, name and data, each padded to 4.
func writeEntry(w io.Writer, ino uint32, name string, mode uint32, data []byte) error {
	nlink := uint32(1)
	if mode&0o040000 != 0 {
		nlink = 2
	}
	if name == "TRAILER!!!" {
		nlink = 1
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := make([]byte, 0, len(hdr)+len(name)+8+len(data)+4)
	buf = append(buf, hdr...)
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	buf = append(buf, data...)
	buf = pad4(buf)
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("vmimage: write overlay: %w", err)
	}
	return nil
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// WithOverlay writes to dst the initramfs base followed by an overlay of
// files: the initrd to boot with. The base is padded with zeros to a
// multiple of 4 bytes, where the kernel looks for the next archive.
func WithOverlay(dst, base string, files []File) (err error) {
	in, err := os.Open(base)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("vmimage: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("vmimage: %w", cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	n, err := io.Copy(out, in)
	if err != nil {
		return fmt.Errorf("vmimage: copy %s: %w", base, err)
	}
	if r := n % 4; r != 0 {
		if _, err := out.Write(make([]byte, 4-r)); err != nil {
			return fmt.Errorf("vmimage: %w", err)
		}
	}
	return WriteOverlay(out, files)
}
