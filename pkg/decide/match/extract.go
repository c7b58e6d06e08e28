package match

import (
	"cmp"
	"slices"
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

// DestKind is the kind of a destination-like value found in free text.
type DestKind uint8

// Kinds of destination-like values (Destinations).
const (
	DestURL   DestKind = iota + 1 // scheme://... (http, https, ftp, mailto is an e-mail)
	DestHost                      // a bare host name a reader would open: www.example.com, example.com/path, example.com
	DestEmail                     // local@domain
	DestIBAN                      // an IBAN: compact (isCompactIBAN) or in groups of four with a valid checksum
	DestPhone                     // an international phone number: '+' then 7-15 digits in groups
)

var destKindNames = [...]string{DestURL: "url", DestHost: "host", DestEmail: "email", DestIBAN: "iban", DestPhone: "phone"}

func (k DestKind) String() string {
	if int(k) < len(destKindNames) && destKindNames[k] != "" {
		return destKindNames[k]
	}
	return "dest?"
}

// Destination is a destination-like value embedded in free text: where a
// reader of the text can be sent (a link, a host, an address, an account,
// a number to call). Value is a substring of the content and Offset its
// byte offset.
type Destination struct {
	Kind   DestKind
	Value  string
	Offset int
}

// commonTLDs are the top-level domains under which a dotted name without a
// scheme, "www." or a path is taken for a host name. Other dotted names
// (report.pdf, notes.md, feedback.xlsx) are file names far more often than
// hosts; docs/provenance.md names the false negatives.
var commonTLDs = map[string]bool{
	"com": true, "net": true, "org": true, "info": true, "biz": true, "io": true, "co": true,
	"me": true, "app": true, "dev": true, "xyz": true, "online": true, "site": true, "top": true,
	"link": true, "click": true, "shop": true, "ru": true, "cn": true, "uk": true, "us": true,
	"edu": true, "gov": true,
}

// mayHoldDestination is a cheap test that rules out most ordinary text:
// every destination kind needs a '.' (hosts), '/' (a URL's "://"), '@'
// (e-mail addresses) or some digits (IBANs, phone numbers).
func mayHoldDestination(s string) bool {
	digits := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.' || c == '@' || c == '/' || c >= 0x80:
			return true
		case c >= '0' && c <= '9':
			digits++
			if digits >= 2 { // an IBAN has two check digits
				return true
			}
		}
	}
	return false
}

// coverage answers whether a span lies inside one already taken, in
// O(log n): the spans of the earlier passes sorted by start with the
// running maximum of their ends, and the current pass's spans, which
// come in increasing order (a quadratic scan of every earlier span let a
// body of repeated spaced IBANs stall the decision: 1 MiB in 1.2 s).
type coverage struct {
	prev   []span // earlier passes, sorted by start
	maxEnd []int  // maxEnd[k]: the largest end of prev[:k+1]
	cur    []span // this pass, in increasing start
}

type span struct{ start, end int }

func (c *coverage) covered(i, j int) bool {
	// This pass: only the spans that end after i can hold [i, j).
	for k := len(c.cur) - 1; k >= 0 && c.cur[k].end > i; k-- {
		if i >= c.cur[k].start && j <= c.cur[k].end {
			return true
		}
	}
	k, _ := slices.BinarySearchFunc(c.prev, i+1, func(s span, t int) int { return cmp.Compare(s.start, t) })
	return k > 0 && c.maxEnd[k-1] >= j
}

func (c *coverage) add(i, j int) { c.cur = append(c.cur, span{i, j}) }

// endPass folds the current pass's spans into the earlier ones.
func (c *coverage) endPass() {
	if len(c.cur) == 0 {
		return
	}
	c.prev = append(c.prev, c.cur...)
	c.cur = c.cur[:0]
	slices.SortFunc(c.prev, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	c.maxEnd = c.maxEnd[:0]
	m := -1
	for _, s := range c.prev {
		m = max(m, s.end)
		c.maxEnd = append(c.maxEnd, m)
	}
}

// Destinations returns the destination-like values in content, in order
// of appearance: URLs with a scheme, bare host names ("www." names, names
// followed by a path, and dotted names under a common top-level domain),
// e-mail addresses, IBANs (checksum-valid, compact or spaced) and
// international phone numbers ('+' and 7-15 digits). A value inside a
// longer one (the host of a URL, the domain of an address) is not
// reported again. It is the typed subset of Extract that the engine gates
// as embedded targets: a link or an address inside a message steers
// whoever reads it (docs/provenance.md).
func Destinations(content string) []Destination {
	if !mayHoldDestination(content) {
		return nil
	}
	return destinationsFull(content)
}

func destinationsFull(content string) []Destination {
	var out []Destination
	var cov coverage
	add := func(k DestKind, i, j int) {
		if j > i && !cov.covered(i, j) {
			out = append(out, Destination{Kind: k, Value: content[i:j], Offset: i})
			cov.add(i, j)
		}
	}
	// URLs with a scheme.
	for off := 0; ; {
		k := strings.Index(content[off:], "://")
		if k < 0 {
			break
		}
		i := off + k
		start := i
		for start > 0 && isSchemeChar(content[start-1]) {
			start--
		}
		for start < i && !isLetter(content[start]) {
			start++
		}
		end := i + 3
		for end < len(content) {
			c := content[end]
			if c <= ' ' || strings.IndexByte("\"'<>`{}|^\\", c) >= 0 {
				break
			}
			if c >= utf8.RuneSelf {
				r, size := utf8.DecodeRuneInString(content[end:])
				if unicode.IsSpace(r) || isChunkDelim(r) {
					break
				}
				end += size
				continue
			}
			end++
		}
		u := trimURL(content[start:end])
		if start < i && len(u) > i-start+3 {
			add(DestURL, start, start+len(u))
		}
		off = end
	}
	cov.endPass()
	// Chunks: e-mail addresses, bare hosts, compact IBANs.
	start := 0
	for i := 0; i <= len(content); {
		delim, size := true, 1
		if i < len(content) {
			if c := content[i]; c < utf8.RuneSelf {
				delim = asciiClass[c]&clDelim != 0
			} else {
				var r rune
				r, size = utf8.DecodeRuneInString(content[i:])
				delim = isChunkDelim(r)
			}
		}
		if delim {
			if start < i {
				destChunk(content, start, i, add)
			}
			start = i + size
		}
		i += size
	}
	cov.endPass()
	// Spaced IBANs and phone numbers.
	for i := 0; i < len(content); i++ {
		c := content[i]
		if i > 0 && isAlnum(content[i-1]) {
			continue
		}
		switch {
		case isLetter(c):
			if end := iban(content, i); end > i {
				add(DestIBAN, i, end)
				i = end - 1
			}
		case c == '+':
			if end := numberGroup(content, i); end > i && phoneDigits(content[i:end]) {
				add(DestPhone, i, end)
				i = end - 1
			}
		}
	}
	slices.SortFunc(out, func(a, b Destination) int { return a.Offset - b.Offset })
	return out
}

// destChunk classifies the chunk content[s:e] (trimmed of punctuation).
func destChunk(content string, s, e int, add func(DestKind, int, int)) {
	c := content[s:e]
	t := trimChunk(c)
	if t == "" {
		return
	}
	s += strings.Index(c, t)
	c = t
	if strings.Contains(c, "://") {
		return // the URL pass
	}
	if at := strings.IndexByte(c, '@'); at > 0 {
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
		if ls < at && isHostname(c[at+1:de]) {
			add(DestEmail, s+ls, s+de)
		}
		return
	}
	if isCompactIBAN(c) {
		add(DestIBAN, s, s+len(c))
		return
	}
	// A bare host: the name before the first '/', ':' or '?'.
	h := c
	rest := ""
	if k := strings.IndexAny(c, "/:?#"); k >= 0 {
		h, rest = c[:k], c[k:]
	}
	if !isHostname(h) || !hostChars(h) {
		return
	}
	tld := strings.ToLower(h[strings.LastIndexByte(h, '.')+1:])
	www := len(h) > 4 && strings.EqualFold(h[:4], "www.")
	if www || strings.HasPrefix(rest, "/") || commonTLDs[tld] {
		add(DestHost, s, s+len(c))
	}
}

// hostChars reports whether h has only the characters of a host name.
func hostChars(h string) bool {
	for i := 0; i < len(h); i++ {
		if c := h[i]; !isAlnum(c) && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// isCompactIBAN reports whether c is shaped like an IBAN written without
// spaces: two letters, two check digits, then 11 to 30 letters and
// digits, and either a valid ISO 13616 checksum or only digits after the
// check digits (account numbers as people and test data write them,
// e.g. "US133000000121212121212", whose checksum does not hold).
func isCompactIBAN(c string) bool {
	if len(c) < 15 || len(c) > 34 || !isLetter(c[0]) || !isLetter(c[1]) || !isDigit(c[2]) || !isDigit(c[3]) {
		return false
	}
	digits := true
	for i := 4; i < len(c); i++ {
		if !isAlnum(c[i]) {
			return false
		}
		digits = digits && isDigit(c[i])
	}
	return digits || ibanValid(c)
}

// phoneDigits reports whether a grouped number has the 7-15 digits of an
// international phone number (ITU-T E.164 allows at most 15).
func phoneDigits(v string) bool {
	n := 0
	for i := 0; i < len(v); i++ {
		if isDigit(v[i]) {
			n++
		}
	}
	return n >= MinGroupDigits && n <= 15
}

// Distinctive reports whether a normalised sensitive token is distinctive
// enough that finding it in an effect means the effect carries it: an
// e-mail address, a URL or "www." host, a dotted name (host or file
// name), an IBAN, a number or identifier with at least four digits, a
// token mixing letters with at least two digits, or a run of at least
// PhraseMinLen letters (a normalised phrase: whitespace removal joins the
// words of a quoted sentence). Ordinary words and field names ("customer",
// "recipient", "start_time") are not: they occur in every text, and
// treating them as carried data defers effects that carry nothing read
// (docs/provenance.md gives the false negatives this buys).
func Distinctive(tok string) bool {
	if strings.Contains(tok, "://") || strings.HasPrefix(tok, "www.") {
		return true
	}
	if at := strings.IndexByte(tok, '@'); at > 0 && isHostname(tok[at+1:]) {
		return true
	}
	if isCompactIBAN(tok) {
		return true
	}
	if isDateTime(tok) || IsTimeOfDay(tok) {
		return false
	}
	digits, letters, other := 0, 0, 0
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case isDigit(c):
			digits++
		case isLetter(c) || c >= utf8.RuneSelf:
			letters++
		default:
			other++
		}
	}
	switch {
	case digits >= 4, digits >= 2 && letters > 0:
		return true
	case strings.IndexByte(tok, '.') > 0 && isHostname(strings.TrimRight(tok, ".")):
		return true
	}
	return letters >= PhraseMinLen
}

// isDateTime reports whether a normalised token is a calendar date
// (YYYY-MM-DD or YYYY/MM/DD), optionally followed by a time of day: dates
// recur across unrelated records (every event, payment and message of a
// day shares one), so they are not evidence that an effect carries a
// sensitive record.
func isDateTime(tok string) bool {
	if len(tok) < 10 || !isDigit(tok[0]) || !isDigit(tok[1]) || !isDigit(tok[2]) || !isDigit(tok[3]) ||
		(tok[4] != '-' && tok[4] != '/') || tok[7] != tok[4] || !isDigit(tok[5]) || !isDigit(tok[6]) ||
		!isDigit(tok[8]) || !isDigit(tok[9]) {
		return false
	}
	for i := 10; i < len(tok); i++ {
		if c := tok[i]; !isDigit(c) && c != ':' && c != '.' && c != 't' && c != 'z' && c != '+' && c != '-' {
			return false
		}
	}
	return true
}

// IsTimeOfDay reports whether a normalised token is a time of day
// ("10:00", "14:30:00", "9:15am", "10:00:00.000") or a range of two
// ("10:00-11:30"): like dates, times recur across unrelated records (every
// meeting at ten shares one), so they are no evidence that an effect
// carries a sensitive record.
func IsTimeOfDay(tok string) bool {
	if a, b, ok := strings.Cut(tok, "-"); ok {
		return clockTime(a) && clockTime(b)
	}
	return clockTime(tok)
}

// clockTime reports whether s is H:MM or HH:MM, optionally followed by
// :SS, a fraction of a second, and "am" or "pm", with the hour and the
// minutes in range.
func clockTime(s string) bool {
	s = strings.TrimSuffix(strings.TrimSuffix(s, "am"), "pm")
	h, rest, ok := strings.Cut(s, ":")
	if !ok || len(h) < 1 || len(h) > 2 || !allDigits(h) || atoi2(h) > 24 {
		return false
	}
	parts := strings.Split(rest, ":")
	if len(parts) > 2 {
		return false
	}
	if len(parts) == 2 {
		sec, frac, _ := strings.Cut(parts[1], ".")
		if len(sec) != 2 || !allDigits(sec) || atoi2(sec) > 60 || !allDigits(frac) {
			return false
		}
	}
	m := parts[0]
	return len(m) == 2 && allDigits(m) && atoi2(m) < 60
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

// atoi2 is the value of one or two digits.
func atoi2(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		n = 10*n + int(s[i]-'0')
	}
	return n
}

// PhraseMinLen is the number of letters from which a normalised token
// without digits counts as a phrase (Distinctive): whitespace removal
// joins the words of a quoted sentence, and English words are shorter.
const PhraseMinLen = 24
