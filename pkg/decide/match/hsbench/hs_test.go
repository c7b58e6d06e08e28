//go:build hyperscan && cgo

package hsbench

import (
	"strings"
	"testing"
)

func TestCount(t *testing.T) {
	db, err := Compile([]string{"abcdefgh", "xyz12345", "never-there", "a\x00b"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []struct {
		data string
		want int
	}{
		{"", 0},
		{"..abcdefgh..abcdefgh..", 1}, // each pattern once
		{"ABCDEFGH", 0},               // case-sensitive, as after Norm
		{"xyz12345abcdefgh", 2},       // adjacent
		{strings.Repeat("q", 100000) + "xyz12345", 1}, // far in
		{"a\x00b", 1}, // bytes, not C strings
	} {
		if n, err := db.Count(c.data); err != nil || n != c.want {
			t.Errorf("Count(%.20q) = %d, %v; want %d", c.data, n, err, c.want)
		}
	}
	if _, err := Compile(nil); err == nil {
		t.Error("Compile(nil) succeeded")
	}
}
