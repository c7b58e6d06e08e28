package match

import (
	"strings"
	"testing"
)

// FuzzNorm: Norm equals the reference, is idempotent, IsNorm agrees, and
// the vector kernel and the pure Go path agree.
func FuzzNorm(f *testing.F) {
	for _, s := range normCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Norm(s)
		if Norm(got) != got {
			t.Fatalf("Norm not idempotent: Norm(%q) = %q, Norm of that = %q", s, got, Norm(got))
		}
		checkNorm(t, s)
		if useSSSE3 {
			useSSSE3 = false
			defer func() { useSSSE3 = true }()
			checkNorm(t, s)
		}
	})
}

// FuzzScan: on any tokens (separated by NUL) and content, Scan and
// MaxLevel agree with the naive reference, before and after truncating
// the index to keep tokens.
func FuzzScan(f *testing.F) {
	f.Add("Project Phoenix\x00DE89 3704 0044 0532 0130 00\x00short", "wire to de89370400440532013000 for PROJECT\tPHOENIX", uint8(1))
	f.Add("exactly8\x00exactly8\x00ÉÉÉÉÉ", "xexactly8y ééééé", uint8(0))
	f.Add("aaaaaaaaaa\x00aaaaaaaab", strings.Repeat("a", 600)+"b", uint8(2))
	f.Add("\xff\xfe\xfd\xfc\xfb\x00İİİİİİİİ", "\xff \xfe\xfd\xfc\xfb iiiiiiii", uint8(1))
	f.Add("abcdefgh\x00cdefghij", strings.Repeat("x ", 4100)+"abc defgh ij", uint8(1))
	f.Fuzz(func(t *testing.T, toks, content string, keep uint8) {
		var x Index
		ref := &refIndex{}
		for i, tok := range strings.Split(toks, "\x00") {
			lvl := uint8(i % 3)
			origin := string(rune('a' + i%5))
			if a, b := x.Add(origin, lvl, tok), ref.add(origin, lvl, tok); a != b {
				t.Fatalf("Add(%q) added %d, reference %d", tok, a, b)
			}
		}
		checkScan(t, &x, ref, content)
		n := int(keep) % (x.Len() + 1)
		x.Truncate(n)
		ref.recs = ref.recs[:n]
		checkScan(t, &x, ref, content)
	})
}

// FuzzExtract: Extract never panics and every value is a non-empty
// substring of the content whose Norm occurs in Norm(content).
func FuzzExtract(f *testing.F) {
	for _, s := range []string{
		`Pay DE89 3704 0044 0532 0130 00 to alice@example.com via https://bank.example.com/pay?id=42`,
		`{"key": "value", "n": 1,250.00} 'quoted' “curly” «guillemets» „low“`,
		"+1 (555) 123-4567 file:///etc/passwd C:\\x\\y.txt [::1] http://[2001:db8::1]:80/",
		"\xff\xe2\x82 \u2028\u00a0 don't 'x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		checkExtract(t, content, Extract(content))
	})
}
