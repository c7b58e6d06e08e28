package daemon

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseFlocks(t *testing.T) {
	in := `1: FLOCK  ADVISORY  WRITE 4242 00:1a:5678 0 EOF
1: -> FLOCK  ADVISORY  WRITE 4343 00:1a:5678 0 EOF
2: POSIX  ADVISORY  WRITE 99 fd:01:12 0 EOF
3: FLOCK  ADVISORY  WRITE -1 00:1a:99 0 EOF
4: OFDLCK ADVISORY  READ  -1 00:06:9 0 EOF
5: FLOCK  ADVISORY  WRITE x 00:1a:1 0 EOF

6: FLOCK
`
	got := parseFlocks([]byte(in))
	want := map[string]int{"00:1a:5678": 4242, "00:1a:99": -1}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("parseFlocks (-want +got):\n%s", d)
	}
}

func TestParseStagingMounts(t *testing.T) {
	in := `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
100 30 0:55 / /run/carbd/sandboxes/c1/merged rw,nodev,nosuid - overlay carbd rw,lowerdir=/w/.carbd/c1/base,upperdir=/w/.carbd/c1/upper
101 30 0:56 / /tmp/with\040space/state/sandboxes/w2-x/merged rw shared:5 - overlay carbd rw
102 30 0:57 / /run/other/merged rw - overlay x rw
103 30 0:58 / /run/carbd/sandboxes/c3/merged rw - tmpfs tmpfs rw
104 30 0:59 / relative/sandboxes/c4/merged rw - overlay x rw
`
	got, err := parseStagingMounts(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	// A line that is no mount is an error naming it; what came before it
	// is still listed.
	if ms, err := parseStagingMounts(strings.NewReader(in + "short line\n")); err == nil || !strings.Contains(err.Error(), "line 7") || len(ms) != 2 {
		t.Errorf("a table ending in a short line: %v, %d mounts", err, len(ms))
	}
	want := []stagingMount{
		{id: "c1", point: "/run/carbd/sandboxes/c1/merged", stateDir: "/run/carbd"},
		{id: "w2-x", point: "/tmp/with space/state/sandboxes/w2-x/merged", stateDir: "/tmp/with space/state"},
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(stagingMount{})); d != "" {
		t.Errorf("parseStagingMounts (-want +got):\n%s", d)
	}
}

func FuzzParseCleanupTables(f *testing.F) {
	f.Add([]byte("1: FLOCK  ADVISORY  WRITE 4242 00:1a:5678 0 EOF\n"))
	f.Add([]byte("100 30 0:55 / /run/carbd/sandboxes/c1/merged rw - overlay carbd rw\n"))
	f.Add([]byte("1 2 3 4 \\777\\0 - overlay\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for k, pid := range parseFlocks(b) {
			if k == "" || strings.ContainsAny(k, " \t\n") {
				t.Fatalf("lock key %q (pid %d)", k, pid)
			}
		}
		ms, _ := parseStagingMounts(strings.NewReader(string(b)))
		for _, m := range ms {
			if !strings.HasSuffix(m.point, "/sandboxes/"+m.id+"/merged") || m.id == "" {
				t.Fatalf("mount %+v", m)
			}
		}
	})
}
