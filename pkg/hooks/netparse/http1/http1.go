// Package http1 is carbd's one HTTP/1.x framer: the pieces of RFC 9112
// that say where a message's head and body end, shared by the request
// parser on the verdict path (netparse), the response parser that feeds
// provenance (respwatch) and the interception proxy.
//
// # What it has
//
//   - the token table and field-line parsing (RFC 9110 §5), for heads and
//     trailers;
//   - Content-Length (a list of identical values is one value) and
//     Transfer-Encoding (is chunked the last coding, how many times);
//   - Chunked, a streaming decoder of chunked bodies (RFC 9112 §7.1) that
//     reads byte by byte with O(1) work per byte and keeps no line
//     buffer: its result depends only on the bytes, never on how they were
//     cut into calls, and bounds on data, wire bytes, line and trailer
//     lengths stop it at an exact byte.
//
// Request and status lines stay with their parsers (they differ); each
// caller wraps the errors returned here in its own sentinel.
//
// # Requirements
//
// Pure Go, no allocation, no state outside the values the caller holds.
//
// # Tests
//
// Table tests of every function, a property test that every split of a
// body into calls decodes the same, and fuzz targets (FuzzChunked: the
// decoder against a reference decoder on whole input, under random
// splits).
package http1

import (
	"errors"
	"fmt"
)

// ErrSyntax marks bytes that are not HTTP/1.x framing; callers wrap it in
// their own error ("netparse: malformed http request: ...").
var ErrSyntax = errors.New("http1: syntax")

// tchar is the token table (RFC 9110 §5.6.2).
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return
}()

// IsTChar reports whether c may appear in a token.
func IsTChar(c byte) bool { return tchar[c] }

// IsToken reports whether s is a non-empty token.
func IsToken[T ~string | ~[]byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}

// isCTL reports a control byte that a field value may not hold (HTAB is
// allowed).
func isCTL(c byte) bool { return c < ' ' && c != '\t' || c == 0x7f }

// ParseField parses a field line "name: value" (without its line end):
// the name a token, no obsolete line folding, no control bytes in the
// value; the value is trimmed of blanks.
func ParseField[T ~string | ~[]byte](line T) (name, value T, err error) {
	if len(line) == 0 {
		return name, value, fmt.Errorf("%w: empty field line", ErrSyntax)
	}
	if line[0] == ' ' || line[0] == '\t' {
		return name, value, fmt.Errorf("%w: obsolete line folding", ErrSyntax)
	}
	i := 0
	for i < len(line) && line[i] != ':' {
		i++
	}
	if i == 0 || i == len(line) {
		return name, value, fmt.Errorf("%w: field line %q", ErrSyntax, clip(line, 64))
	}
	name = line[:i]
	if !IsToken(name) {
		return name, value, fmt.Errorf("%w: field name %q", ErrSyntax, clip(name, 64))
	}
	v := line[i+1:]
	for j := 0; j < len(v); j++ {
		if isCTL(v[j]) {
			return name, value, fmt.Errorf("%w: control byte %#x in field %q", ErrSyntax, v[j], clip(name, 64))
		}
	}
	a, b := 0, len(v)
	for a < b && (v[a] == ' ' || v[a] == '\t') {
		a++
	}
	for b > a && (v[b-1] == ' ' || v[b-1] == '\t') {
		b--
	}
	return name, v[a:b], nil
}

// ContentLength parses a Content-Length value; a list of identical
// values ("5, 5") is that value (RFC 9110 §8.6).
func ContentLength[T ~string | ~[]byte](v T) (int64, error) {
	var n int64 = -1
	for start := 0; start <= len(v); {
		end := start
		for end < len(v) && v[end] != ',' {
			end++
		}
		a, b := start, end
		for a < b && (v[a] == ' ' || v[a] == '\t') {
			a++
		}
		for b > a && (v[b-1] == ' ' || v[b-1] == '\t') {
			b--
		}
		if b == a || b-a > 18 {
			return 0, fmt.Errorf("%w: Content-Length %q", ErrSyntax, clip(v, 32))
		}
		var x int64
		for i := a; i < b; i++ {
			c := v[i]
			if c < '0' || c > '9' {
				return 0, fmt.Errorf("%w: Content-Length %q", ErrSyntax, clip(v, 32))
			}
			x = x*10 + int64(c-'0')
		}
		if n >= 0 && x != n {
			return 0, fmt.Errorf("%w: Content-Length %q", ErrSyntax, clip(v, 32))
		}
		n = x
		start = end + 1
	}
	return n, nil
}

// TransferCodings reads a Transfer-Encoding value (or several joined with
// ','): whether the last coding is chunked, how many codings are chunked,
// and whether the list has empty elements (which a recipient ignores,
// RFC 9110 §5.6.1, but a strict parser may refuse).
func TransferCodings[T ~string | ~[]byte](v T) (chunkedLast bool, chunked int, empty bool) {
	for start := 0; start <= len(v); {
		end := start
		for end < len(v) && v[end] != ',' {
			end++
		}
		a, b := start, end
		for i := a; i < b; i++ {
			if v[i] == ';' {
				b = i
				break
			}
		}
		for a < b && (v[a] == ' ' || v[a] == '\t') {
			a++
		}
		for b > a && (v[b-1] == ' ' || v[b-1] == '\t') {
			b--
		}
		start = end + 1
		if a == b {
			empty = true
			continue
		}
		chunkedLast = equalFold(v[a:b], "chunked")
		if chunkedLast {
			chunked++
		}
	}
	return chunkedLast, chunked, empty
}

// HasToken reports whether the comma-separated list v holds tok (case
// insensitive), as Connection: upgrade.
func HasToken[T ~string | ~[]byte](v T, tok string) bool {
	for start := 0; start <= len(v); {
		end := start
		for end < len(v) && v[end] != ',' {
			end++
		}
		a, b := start, end
		for a < b && (v[a] == ' ' || v[a] == '\t') {
			a++
		}
		for b > a && (v[b-1] == ' ' || v[b-1] == '\t') {
			b--
		}
		if equalFold(v[a:b], tok) {
			return true
		}
		start = end + 1
	}
	return false
}

func equalFold[T ~string | ~[]byte](s T, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// Unhex is the value of a hex digit, -1 for another byte.
func Unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func clip[T ~string | ~[]byte](b T, n int) T {
	if len(b) > n {
		return b[:n]
	}
	return b
}
