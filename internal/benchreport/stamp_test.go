package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestStamp: each result line's benchmark gets the time since the
// previous result line (set-up output between them included), summed over
// its runs; other lines are copied and cost nobody.
func TestStamp(t *testing.T) {
	out := strings.Join([]string{
		"goos: linux",
		"BenchmarkA-2   	       1	 100 ns/op",
		"--- BENCH: BenchmarkA-2",
		"    a_test.go:1: set-up of B",
		"BenchmarkB/x-2 	      10	 200 ns/op	 3 MB/s",
		"BenchmarkA-2   	       1	 100 ns/op",
		"PASS",
	}, "\n")
	start := time.Unix(1000, 0)
	// The clock is read once per result line: at 2 s, 7 s and 8 s.
	ticks := []time.Duration{2 * time.Second, 7 * time.Second, 8 * time.Second}
	now := func() time.Time {
		if len(ticks) == 0 {
			t.Fatal("clock read for a line that is not a result")
		}
		d := ticks[0]
		ticks = ticks[1:]
		return start.Add(d)
	}
	var copied bytes.Buffer
	wall := stamp(strings.NewReader(out), &copied, start, now)
	if copied.String() != out+"\n" {
		t.Errorf("copied %q, want the input", copied.String())
	}
	want := map[string]time.Duration{"BenchmarkA": 3 * time.Second, "BenchmarkB/x": 5 * time.Second}
	if len(wall) != len(want) {
		t.Errorf("wall = %v, want %v", wall, want)
	}
	for n, d := range want {
		if wall[n] != d {
			t.Errorf("wall[%s] = %v, want %v", n, wall[n], d)
		}
	}
	if got := longest(wall); got != "B/x (5.0 s)" {
		t.Errorf("longest = %q", got)
	}
}

func TestSelected(t *testing.T) {
	for _, c := range []struct {
		title, only string
		want        bool
	}{
		{"Packet parsing (pkg/hooks/netparse)", "", true},
		{"Packet parsing (pkg/hooks/netparse)", "netparse", true},
		{"Packet parsing (pkg/hooks/netparse)", "calib,netparse", true},
		{"Packet parsing (pkg/hooks/netparse)", "calib,ctrl", false},
		{"Packet parsing (pkg/hooks/netparse)", ",", false},
	} {
		if got := selected(c.title, c.only); got != c.want {
			t.Errorf("selected(%q, %q) = %v, want %v", c.title, c.only, got, c.want)
		}
	}
}

func TestSpreadAndValues(t *testing.T) {
	rs := []result{{"ns/op": 110, "x": 1}, {"ns/op": 90}, {"ns/op": 100, "x": 3}}
	if got := spread(rs, "ns/op"); got != "20 %" {
		t.Errorf("spread = %q, want 20 %%", got)
	}
	if got := spread(rs[:1], "ns/op"); got != "" {
		t.Errorf("spread of one run = %q, want none", got)
	}
	if got := values(rs, "x"); got != "1, 3" {
		t.Errorf("values = %q", got)
	}
}
