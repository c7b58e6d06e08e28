package decide

import (
	"fmt"
	"strings"
)

// civilDate is a calendar date; year 0 means the text gave none.
type civilDate struct {
	year, month, day int
}

func (d civilDate) iso() string { return fmt.Sprintf("%04d-%02d-%02d", d.year, d.month, d.day) }

var monthNames = map[string]int{
	"january": 1, "february": 2, "march": 3, "april": 4, "may": 5, "june": 6, "july": 7,
	"august": 8, "september": 9, "october": 10, "november": 11, "december": 12,
	"jan": 1, "feb": 2, "mar": 3, "apr": 4, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "sept": 9,
	"oct": 10, "nov": 11, "dec": 12,
}

// dateToken is a word, a number or one punctuation character of a text.
type dateToken struct {
	text    string // lowercase
	num     int    // the value of a number token (ordinal suffix dropped), else -1
	ordinal bool   // the number had st/nd/rd/th
	digits  int    // digits of a number token
}

func tokenizeDates(s string) []dateToken {
	var out []dateToken
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			j := i
			n := 0
			for j < len(s) && s[j] >= '0' && s[j] <= '9' && j-i < 9 {
				n = n*10 + int(s[j]-'0')
				j++
			}
			t := dateToken{text: s[i:j], num: n, digits: j - i}
			if j+2 <= len(s) {
				switch strings.ToLower(s[j : j+2]) {
				case "st", "nd", "rd", "th":
					if j+2 == len(s) || !isASCIILetter(s[j+2]) {
						t.ordinal = true
						j += 2
					}
				}
			}
			out = append(out, t)
			i = j
		case isASCIILetter(c):
			j := i
			for j < len(s) && isASCIILetter(s[j]) {
				j++
			}
			out = append(out, dateToken{text: strings.ToLower(s[i:j]), num: -1})
			i = j
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		default:
			out = append(out, dateToken{text: s[i : i+1], num: -1})
			i++
		}
	}
	return out
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }

// parseDates returns the calendar dates a text names: ISO dates
// (2024-05-19, 2024/05/19, with or without a time after them; years
// 1900-2199), and dates
// with a month name in English — "January 11th", "11th of January",
// "Jan 11, 2025", "May 1st, 2024" — with the year that follows them if
// any. In a range ("the 13th to the 17th of May 2024", "January 11th to
// January 15th 2025") the first end takes the month and year of the
// second. Relative dates ("tomorrow", "next week") are not read.
func parseDates(s string) []civilDate {
	toks := tokenizeDates(s)
	type mention struct {
		d          civilDate
		start, end int  // token indexes of the mention and after it (and its year)
		hasMonth   bool // false: a bare ordinal day ("the 13th")
	}
	var ms []mention
	isDay := func(t dateToken) bool { return t.num >= 1 && t.num <= 31 && t.digits <= 2 }
	month := func(t dateToken) int {
		if t.num >= 0 {
			return 0
		}
		return monthNames[t.text]
	}
	skip := func(i int, words ...string) int {
		for i < len(toks) {
			ok := false
			for _, w := range words {
				if toks[i].text == w {
					ok = true
					break
				}
			}
			if !ok {
				break
			}
			i++
		}
		return i
	}
	year := func(i int) (int, int) {
		j := skip(i, ",")
		if j < len(toks) && toks[j].digits == 4 && toks[j].num >= 1900 && toks[j].num <= 2199 && !toks[j].ordinal {
			if j+1 < len(toks) && (toks[j+1].text == "-" || toks[j+1].text == "/") {
				return 0, i // the start of an ISO date, not a year
			}
			return toks[j].num, j + 1
		}
		return 0, i
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		// ISO: YYYY-MM-DD or YYYY/MM/DD.
		if t.digits == 4 && t.num >= 1900 && t.num <= 2199 && !t.ordinal && i+4 < len(toks) && (toks[i+1].text == "-" || toks[i+1].text == "/") &&
			toks[i+3].text == toks[i+1].text && toks[i+2].digits <= 2 && toks[i+2].num >= 1 && toks[i+2].num <= 12 && isDay(toks[i+4]) {
			ms = append(ms, mention{d: civilDate{t.num, toks[i+2].num, toks[i+4].num}, start: i, end: i + 5, hasMonth: true})
			i += 4
			continue
		}
		if m := month(t); m > 0 {
			j := skip(i+1, "the")
			if j < len(toks) && isDay(toks[j]) {
				y, end := year(j + 1)
				ms = append(ms, mention{d: civilDate{y, m, toks[j].num}, start: i, end: end, hasMonth: true})
				i = end - 1
			}
			continue
		}
		if isDay(t) {
			j := skip(i+1, "of", "the")
			if j < len(toks) && month(toks[j]) > 0 {
				y, end := year(j + 1)
				ms = append(ms, mention{d: civilDate{y, month(toks[j]), t.num}, start: i, end: end, hasMonth: true})
				i = end - 1
				continue
			}
			if t.ordinal {
				ms = append(ms, mention{d: civilDate{0, 0, t.num}, start: i, end: i + 1})
			}
		}
	}
	// Ranges: an end without month or year takes them from the next
	// mention when a connector joins them.
	for k := len(ms) - 2; k >= 0; k-- {
		a, b := &ms[k], &ms[k+1]
		if skip(a.end, "to", "-", "until", "till", "through", "and", "the", "from") != b.start || a.end == b.start {
			continue
		}
		if !a.hasMonth && b.hasMonth {
			a.d.month, a.hasMonth = b.d.month, true
		}
		if a.d.year == 0 {
			a.d.year = b.d.year
		}
	}
	var out []civilDate
	for _, m := range ms {
		if m.hasMonth {
			out = append(out, m.d)
		}
	}
	return out
}
