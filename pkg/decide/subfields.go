package decide

import (
	"github.com/carbd/carbd/pkg/decide/match"
)

// gatedItem is one value the provenance question checks: the value of a
// field whose role the operation gates, or a destination embedded in a
// content field of an operation that gates targets (an embedded target).
type gatedItem struct {
	Field string // the field's name; "body[url]" for an embedded target
	Role  Role
	Value string
	// index is the field's position in the effect's fields (for an
	// embedded target, that of the content field holding it).
	index    int
	embedded bool
}

// gatedItems lists the values of an effect that must be derivable from T:
// every non-empty field of a gated role, and, when the operation gates
// targets, every destination embedded in its content fields (URLs, host
// names, e-mail addresses, IBANs and phone numbers found by
// match.Destinations). Kairos gates the values that steer an effect; a
// link or an address in a message steers whoever reads it, so it is a
// target of the effect as much as the recipient field is. Embedded
// targets carry role target but have no calibrated threshold (the
// calibration data label declared fields only): the CRC step never allows
// one on a score and never reverts one.
//
// The items are appended to dst, so a caller can keep them on its stack.
func (e *Engine) gatedItems(dst []gatedItem, spec *OpSpec, fields []Field) []gatedItem {
	out := dst
	for i, f := range fields {
		if f.Value == "" {
			continue
		}
		if spec.Gate.Has(f.Role) {
			out = append(out, gatedItem{Field: f.Name, Role: f.Role, Value: f.Value, index: i})
			continue
		}
		if f.Role != RoleContent || !spec.Gate.Has(RoleTarget) || e.opt.Ablate.Embedded {
			continue
		}
		for _, d := range match.Destinations(f.Value) {
			out = append(out, gatedItem{Field: f.Name + "[" + d.Kind.String() + "]", Role: RoleTarget, Value: d.Value, index: i, embedded: true})
		}
	}
	return out
}

// derivableItem is D(x, T) for a gated item: derivableAs for its role;
// for an embedded phone number, also the same digits as a trusted value
// (numbers are written with different separators).
func (e *Engine) derivableItem(it gatedItem) bool {
	if e.derivableAs(it.Role, it.Value) {
		return true
	}
	if it.embedded && isPhoneLike(it.Value) {
		want := digitsOf(it.Value)
		for v := range e.trusted.All() {
			if isPhoneLike(v) && digitsOf(v) == want {
				return true
			}
		}
	}
	return false
}

func isPhoneLike(v string) bool {
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= '0' && c <= '9':
			n++
		case c == '+' || c == ' ' || c == '-' || c == '.' || c == '(' || c == ')':
		default:
			return false
		}
	}
	return n >= match.MinGroupDigits
}

func digitsOf(v string) string {
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] >= '0' && v[i] <= '9' {
			b = append(b, v[i])
		}
	}
	return string(b)
}
