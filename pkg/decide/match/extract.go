package match

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Extraction limits; docs/provenance.md gives the reason for each.
const (
	// WholeMaxLen: content at most this long (after trimming whitespace)
	// is itself a value: a field value is often the whole thing.
	WholeMaxLen = 256
	// MinChunkLen: shortest whitespace-delimited chunk (runes) kept.
	MinChunkLen = 4
	// MinWordLen: shortest word (runes) kept.
	MinWordLen = 4
	// MinNumberLen: shortest number (bytes, separators included) kept.
	MinNumberLen = 2
	// MinGroupDigits: fewest digits in a grouped number (phone, account,
	// card number written with separators).
	MinGroupDigits = 7
	// MaxGroupDigits: most digits in a grouped number.
	MaxGroupDigits = 34
	// MaxQuotedLen: longest quoted string (bytes) kept.
	MaxQuotedLen = 256
)

// Extract returns the candidate values in content: the whole content when
// it is short, quoted strings, whitespace-delimited chunks (keys, ids,
// hostnames, paths), URLs and their hosts, e-mail addresses, key=value
// parts, IBANs and grouped numbers written with spaces, numbers, and
// words. Every value is a substring of content (so Norm(value) occurs in
// Norm(content)); values are not normalised, and repeats are dropped. The
// rules and their reasons are in docs/provenance.md.
func Extract(content string) []string {
	var e Extractor
	return e.Append(nil, content)
}

// An Extractor extracts values like Extract, reusing its memory between
// calls. The zero value is ready to use; it is not safe for concurrent
// use.
type Extractor struct {
	seen map[string]struct{}
}

// Append appends the values of content to dst (see Extract). The values
// are substrings of content: they share its memory.
func (e *Extractor) Append(dst []string, content string) []string {
	if e.seen == nil {
		e.seen = make(map[string]struct{})
	} else {
		clear(e.seen)
	}
	x := extraction{dst: dst, seen: e.seen}
	if t := strings.TrimSpace(content); len(t) <= WholeMaxLen {
		x.emit(t)
	}
	x.quoted(content)
	x.urls(content)
	x.chunks(content) // and the words in them
	x.groups(content)
	x.numbers(content)
	return x.dst
}

type extraction struct {
	dst  []string
	seen map[string]struct{}
}

func (x *extraction) emit(v string) {
	if v == "" {
		return
	}
	if _, ok := x.seen[v]; ok {
		return
	}
	x.seen[v] = struct{}{}
	x.dst = append(x.dst, v)
}

// Classes of ASCII bytes, for the per-byte loops.
const (
	clDelim  = 1 << iota // ends a chunk
	clLetter             // A-Z, a-z
	clDigit              // 0-9
	clQuote              // may open a quoted string
)

var asciiClass = func() (t [256]uint8) {
	for c := range 128 {
		r := rune(c)
		if isChunkDelim(r) {
			t[c] |= clDelim
		}
		if 'a' <= r|0x20 && r|0x20 <= 'z' {
			t[c] |= clLetter
		}
		if '0' <= r && r <= '9' {
			t[c] |= clDigit
		}
		if r == '"' || r == '`' || r == '\'' {
			t[c] |= clQuote
		}
	}
	return t
}()

func isDigit(c byte) bool  { return '0' <= c && c <= '9' }
func isLetter(c byte) bool { return 'a' <= c|0x20 && c|0x20 <= 'z' }
func isAlnum(c byte) bool  { return isDigit(c) || isLetter(c) }

// quoted emits the inside of "...", `...`, '...', “...”, ‘...’, «...»
// and „...“ on one line, at most MaxQuotedLen bytes long. A straight
// single quote opens only after a non-alphanumeric character and closes
// only before one, so apostrophes do not pair up.
func (x *extraction) quoted(s string) {
	for i := 0; i < len(s); {
		r, size := rune(s[i]), 1
		if r < utf8.RuneSelf && asciiClass[r]&clQuote == 0 {
			i++
			continue
		}
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRuneInString(s[i:])
		}
		var closers string
		switch r {
		case '"':
			closers = `"`
		case '`':
			closers = "`"
		case '\'':
			if i == 0 || !isAlnum(s[i-1]) {
				closers = "'"
			}
		case '“':
			closers = "”"
		case '‘':
			closers = "’"
		case '«':
			closers = "»"
		case '„':
			closers = "“”"
		}
		i += size
		if closers == "" {
			continue
		}
		if end, next, ok := findCloser(s, i, closers, r == '\''); ok {
			x.emit(strings.TrimSpace(s[i:end]))
			i = next
		}
	}
}

// findCloser finds the closing quote for an inside starting at i: the
// start of the closer and the position after it.
func findCloser(s string, i int, closers string, apostrophe bool) (end, next int, ok bool) {
	lim := min(len(s), i+MaxQuotedLen+utf8.UTFMax)
	for j := i; j < lim; {
		c := s[j]
		if c == '\n' {
			return 0, 0, false
		}
		if c < utf8.RuneSelf {
			if strings.IndexByte(closers, c) >= 0 && (j == i || s[j-1] != '\\') &&
				(!apostrophe || j+1 == len(s) || !isAlnum(s[j+1])) {
				return j, j + 1, j-i <= MaxQuotedLen
			}
			j++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[j:])
		if strings.ContainsRune(closers, r) && r != utf8.RuneError {
			return j, j + size, j-i <= MaxQuotedLen
		}
		j += size
	}
	return 0, 0, false
}

// isChunkDelim reports whether r ends a chunk: whitespace, quotes,
// brackets other than parentheses, angle brackets and the pipe.
func isChunkDelim(r rune) bool {
	switch r {
	case '"', '`', '<', '>', '|', '{', '}', '[', ']', '“', '”', '‘', '’', '«', '»', '„':
		return true
	}
	if r < utf8.RuneSelf {
		return r == ' ' || '\t' <= r && r <= '\r'
	}
	return unicode.IsSpace(r)
}

// chunks emits every chunk (a run between delimiters, trimmed of
// surrounding punctuation) and the structured values inside it.
func (x *extraction) chunks(s string) {
	start := 0
	for i := 0; i <= len(s); {
		delim, size := true, 1
		if i < len(s) {
			if c := s[i]; c < utf8.RuneSelf {
				delim = asciiClass[c]&clDelim != 0
			} else {
				var r rune
				r, size = utf8.DecodeRuneInString(s[i:])
				delim = isChunkDelim(r)
			}
		}
		if delim {
			if start < i {
				c := x.chunk(s[start:i])
				x.words(s[start:i], c)
			}
			start = i + size
		}
		i += size
	}
}

func trimChunk(c string) string {
	for len(c) > 0 && strings.IndexByte("(',;:!?*", c[0]) >= 0 {
		c = c[1:]
	}
	for len(c) > 0 {
		switch c[len(c)-1] {
		case '.', ',', ';', ':', '!', '?', '\'', '*':
			c = c[:len(c)-1]
			continue
		case ')':
			if strings.Count(c, "(") < strings.Count(c, ")") {
				c = c[:len(c)-1]
				continue
			}
		}
		break
	}
	return c
}

// chunk emits the chunk c and the values inside it; it returns the
// trimmed chunk.
func (x *extraction) chunk(c string) string {
	c = trimChunk(c)
	if long(c, MinChunkLen) {
		x.emit(c)
	}
	// One pass for the separators that give a chunk inner structure.
	at, kv, slash := -1, -1, -1
	for i := 0; i < len(c); i++ {
		switch c[i] {
		case '@':
			at = i
		case '=', ':':
			if i+2 < len(c) && c[i+1] == '/' && c[i+2] == '/' && c[i] == ':' {
				return c // a URL: the URL pass handles it
			}
			if kv < 0 {
				kv = i
			}
		case '/', '\\':
			slash = i
		}
	}
	if at > 0 {
		x.email(c, at)
	}
	if k := kv; k > 0 && k < len(c)-1 && !(k == 1 && c[k] == ':' && isLetter(c[0])) {
		// key=value or key:value (not a Windows drive letter).
		if l := trimChunk(c[:k]); long(l, MinChunkLen) {
			x.emit(l)
		}
		if r := trimChunk(c[k+1:]); long(r, MinChunkLen) {
			x.emit(r)
		}
	}
	if k := slash; k >= 0 && k < len(c)-1 {
		// A path: its base name is how people refer to the file.
		if b := c[k+1:]; long(b, MinChunkLen) {
			x.emit(b)
		}
	}
	return c
}

// long reports whether s has at least n runes.
func long(s string, n int) bool {
	return len(s) >= n && (len(s) >= n*utf8.UTFMax || utf8.RuneCountInString(s) >= n)
}

// urls finds every "://" in s and hands the URL around it to url: the
// scheme before it, and after it everything up to whitespace, a quote or
// an angle bracket, without trailing punctuation or an unbalanced closing
// bracket. (URLs get their own pass because chunks split at brackets,
// which IPv6 hosts contain.)
func (x *extraction) urls(s string) {
	for off := 0; ; {
		k := strings.Index(s[off:], "://")
		if k < 0 {
			return
		}
		i := off + k
		start := i
		for start > 0 && isSchemeChar(s[start-1]) {
			start--
		}
		end := i + 3
		for end < len(s) {
			c := s[end]
			if c <= ' ' || strings.IndexByte("\"'<>`{}|^\\", c) >= 0 {
				break
			}
			if c >= utf8.RuneSelf {
				r, size := utf8.DecodeRuneInString(s[end:])
				if unicode.IsSpace(r) || isChunkDelim(r) {
					break
				}
				end += size
				continue
			}
			end++
		}
		u := trimURL(s[start:end])
		if len(u) > i-start+3 {
			x.url(u, i-start)
		}
		off = end
	}
}

func trimURL(u string) string {
	for len(u) > 0 {
		switch u[len(u)-1] {
		case '.', ',', ';', ':', '!', '?', '*':
			u = u[:len(u)-1]
			continue
		case ')':
			if strings.Count(u, "(") < strings.Count(u, ")") {
				u = u[:len(u)-1]
				continue
			}
		case ']':
			if strings.Count(u, "[") < strings.Count(u, "]") {
				u = u[:len(u)-1]
				continue
			}
		}
		return u
	}
	return u
}

func isSchemeChar(c byte) bool { return isAlnum(c) || c == '+' || c == '-' || c == '.' }

// url emits the URL whose "://" is at c[i:], the URL without query and
// fragment, its host and host:port.
func (x *extraction) url(c string, i int) {
	start := i
	for start > 0 && isSchemeChar(c[start-1]) {
		start--
	}
	for start < i && !isLetter(c[start]) {
		start++
	}
	if start == i {
		return
	}
	u := c[start:]
	x.emit(u)
	rest := u[i-start+3:]
	if k := strings.IndexAny(u, "?#"); k > 0 && k > i-start+3 {
		x.emit(u[:k])
	}
	auth, path := rest, ""
	if k := strings.IndexAny(rest, "/?#"); k >= 0 {
		auth, path = rest[:k], rest[k:]
	}
	if k := strings.LastIndexByte(auth, '@'); k >= 0 {
		auth = auth[k+1:]
	}
	host := auth
	if strings.HasPrefix(auth, "[") {
		if k := strings.IndexByte(auth, ']'); k > 0 {
			host = auth[1:k]
		}
	} else if k := strings.LastIndexByte(auth, ':'); k >= 0 {
		host = auth[:k]
	}
	x.emit(host)
	x.emit(auth)
	if k := strings.IndexAny(path, "?#"); k >= 0 {
		path = path[:k]
	}
	if strings.HasPrefix(strings.ToLower(u), "file:") && long(path, MinChunkLen) {
		x.emit(path) // file:///etc/hosts names the path /etc/hosts
	}
	if k := strings.LastIndexByte(path, '/'); k >= 0 && long(path[k+1:], MinChunkLen) {
		x.emit(path[k+1:]) // the file a download is saved as
	}
}

func isLocalChar(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-'
}

// email emits local@domain around the '@' at c[at].
func (x *extraction) email(c string, at int) {
	ls := at
	for ls > 0 && isLocalChar(c[ls-1]) {
		ls--
	}
	de := at + 1
	for de < len(c) && (isAlnum(c[de]) || c[de] == '.' || c[de] == '-') {
		de++
	}
	for de > at+1 && (c[de-1] == '.' || c[de-1] == '-') {
		de--
	}
	if ls == at || !isHostname(c[at+1:de]) {
		return
	}
	x.emit(c[ls:de])
}

// isHostname reports whether h is a dotted name whose last label is
// alphabetic and at least two letters long.
func isHostname(h string) bool {
	dot := strings.LastIndexByte(h, '.')
	if dot <= 0 || len(h)-dot-1 < 2 {
		return false
	}
	for i := dot + 1; i < len(h); i++ {
		if !isLetter(h[i]) {
			return false
		}
	}
	return !strings.Contains(h, "..")
}

// groups emits IBANs written in groups of four and grouped numbers
// (phone, account and card numbers written with separators). Values
// without spaces are chunks already; these rules exist because after Norm
// "DE89 3704 ..." equals "DE893704...", so the spaced form must be one
// value.
func (x *extraction) groups(s string) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i > 0 && isAlnum(s[i-1]) {
			continue
		}
		switch {
		case isLetter(c):
			if end := iban(s, i); end > i {
				x.emit(s[i:end])
				i = end - 1
			}
		case isDigit(c) || c == '+' || c == '(':
			if end := numberGroup(s, i); end > i {
				x.emit(s[i:end])
				i = end - 1
			}
		}
	}
}

// iban returns the end of a spaced IBAN starting at s[i], or i: two
// letters, two check digits, then groups of four alphanumerics separated
// by one space, the last group 1-4 long; 15-34 characters without the
// spaces; the longest such prefix whose ISO 13616 checksum holds.
func iban(s string, i int) int {
	if i+4 > len(s) || !isLetter(s[i+1]) || !isDigit(s[i+2]) || !isDigit(s[i+3]) {
		return i
	}
	ends := []int{i + 4}
	for p := i + 4; p < len(s) && s[p] == ' ' && len(ends) < 10; {
		q := p + 1
		for q < len(s) && q-p-1 < 4 && isAlnum(s[q]) {
			q++
		}
		if q == p+1 || q < len(s) && isAlnum(s[q]) {
			break
		}
		ends = append(ends, q)
		if q-p-1 < 4 {
			break
		}
		p = q
	}
	for k := len(ends) - 1; k >= 1; k-- {
		if ibanValid(s[i:ends[k]]) {
			return ends[k]
		}
	}
	return i
}

// ibanValid checks length and the mod-97 checksum of an IBAN that may
// contain spaces.
func ibanValid(v string) bool {
	var b [34]byte
	n := 0
	for i := 0; i < len(v); i++ {
		if v[i] == ' ' {
			continue
		}
		if n == len(b) {
			return false
		}
		b[n] = v[i]
		n++
	}
	if n < 15 {
		return false
	}
	rem := 0
	for k := range n {
		c := b[(k+4)%n] // the first four characters move to the end
		if isDigit(c) {
			rem = (rem*10 + int(c-'0')) % 97
		} else {
			rem = (rem*100 + int(c|0x20-'a'+10)) % 97
		}
	}
	return rem == 1
}

// numberGroup returns the end of a grouped number starting at s[i], or i:
// an optional '+' or '(', then digit runs separated by one or two of
// " -./()", at least two runs, MinGroupDigits to MaxGroupDigits digits,
// ending on a digit that no letter follows.
func numberGroup(s string, i int) int {
	p := i
	if s[p] == '+' || s[p] == '(' {
		p++
	}
	if p >= len(s) || !isDigit(s[p]) {
		return i
	}
	digits, runs, end := 0, 0, i
	prevEnd, prevDigits := i, 0
	for {
		q := p
		for q < len(s) && isDigit(s[q]) {
			q++
		}
		prevEnd, prevDigits = end, digits
		digits += q - p
		runs++
		end = q
		if digits > MaxGroupDigits {
			return i
		}
		r, seps := q, 0
		for r < len(s) && seps <= 2 && strings.IndexByte(" -./()", s[r]) >= 0 {
			r++
			seps++
		}
		if seps == 0 || seps > 2 || r >= len(s) || !isDigit(s[r]) {
			break
		}
		p = r
	}
	if end < len(s) && isLetter(s[end]) {
		end, digits, runs = prevEnd, prevDigits, runs-1
	}
	if runs < 2 || digits < MinGroupDigits {
		return i
	}
	return end
}

// numbers emits runs of digits with single '.' or ',' between digits
// ("1,250.00", "20240115"), at least MinNumberLen long, not glued to
// letters (so hex and keys do not shed fragments).
func (x *extraction) numbers(s string) {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			continue
		}
		start := i
		for i < len(s) && (isDigit(s[i]) || (s[i] == '.' || s[i] == ',') && i+1 < len(s) && isDigit(s[i+1]) && isDigit(s[i-1])) {
			i++
		}
		if start > 0 && isLetter(s[start-1]) || i < len(s) && isLetter(s[i]) {
			continue
		}
		if i-start >= MinNumberLen {
			x.emit(s[start:i])
		}
	}
}

// words emits the runs of letters and digits in s with at least one
// letter and at least MinWordLen runes, except one equal to the chunk
// already emitted.
func (x *extraction) words(s, chunk string) {
	start, runes, letter := 0, 0, false
	for i := 0; i <= len(s); {
		in, isL, size := false, false, 1
		if i < len(s) {
			c := s[i]
			if c < utf8.RuneSelf {
				cl := asciiClass[c]
				isL = cl&clLetter != 0
				in = cl&(clLetter|clDigit) != 0
			} else {
				var r rune
				r, size = utf8.DecodeRuneInString(s[i:])
				isL = unicode.IsLetter(r)
				in = isL || unicode.IsDigit(r)
			}
		}
		if in {
			if runes == 0 {
				start = i
			}
			runes++
			letter = letter || isL
		} else {
			if runes >= MinWordLen && letter && s[start:i] != chunk {
				x.emit(s[start:i])
			}
			runes, letter = 0, false
		}
		i += size
	}
}
