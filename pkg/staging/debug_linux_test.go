package staging

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

func dumpTree(root string) string {
	var b strings.Builder
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		unix.Lstat(p, &st)
		buf := make([]byte, 4096)
		n, _ := unix.Llistxattr(p, buf)
		var xs []string
		for _, nm := range strings.Split(string(buf[:n]), "\x00") {
			if nm == "" || nm == "trusted.overlay.origin" {
				continue
			}
			v := make([]byte, 256)
			k, _ := unix.Lgetxattr(p, nm, v)
			xs = append(xs, nm+"="+string(v[:max(k, 0)]))
		}
		fmt.Fprintf(&b, "%q %o ino=%d rdev=%d %v\n", p[len(root):], st.Mode, st.Ino, st.Rdev, xs)
		return nil
	})
	return b.String()
}
