package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The sandbox's decision log starts afresh once it reached its cap, the
// previous one kept as audit.jsonl.1 (replaced at the next rotation);
// below the cap, or with rotation off, a run appends. Without it the log
// grew by every run of a working directory, in /run (docs/soak.md).
func TestAuditLogRotates(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, auditLogName)
	read := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return string(b)
	}
	run := func(max int64, line string) {
		f, err := openAuditLog(dir, max)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	const max = 20
	run(max, "run 1 decisions\n") // 16 bytes: appended to
	run(max, "run 2 decisions\n") // 32 >= 20 after it
	if got := read(p); got != "run 1 decisions\nrun 2 decisions\n" {
		t.Fatalf("below the cap: %q", got)
	}
	run(max, "run 3 decisions\n")
	if got, old := read(p), read(p+".1"); got != "run 3 decisions\n" || old != "run 1 decisions\nrun 2 decisions\n" {
		t.Fatalf("at the cap: log %q, previous %q", got, old)
	}
	run(max, "run 4 decisions\n")
	run(max, "run 5 decisions\n")
	if got, old := read(p), read(p+".1"); got != "run 5 decisions\n" || old != "run 3 decisions\nrun 4 decisions\n" {
		t.Fatalf("second rotation: log %q, previous %q", got, old)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi, err)
	}
	// Negative: never rotated.
	run(-1, strings.Repeat("x", 100)+"\n")
	run(-1, "more\n")
	if got := read(p); !strings.HasSuffix(got, "more\n") || !strings.HasPrefix(got, "run 5 decisions\n") {
		t.Fatalf("rotation off: %q", got)
	}
}
