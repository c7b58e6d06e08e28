package match

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Norm is Kairos' normalisation: lowercase, whitespace removed. It is
// idempotent: Norm(Norm(s)) == Norm(s).
func Norm(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	var b strings.Builder
	b.Grow(len(s))
	if ascii {
		for i := 0; i < len(s); i++ {
			c := s[i]
			switch {
			case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f':
				continue
			case 'A' <= c && c <= 'Z':
				c += 'a' - 'A'
			}
			b.WriteByte(c)
		}
		return b.String()
	}
	for _, r := range s {
		if unicode.IsSpace(r) {
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
