package mountinfo

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	in := `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
100 30 0:55 / /run/carbd/sandboxes/c1/merged rw,nodev,nosuid - overlay carbd rw,lowerdir=/w/base,upperdir=/w/up\040per
101 30 0:56 / /tmp/with\040space/m rw shared:5 master:2 - cgroup2 cgroup2
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{ID: 36, Parent: 35, Dev: "98:0", Root: "/mnt1", Point: "/mnt/parent", Options: "rw,noatime", Optional: []string{"master:1"}, FSType: "ext3", Source: "/dev/root", Super: "rw,errors=continue"},
		{ID: 100, Parent: 30, Dev: "0:55", Root: "/", Point: "/run/carbd/sandboxes/c1/merged", Options: "rw,nodev,nosuid", FSType: "overlay", Source: "carbd", Super: `rw,lowerdir=/w/base,upperdir=/w/up\040per`},
		{ID: 101, Parent: 30, Dev: "0:56", Root: "/", Point: "/tmp/with space/m", Options: "rw", Optional: []string{"shared:5", "master:2"}, FSType: "cgroup2", Source: "cgroup2"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Parse (-want +got):\n%s", d)
	}
	if v, ok := got[1].SuperOption("upperdir"); !ok || v != "/w/up per" {
		t.Errorf("SuperOption(upperdir) = %q %v", v, ok)
	}
	if _, ok := got[1].SuperOption("workdir"); ok {
		t.Error("SuperOption(workdir) found an absent option")
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"short line",
		"1 2 0:1 / /m rw master:1 no separator",
		"1 2 0:1 / /m rw - overlay",
		"x 2 0:1 / /m rw - overlay src rw",
	} {
		_, err := Parse(strings.NewReader("36 35 98:0 / / rw - ext4 /dev/root rw\n" + in + "\n"))
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("Parse(%q): %v, want an error naming line 2", in, err)
		}
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`plain`: "plain", `a\040b`: "a b", `tab\011x`: "tab\tx", `bs\134`: `bs\`, `\777x`: `\777x`, `end\04`: `end\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadSelf(t *testing.T) {
	ms, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	root := false
	for _, m := range ms {
		root = root || m.Point == "/"
	}
	if !root {
		t.Errorf("no mount at / among %d mounts", len(ms))
	}
}

func FuzzParse(f *testing.F) {
	f.Add("36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n")
	f.Add("100 30 0:55 / /a\\040b rw - overlay carbd rw,upperdir=/u\n1 2 3 4 \\777\\0 - overlay\n")
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := Parse(strings.NewReader(s))
		for _, m := range ms {
			if m.FSType == "" || m.FSType == "-" && m.Source == "" {
				t.Fatalf("mount %+v without a type", m)
			}
		}
		if err != nil && !strings.HasPrefix(err.Error(), "mountinfo: ") {
			t.Fatalf("error %q without its prefix", err)
		}
	})
}
