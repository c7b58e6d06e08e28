package decide

import (
	"testing"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"
)

// The fast paths of Glob.Match agree with doublestar.
func TestGlobFastPathsAgree(t *testing.T) {
	pats := []string{"github.com", "*.github.com", "file:*", "http:*", "*", "*.pem", "docs/*", "docs/**", ".git/hooks/**", "**/*.pem", "a?c", "tool:get_*", "*x*", "[ab]c", "{a,b}"}
	subjects := []string{"github.com", "api.github.com", "a.b.github.com", "github.com.evil", "file:write", "file:", "http:POST", "", "x.pem", "d/x.pem", "docs/a", "docs/a/b", ".git/hooks/pre", "abc", "tool:get_inbox", "tool:send", "xx", "ac", "bc", "a", "b", "*.github.com"}
	for _, p := range pats {
		for _, s := range subjects {
			want, _ := doublestar.Match(p, s)
			if got := (Glob{Pattern: p}).Match(s); got != want {
				t.Errorf("Glob(%q).Match(%q) = %v, doublestar says %v", p, s, got, want)
			}
		}
	}
}

func FuzzGlobFastPaths(f *testing.F) {
	f.Add("*.github.com", "api.github.com")
	f.Add("file:*", "file:write")
	f.Fuzz(func(t *testing.T, p, s string) {
		// doublestar decodes invalid UTF-8 as U+FFFD, so "\x80" would
		// match "\xef"; the fast paths compare bytes, which is stricter.
		if !doublestar.ValidatePattern(p) || !utf8.ValidString(p) || !utf8.ValidString(s) {
			return
		}
		want, _ := doublestar.Match(p, s)
		if got := (Glob{Pattern: p}).Match(s); got != want {
			t.Fatalf("Glob(%q).Match(%q) = %v, doublestar says %v", p, s, got, want)
		}
		if got := NewGlob(p).Match(s); got != want {
			t.Fatalf("NewGlob(%q).Match(%q) = %v, doublestar says %v", p, s, got, want)
		}
	})
}
