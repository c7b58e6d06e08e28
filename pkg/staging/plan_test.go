package staging

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlanLayout(t *testing.T) {
	l, err := Plan(Config{WorkDir: "/home/p/work/", StateDir: "/home/p/.carbd/s1"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Layout{
		Work:      "/home/p/work",
		State:     "/home/p/.carbd/s1",
		Layers:    "/home/p/.carbd/s1",
		Base:      "/home/p/.carbd/s1/base",
		BaseDone:  "/home/p/.carbd/s1/base.done",
		Seen:      "/home/p/.carbd/s1/seen",
		Finished:  "/home/p/.carbd/s1/finished",
		Upper:     "/home/p/.carbd/s1/upper",
		OvlWork:   "/home/p/.carbd/s1/ovlwork",
		Merged:    "/home/p/.carbd/s1/merged",
		Journal:   "/home/p/.carbd/s1/journal",
		Index:     "/home/p/.carbd/s1/index",
		Pending:   "/home/p/.carbd/s1/pending",
		Lock:      "/home/p/.carbd/s1/lock",
		Conflicts: "/home/p/.carbd/s1/conflicts",
		FSType:    "overlay",
		Source:    "carbd",
		Options: []MountOption{
			{"lowerdir", "/home/p/.carbd/s1/base"},
			{"upperdir", "/home/p/.carbd/s1/upper"},
			{"workdir", "/home/p/.carbd/s1/ovlwork"},
			{"index", "off"},
			{"nfs_export", "off"},
			{"redirect_dir", "off"},
			{"metacopy", "off"},
			{"xino", "off"},
		},
		NoDev:         true,
		NoSUID:        true,
		MaxFileSize:   DefaultMaxFileSize,
		MaxDepth:      DefaultMaxDepth,
		ContentLimit:  DefaultContentLimit,
		ContentMargin: DefaultContentMargin,
	}
	if d := cmp.Diff(want, l); d != "" {
		t.Errorf("layout (-want +got):\n%s", d)
	}
	wantData := "lowerdir=/home/p/.carbd/s1/base,upperdir=/home/p/.carbd/s1/upper,workdir=/home/p/.carbd/s1/ovlwork,index=off,nfs_export=off,redirect_dir=off,metacopy=off,xino=off"
	if got := l.MountData(); got != wantData {
		t.Errorf("MountData = %q, want %q", got, wantData)
	}
	// The working directory is never a layer: commits change it.
	for _, o := range l.Options {
		if strings.Contains(o.Value, l.Work) {
			t.Errorf("option %s names the working directory", o)
		}
	}
}

// W's state and its layers apart: labels, lock and conflicts in the
// state directory (any filesystem), everything hard links and renames
// need on W's mount in the layer directory.
func TestPlanLayerDir(t *testing.T) {
	l, err := Plan(Config{WorkDir: "/home/p/work", StateDir: "/var/lib/carbd/w/x1", LayerDir: "/home/p/.carbd/s1"})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{l.Index, l.Pending, l.Lock, l.Conflicts, l.Base, l.Upper, l.OvlWork, l.Journal, l.Seen, l.Merged}
	want := []string{"/var/lib/carbd/w/x1/index", "/var/lib/carbd/w/x1/pending", "/var/lib/carbd/w/x1/lock", "/var/lib/carbd/w/x1/conflicts",
		"/home/p/.carbd/s1/base", "/home/p/.carbd/s1/upper", "/home/p/.carbd/s1/ovlwork", "/home/p/.carbd/s1/journal", "/home/p/.carbd/s1/seen", "/home/p/.carbd/s1/merged"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("layout (-want +got):\n%s", d)
	}
	for _, bad := range []Config{
		{WorkDir: "/w", StateDir: "/s", LayerDir: "/w/l"},
		{WorkDir: "/w/x", StateDir: "/s", LayerDir: "/w"},
		{WorkDir: "/w", StateDir: "/s", LayerDir: "/s/l"},
		{WorkDir: "/w", StateDir: "/s", LayerDir: "l"},
	} {
		if _, err := Plan(bad); !errors.Is(err, errConfig) {
			t.Errorf("Plan(%+v) = %v, want a config error", bad, err)
		}
	}
}

func TestPlanOverrides(t *testing.T) {
	l, err := Plan(Config{WorkDir: "/w", StateDir: "/s", MergedDir: "/run/carbd/m1",
		MaxFileSize: 10, MaxDepth: 3, ContentLimit: 5, ContentMargin: 1, Owner: &Owner{UID: 1000, GID: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if l.Merged != "/run/carbd/m1" || l.MaxFileSize != 10 || l.MaxDepth != 3 || l.ContentLimit != 5 || l.ContentMargin != 1 {
		t.Errorf("overrides not applied: %+v", l)
	}
	if l.Owner == nil || *l.Owner != (Owner{1000, 100}) {
		t.Errorf("owner = %v", l.Owner)
	}
}

func TestPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no work", Config{StateDir: "/s"}, "WorkDir is empty"},
		{"no state", Config{WorkDir: "/w"}, "StateDir is empty"},
		{"relative work", Config{WorkDir: "w", StateDir: "/s"}, `WorkDir "w" is not absolute`},
		{"relative state", Config{WorkDir: "/w", StateDir: "s"}, `StateDir "s" is not absolute`},
		{"root work", Config{WorkDir: "/", StateDir: "/s"}, "WorkDir must not be the root"},
		{"state in work", Config{WorkDir: "/w", StateDir: "/w/.carbd"}, `StateDir "/w/.carbd" is inside WorkDir "/w"`},
		{"state is work", Config{WorkDir: "/w", StateDir: "/w/"}, `StateDir "/w" is inside WorkDir "/w"`},
		{"work in state", Config{WorkDir: "/s/w", StateDir: "/s"}, `WorkDir "/s/w" is inside StateDir "/s"`},
		{"merged in work", Config{WorkDir: "/w", StateDir: "/s", MergedDir: "/w/m"}, `MergedDir "/w/m" overlaps WorkDir`},
		{"merged is upper", Config{WorkDir: "/w", StateDir: "/s", MergedDir: "/s/upper"}, `MergedDir "/s/upper" overlaps layer`},
		{"merged above base", Config{WorkDir: "/w", StateDir: "/s/x", MergedDir: "/s"}, `MergedDir "/s" overlaps layer`},
		{"comma", Config{WorkDir: "/w", StateDir: "/s,lowerdir=/etc"}, `contains ','`},
		{"colon", Config{WorkDir: "/w", StateDir: "/s:x"}, `contains ':'`},
		{"backslash", Config{WorkDir: "/w", StateDir: `/s\x`}, `contains '\\'`},
		{"newline", Config{WorkDir: "/w", StateDir: "/s\nx"}, "control character"},
		{"nul", Config{WorkDir: "/w\x00", StateDir: "/s"}, "NUL byte"},
		{"merged comma", Config{WorkDir: "/w", StateDir: "/s", MergedDir: "/m,x"}, `MergedDir "/m,x" contains ','`},
		{"too long", Config{WorkDir: "/" + strings.Repeat("a", 5000), StateDir: "/s"}, "longer than"},
		{"negative size", Config{WorkDir: "/w", StateDir: "/s", MaxFileSize: -1}, "MaxFileSize -1 is negative"},
		{"negative depth", Config{WorkDir: "/w", StateDir: "/s", MaxDepth: -1}, "MaxDepth -1 is negative"},
		{"negative limit", Config{WorkDir: "/w", StateDir: "/s", ContentLimit: -1}, "ContentLimit -1 is negative"},
		{"negative margin", Config{WorkDir: "/w", StateDir: "/s", ContentMargin: -2}, "ContentMargin -2 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(tc.cfg)
			if err == nil {
				t.Fatalf("Plan(%+v) succeeded, want error containing %q", tc.cfg, tc.want)
			}
			if !errors.Is(err, errConfig) {
				t.Errorf("error %v does not wrap errConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "staging: config: ") {
				t.Errorf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLinkEscapes(t *testing.T) {
	for _, tc := range []struct {
		link, target string
		escapes      bool
	}{
		{"a", "b", false},
		{"a", "./b", false},
		{"a", "../b", true},
		{"d/a", "../b", false},
		{"d/a", "../../b", true},
		{"d/e/a", "../../b/../c", false},
		{"d/e/a", "../../../x", true},
		{"d/a", "x/../../..", true},
		{"a", "/etc/passwd", true},
		{"a", "", true},
		{"a", "b/c/../../..", true},
		{"a", "b//c", false},
	} {
		if got := linkEscapes(tc.link, tc.target); got != tc.escapes {
			t.Errorf("linkEscapes(%q, %q) = %v, want %v", tc.link, tc.target, got, tc.escapes)
		}
	}
}

func TestCheckRel(t *testing.T) {
	for _, p := range []string{"a", "a/b", "new\nline", "\xff\xfe", "a b/c"} {
		if err := checkRel(p); err != nil {
			t.Errorf("checkRel(%q) = %v", p, err)
		}
	}
	for _, p := range []string{"", "/a", "a/", "a//b", ".", "..", "a/../b", "./a", "a\x00b"} {
		if err := checkRel(p); !errors.Is(err, ErrBadPath) {
			t.Errorf("checkRel(%q) = %v, want ErrBadPath", p, err)
		}
	}
}

func TestPathLess(t *testing.T) {
	// A directory sorts right before what is below it, even when a
	// sibling's name sorts between "d" and "d/" bytewise ("d-x": '-' < '/').
	in := []string{"d/x", "d-x", "d", "c", "d/a/b", "d/a", "e"}
	want := []string{"c", "d", "d/a", "d/a/b", "d/x", "d-x", "e"}
	got := append([]string(nil), in...)
	for i := range got {
		for j := i + 1; j < len(got); j++ {
			if pathLess(got[j], got[i]) {
				got[i], got[j] = got[j], got[i]
			}
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("order (-want +got):\n%s", d)
	}
}

func TestModeChanged(t *testing.T) {
	for _, tc := range []struct {
		u, w uint32
		want bool
	}{
		{0o644, 0o644, false},
		{0o755, 0o644, true},
		{0o4755, 0o755, false}, // only adds a bit commit strips
		{0o4755, 0o4755, false},
		{0o755, 0o4755, true}, // the principal's setuid bit removed
		{0o1777, 0o777, false},
	} {
		if got := modeChanged(tc.u, tc.w); got != tc.want {
			t.Errorf("modeChanged(%#o, %#o) = %v, want %v", tc.u, tc.w, got, tc.want)
		}
	}
}
