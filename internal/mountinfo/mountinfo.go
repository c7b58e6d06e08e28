// Package mountinfo parses the mount table of /proc/<pid>/mountinfo
// (proc(5)): carbd's one parser of that format, for the staging layer
// (is the merged view mounted), the file tracer (where cgroup v2 is) and
// carbd cleanup (which merged views are left).
package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of the table. Paths are unescaped (the kernel writes
// a space as \040, a tab as \011, a newline as \012, a backslash as \134).
type Mount struct {
	ID, Parent int
	Dev        string // major:minor
	Root       string // the mount's root within its filesystem
	Point      string // the mount point
	Options    string // per-mount options
	Optional   []string
	FSType     string
	Source     string
	Super      string // per-superblock options
}

// SuperOption returns the value of one per-superblock option ("upperdir"
// of an overlay), unescaped; ok is false when it is absent.
func (m Mount) SuperOption(key string) (string, bool) {
	for o := range strings.SplitSeq(m.Super, ",") {
		if k, v, _ := strings.Cut(o, "="); k == key {
			return Unescape(v), true
		}
	}
	return "", false
}

// Read parses /proc/self/mountinfo.
func Read() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a mount table. A line that is not a mount (too few fields,
// no " - " separator, a non-numeric id) is an error naming its line.
func Parse(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		m, err := parseLine(sc.Text())
		if err != nil {
			return out, fmt.Errorf("mountinfo: line %d: %w", n, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("mountinfo: %w", err)
	}
	return out, nil
}

// parseLine parses
// "id parent major:minor root point options [optional...] - fstype source super".
func parseLine(line string) (Mount, error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 6 || sep < 0 {
		return Mount{}, fmt.Errorf("not a mount: %q", clip(line))
	}
	post := f[sep+1:]
	if len(post) < 2 {
		return Mount{}, fmt.Errorf("no file system type and source after the separator: %q", clip(line))
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return Mount{}, fmt.Errorf("mount ids %q %q are not numbers", clip(f[0]), clip(f[1]))
	}
	m := Mount{ID: id, Parent: parent, Dev: f[2], Root: Unescape(f[3]), Point: Unescape(f[4]), Options: f[5],
		FSType: post[0], Source: Unescape(post[1])}
	if sep > 6 {
		m.Optional = f[6:sep]
	}
	if len(post) > 2 {
		m.Super = post[2]
	}
	return m, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Unescape undoes the kernel's octal escapes (\ooo) in a mountinfo field.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v := s[i+1 : i+4]; v[0] >= '0' && v[0] <= '3' && v[1] >= '0' && v[1] <= '7' && v[2] >= '0' && v[2] <= '7' {
				b.WriteByte((v[0]-'0')<<6 | (v[1]-'0')<<3 | (v[2] - '0'))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
