package match

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestValueSet(t *testing.T) {
	var v ValueSet
	if v.Contains("x") || v.Len() != 0 {
		t.Fatal("zero ValueSet is not empty")
	}
	if n := v.Add("task", "Alice@Example.com", "DE89 3704 0044 0532 0130 00", "", "   ", "50"); n != 3 {
		t.Fatalf("Add added %d, want 3 (empty values are skipped)", n)
	}
	for _, c := range []struct {
		x    string
		want bool
	}{
		{"alice@example.com", true},
		{" ALICE@EXAMPLE.COM\n", true},
		{"de89370400440532013000", true},
		{"DE89 3704 0044 0532 0130 00", true},
		{"50", true}, // short values belong to T
		{"5 0", true},
		{"500", false},
		{"alice@example.co", false},
		{"", false},
		{" ", false},
	} {
		if got := v.Contains(c.x); got != c.want {
			t.Errorf("Contains(%q) = %v, want %v", c.x, got, c.want)
		}
	}
	// The first origin stays.
	if n := v.Add("read_file:notes.txt", "ALICE@example.com", "bob@example.com"); n != 1 {
		t.Fatalf("second Add added %d, want 1", n)
	}
	if o, ok := v.Origin("Alice@Example.COM"); !ok || o != "task" {
		t.Fatalf("Origin = %q, %v; want task", o, ok)
	}
	if o, ok := v.Origin("bob@example.com"); !ok || o != "read_file:notes.txt" {
		t.Fatalf("Origin = %q, %v", o, ok)
	}
	if _, ok := v.Origin("carol@example.com"); ok {
		t.Fatal("Origin of an absent value")
	}
	var all []string
	for val, o := range v.All() {
		all = append(all, val+" <- "+o)
	}
	want := []string{"alice@example.com <- task", "de89370400440532013000 <- task", "50 <- task", "bob@example.com <- read_file:notes.txt"}
	if d := cmp.Diff(want, all); d != "" {
		t.Fatalf("All (-want +got):\n%s", d)
	}
	// Roll back the speculative part: bob goes, alice stays with her
	// first origin; re-adding bob gives the new origin.
	v.Truncate(3)
	if v.Contains("bob@example.com") || !v.Contains("alice@example.com") || v.Len() != 3 {
		t.Fatal("Truncate(3) removed the wrong values")
	}
	v.Add("web:https://example.org", "bob@example.com")
	if o, _ := v.Origin("bob@example.com"); o != "web:https://example.org" {
		t.Fatalf("origin after re-add = %q", o)
	}
	v.Truncate(0)
	if v.Len() != 0 || v.Contains("50") {
		t.Fatal("Truncate(0) left values")
	}
}

func TestValueSetTruncatePanics(t *testing.T) {
	var v ValueSet
	v.Add("o", "a")
	for _, n := range []int{-1, 2} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "match: truncate value set") {
					t.Errorf("Truncate(%d) recovered %v", n, r)
				}
			}()
			v.Truncate(n)
		}()
	}
}

func TestValueSetLongAndUnicodeValues(t *testing.T) {
	var v ValueSet
	long := strings.Repeat("Segment ", 100)
	v.Add("o", long, "Straße İstanbul", "\xff\xfe")
	for _, x := range []string{strings.ToLower(long), "STRASSE", "straßeistanbul", "Straße\u00a0i̇stanbul", "\ufffd\ufffd"} {
		want := x != "STRASSE" && x != "Straße\u00a0i̇stanbul"
		if got := v.Contains(x); got != want {
			t.Errorf("Contains(%q) = %v, want %v", x, got, want)
		}
	}
}

func TestValueSetContainsDoesNotAllocate(t *testing.T) {
	var v ValueSet
	v.Add("task", "https://API.example.com/v1/send", "DE89 3704 0044 0532 0130 00")
	for _, q := range []string{"https://api.example.com/v1/send", "HTTPS://API.EXAMPLE.COM/v1/send", "de89 3704 0044 0532 0130 00", "absent value"} {
		if a := testing.AllocsPerRun(100, func() { v.Contains(q) }); a != 0 {
			t.Errorf("Contains(%q) allocated %.0f times", q, a)
		}
	}
}

func TestValueSetHide(t *testing.T) {
	var v ValueSet
	v.Add("a", "one", "two")
	v.Hide(1)
	v.Add("b", "three")
	for _, c := range []struct {
		x    string
		want bool
	}{{"one", true}, {"two", false}, {"three", false}} {
		if got := v.Contains(c.x); got != c.want {
			t.Errorf("hidden: Contains(%q) = %v, want %v", c.x, got, c.want)
		}
	}
	if _, ok := v.Origin("two"); ok {
		t.Error("hidden: Origin found a hidden value")
	}
	n := 0
	for range v.All() {
		n++
	}
	if n != 1 || v.Len() != 3 {
		t.Errorf("hidden: All yielded %d, Len %d; want 1 and 3", n, v.Len())
	}
	v.Hide(-1)
	if !v.Contains("two") || !v.Contains("three") {
		t.Error("Hide(-1) did not show every value again")
	}
}
