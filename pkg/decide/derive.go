package decide

import (
	"strings"

	"github.com/carbd/carbd/pkg/decide/match"
)

// derivableAs is D(x, T) for a value of a given role, with the written
// forms that name the same thing counted as equal (docs/provenance.md,
// "Derivability beyond equality"):
//
//   - any value: equality after Norm, or a list (separated by newlines,
//     commas or semicolons, or a JSON array) whose items each are
//     (derivable);
//   - a URL or host name: the same location written with or without a
//     scheme ("http://", "https://"), a trailing "/" or a leading "www."
//     (urlForms);
//   - a selector that is a decimal number (a record picked by its
//     amount): the same number with or without trailing zeros after
//     its point ("10.0" for "10.00");
//   - a control value holding dates (a booking's day, an event's start):
//     every calendar date in it is a date of T, written in any common form
//     ("2025-01-11", "January 11th, 2025", "the 11th of January"; a date
//     written without a year matches any year). The time of day is not
//     traced: it is computed from durations ("one hour long") or chosen by
//     the agent, and an injection that can move an effect only within a day
//     the user named gains nothing this layer can see.
func (e *Engine) derivableAs(role Role, x string) bool {
	if e.derivable(x) {
		return true
	}
	if e.opt.Ablate.Forms {
		return false
	}
	if items, ok := e.listItems(x); ok {
		n := 0
		for _, part := range items {
			if !e.derivableOne(role, part) {
				if e.isPrincipal(part) {
					continue // the principal among those T names (classes.go)
				}
				return false
			}
			n++
		}
		return n > 0
	}
	return e.derivableOne(role, x)
}

// derivableOne is derivableAs for one item of a value.
func (e *Engine) derivableOne(role Role, x string) bool {
	if e.trusted.Contains(x) {
		return true
	}
	for _, f := range urlForms(x) {
		if e.trusted.Contains(f) {
			return true
		}
	}
	if role == RoleControl {
		return e.datesDerivable(x)
	}
	if role == RoleSelector {
		for _, f := range amountForms(x) {
			if e.trusted.Contains(f) {
				return true
			}
		}
	}
	return false
}

// amountForms returns the other ways of writing the decimal number x
// with or without trailing zeros after its point ("10.0" for "10.00" or
// "10"), when x is one: digits, optionally a point and up to two more.
// It returns nil for anything else. A selector that picks a record by
// an amount the user named ("refund that 10.00") reads the record's
// amount as the platform writes it (10.0).
func amountForms(x string) []string {
	v := strings.TrimSpace(x)
	whole, frac, dot := strings.Cut(v, ".")
	if whole == "" || len(whole) > 15 || len(frac) > 2 || dot && frac == "" || !allDigits(whole) || !allDigits(frac) {
		return nil
	}
	frac = strings.TrimRight(frac, "0")
	var forms []string
	switch len(frac) {
	case 0:
		forms = []string{whole, whole + ".0", whole + ".00"}
	case 1:
		forms = []string{whole + "." + frac, whole + "." + frac + "0"}
	default:
		return nil // written one way only
	}
	out := forms[:0]
	for _, f := range forms {
		if f != v {
			out = append(out, f)
		}
	}
	return out
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func isListValue(x string) bool { return strings.ContainsAny(x, "\n,;") }

// splitList splits a list value at newlines, commas and semicolons, with
// empty items dropped.
func splitList(x string) []string {
	var out []string
	for _, part := range strings.FieldsFunc(x, func(r rune) bool { return r == '\n' || r == ',' || r == ';' }) {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// urlForms returns the other ways of writing the location x names, when x
// is a URL or a host name: without its scheme, without a trailing "/",
// with or without "www.", and with "http://" or "https://" in front. It
// returns nil for anything else (an e-mail address, a name, a number).
func urlForms(x string) []string {
	v := strings.ToLower(strings.TrimSpace(x))
	bare := v
	if i := strings.Index(v, "://"); i > 0 {
		scheme := v[:i]
		if scheme != "http" && scheme != "https" {
			return nil
		}
		bare = v[i+3:]
	} else if !looksLikeHost(v) {
		return nil
	}
	bare = strings.TrimSuffix(bare, "/")
	if bare == "" || strings.ContainsAny(bare, " @") {
		return nil
	}
	hosts := []string{bare}
	if rest, ok := strings.CutPrefix(bare, "www."); ok {
		hosts = append(hosts, rest)
	} else {
		hosts = append(hosts, "www."+bare)
	}
	out := make([]string, 0, 4*len(hosts))
	for _, h := range hosts {
		out = append(out, h, h+"/", "http://"+h, "https://"+h, "http://"+h+"/", "https://"+h+"/")
	}
	return out
}

// looksLikeHost reports whether v (lowercase) starts with a dotted host
// name: "www.example.com", "example.com/path".
func looksLikeHost(v string) bool {
	h := v
	if k := strings.IndexAny(v, "/:?#"); k >= 0 {
		h = v[:k]
	}
	dot := strings.LastIndexByte(h, '.')
	if dot <= 0 || dot == len(h)-1 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return false
		}
	}
	for i := dot + 1; i < len(h); i++ {
		if h[i] < 'a' || h[i] > 'z' {
			return false
		}
	}
	return true
}

// datesDerivable reports whether x names at least one calendar date and
// every date it names is a date of T: written as YYYY-MM-DD in a trusted
// value, or named in the principal's task in any form parseDates reads,
// when the policy trusts the task (a task it does not trust vouches for
// nothing, dates included).
func (e *Engine) datesDerivable(x string) bool {
	ds := parseDates(x)
	if len(ds) == 0 {
		return false
	}
	var task []civilDate
	taskParsed := false
	for _, d := range ds {
		if d.year != 0 && e.trusted.Contains(d.iso()) {
			continue
		}
		if !taskParsed {
			task, taskParsed = parseDates(e.taskT), true
		}
		ok := false
		for _, t := range task {
			if t.month == d.month && t.day == d.day && (t.year == 0 || d.year == 0 || t.year == d.year) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// isTaskToken reports whether the normalised token occurs in the
// normalised principal's task: the user supplied it, so finding it in an
// effect discloses nothing read from a sensitive source.
func (e *Engine) isTaskToken(tok, normTask string) bool {
	return normTask != "" && strings.Contains(normTask, tok)
}

// appendLine appends a line of text to s.
func appendLine(s, line string) string {
	if s == "" {
		return line
	}
	return s + "\n" + line
}

// normTask returns Norm of the principal's task.
func (e *Engine) normTask() string { return match.Norm(e.task) }
