package match

import (
	"strings"
	"testing"
)

// A time of day is no distinctive token, however many digits it has; a
// value that only looks like one (out of range, a longer number with
// colons, a version) keeps its class.
func TestDistinctiveTimeOfDay(t *testing.T) {
	for _, c := range []struct {
		tok  string
		want bool
	}{
		{"10:00:00", false},
		{"14:30", false},
		{"9:15", false},
		{"9:15am", false},
		{"11:45pm", false},
		{"10:00:00.000", false},
		{"10:00-11:30", false},
		{"23:59:60", false},
		{"24:00", false},
		{"25:00", true},       // no hour: four digits
		{"10:75", true},       // no minute
		{"10:00:00:00", true}, // a timecode, not a time
		{"1234:56", true},
		{"10:00x", true},
		{"10:00-2024", true},
		{"2024-05-19", false}, // a date, as before
		{"sk_live_10:00", true},
	} {
		if got := Distinctive(c.tok); got != c.want {
			t.Errorf("Distinctive(%q) = %v, want %v", c.tok, got, c.want)
		}
	}
}

// A time of day is never distinctive, and it holds only digits, colons,
// a dot, a dash and am/pm; IsTimeOfDay never panics.
func FuzzIsTimeOfDay(f *testing.F) {
	for _, s := range []string{"10:00:00", "9:15am", "10:00-11:30", "25:00", "10:00:00.000", ":", "-", "1:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !IsTimeOfDay(s) {
			return
		}
		if Distinctive(s) && !isDateTime(s) {
			t.Fatalf("time of day %q is distinctive", s)
		}
		for i := 0; i < len(s); i++ {
			if c := s[i]; !isDigit(c) && !strings.ContainsRune(":.-apm", rune(c)) {
				t.Fatalf("time of day %q holds %q", s, c)
			}
		}
	})
}
