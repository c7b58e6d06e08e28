package decide

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/carbd/carbd/pkg/decide/match"
)

// Field-level trust of structured tool output (docs/policy.md, "fields";
// docs/provenance.md, "Field-level trust").
//
// A source is trusted or not as a whole (trusted.objects, paths, hosts).
// Much of what agents read is structured (a tool's JSON or YAML result,
// an API's JSON response) and mixes fields the platform produced (a
// transaction's own account, the id a drive assigned to a file, the
// participants the calendar records) with text a third party chose (a
// subject, a body, a review). A FieldRule marks fields of one source's
// output, selected by a path and optionally by a condition on the record
// that holds them, as trusted (their values enter T with their origin) or
// untrusted (a trusted source's values in them stay out of T).

// FieldRule is one entry of the policy's fields section.
type FieldRule struct {
	Name string // as the policy names it (for origins and audit records)
	// Source selects the incoming events whose output the rule reads.
	Source
	// Path selects the fields within the parsed output.
	Path FieldPath
	// Where are conditions on the record holding the selected fields (the
	// mapping at which Path's last named key was taken); all must hold.
	Where []FieldCond
	// Trust is Trusted (the fields' values vouch: they enter T) or
	// Untrusted (a trusted source's values in them do not).
	Trust Integrity
	// Reason says why the platform, not a third party, produced the field
	// (or why a trusted source's field is third-party text).
	Reason string
}

// FieldPath is a path into a parsed document: each step is a mapping key,
// or "*" for every value of a mapping and every element of a list. It is
// written with the steps separated by dots: "*.recipient", "*.participants",
// "data.items.*.id".
type FieldPath []string

// FieldAny is the wildcard step of a FieldPath.
const FieldAny = "*"

const (
	maxFieldPathLen   = 256
	maxFieldPathSteps = 16
	// maxFieldContent bounds the output parsed for field rules; a larger
	// output vouches for no field (and a trusted source with untrusted
	// fields vouches for nothing).
	maxFieldContent = 1 << 20
	// maxFieldDepth bounds the nesting walked under a selected field.
	maxFieldDepth = 64
)

// ParseFieldPath parses a path written as dot-separated steps. A step is
// "*" or a key: at least one character, no dot, no "*", no leading or
// trailing space.
func ParseFieldPath(s string) (FieldPath, error) {
	if s == "" {
		return nil, fmt.Errorf("fields: empty path")
	}
	if len(s) > maxFieldPathLen {
		return nil, fmt.Errorf("fields: path longer than %d bytes", maxFieldPathLen)
	}
	steps := strings.Split(s, ".")
	if len(steps) > maxFieldPathSteps {
		return nil, fmt.Errorf("fields: path %q has more than %d steps", s, maxFieldPathSteps)
	}
	for i, st := range steps {
		switch {
		case st == "":
			return nil, fmt.Errorf("fields: path %q: step %d is empty", s, i+1)
		case st == FieldAny:
		case strings.Contains(st, "*"):
			return nil, fmt.Errorf("fields: path %q: step %q: '*' is a whole step (any key or element), not part of a key", s, st)
		case strings.TrimSpace(st) != st:
			return nil, fmt.Errorf("fields: path %q: step %q has leading or trailing space", s, st)
		}
	}
	return FieldPath(steps), nil
}

// String writes the path as ParseFieldPath reads it.
func (fp FieldPath) String() string { return strings.Join(fp, ".") }

// CondKind is what a FieldCond requires of a record's key.
type CondKind uint8

const (
	// CondValues: the key's value, normalised, is one of Values.
	CondValues CondKind = iota
	// CondPrincipal: the key's value is one of the policy's principal
	// identities (trusted.principal).
	CondPrincipal
	// CondTrusted: the key's value is derivable from T as it was before
	// the output was read (the user or a trusted source named it).
	CondTrusted
)

// FieldCond is a condition on a key of the record holding a selected
// field. The key's value must be a scalar; a record without the key
// fails the condition.
type FieldCond struct {
	Key    string
	Kind   CondKind
	Values []string // normalised; CondValues only
}

// FieldMatch is a field a rule selected in an event's output.
type FieldMatch struct {
	Rule  *FieldRule
	Loc   string // where in the output, e.g. "[3].recipient"
	Value string // the scalar as the output holds it
	node  *yaml.Node
}

// parseStructured parses a tool's output (JSON, YAML, or a Python
// literal of dicts and lists, which YAML's flow syntax reads) into a
// document node. Anything else, or output over maxFieldContent, is not
// structured.
func parseStructured(content string) (root *yaml.Node, ok bool) {
	if len(content) > maxFieldContent || strings.TrimSpace(content) == "" {
		return nil, false
	}
	defer func() {
		if recover() != nil { // untrusted input: a parser panic means "not structured"
			root, ok = nil, false
		}
	}()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(content), &n); err != nil {
		return nil, false
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		r := n.Content[0]
		if r.Kind == yaml.MappingNode || r.Kind == yaml.SequenceNode {
			return r, true
		}
	}
	return nil, false
}

// selectFields calls fn for every scalar the rule's path selects in root,
// with the record holding it (nil when the path named no key).
func (r *FieldRule) selectFields(root *yaml.Node, fn func(rec *yaml.Node, m FieldMatch)) {
	var walk func(n *yaml.Node, i int, rec *yaml.Node, loc string)
	walk = func(n *yaml.Node, i int, rec *yaml.Node, loc string) {
		if n == nil || n.Kind == yaml.AliasNode {
			return
		}
		if i == len(r.Path) {
			scalarsUnder(n, loc, 0, func(m FieldMatch) { m.Rule = r; fn(rec, m) })
			return
		}
		step := r.Path[i]
		switch n.Kind {
		case yaml.MappingNode:
			for j := 0; j+1 < len(n.Content); j += 2 {
				k, v := n.Content[j], n.Content[j+1]
				if k.Kind != yaml.ScalarNode {
					continue
				}
				if step == FieldAny {
					walk(v, i+1, rec, joinLoc(loc, k.Value))
				} else if k.Value == step {
					walk(v, i+1, n, joinLoc(loc, k.Value))
				}
			}
		case yaml.SequenceNode:
			next := i + 1
			if step != FieldAny {
				next = i // a key applies to every record of a list
			}
			for j, el := range n.Content {
				walk(el, next, rec, loc+"["+strconv.Itoa(j)+"]")
			}
		}
	}
	walk(root, 0, nil, "")
}

func joinLoc(loc, key string) string {
	if loc == "" {
		return key
	}
	return loc + "." + key
}

// scalarsUnder calls fn for n if it is a scalar, else for every scalar
// value (not key) nested in it.
func scalarsUnder(n *yaml.Node, loc string, depth int, fn func(FieldMatch)) {
	if n == nil || depth > maxFieldDepth {
		return
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value != "" {
			fn(FieldMatch{Loc: loc, Value: n.Value, node: n})
		}
	case yaml.SequenceNode:
		for j, el := range n.Content {
			scalarsUnder(el, loc+"["+strconv.Itoa(j)+"]", depth+1, fn)
		}
	case yaml.MappingNode:
		for j := 0; j+1 < len(n.Content); j += 2 {
			if k := n.Content[j]; k.Kind == yaml.ScalarNode {
				scalarsUnder(n.Content[j+1], joinLoc(loc, k.Value), depth+1, fn)
			}
		}
	}
}

// recordValue returns the scalar value of key in the record rec.
func recordValue(rec *yaml.Node, key string) (string, bool) {
	if rec == nil || rec.Kind != yaml.MappingNode {
		return "", false
	}
	for j := 0; j+1 < len(rec.Content); j += 2 {
		k, v := rec.Content[j], rec.Content[j+1]
		if k.Kind == yaml.ScalarNode && k.Value == key {
			if v.Kind != yaml.ScalarNode {
				return "", false
			}
			return v.Value, true
		}
	}
	return "", false
}

// holds reports whether every condition of the rule holds for rec;
// derivable answers CondTrusted.
func (p *Policy) holds(r *FieldRule, rec *yaml.Node, derivable func(string) bool) bool {
	for _, c := range r.Where {
		v, ok := recordValue(rec, c.Key)
		if !ok || strings.TrimSpace(v) == "" {
			return false
		}
		nv := Norm(v)
		switch c.Kind {
		case CondValues:
			if !containsString(c.Values, nv) {
				return false
			}
		case CondPrincipal:
			if !containsString(p.Principal, nv) {
				return false
			}
		case CondTrusted:
			if derivable == nil || !derivable(v) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func containsString(vs []string, x string) bool {
	for _, v := range vs {
		if v == x {
			return true
		}
	}
	return false
}

// MatchFields returns the fields the policy's rules select in the
// structured output of an incoming event and whose records meet the
// rules' conditions, trusted and untrusted, in rule order; derivable
// answers the condition "trusted" (nil: it never holds). parsed is false
// when no rule reads the event's source or its output is not structured.
func (p *Policy) MatchFields(ev *Event, derivable func(string) bool) (ms []FieldMatch, parsed bool) {
	rules := p.fieldRules(ev)
	if len(rules) == 0 {
		return nil, false
	}
	root, ok := parseStructured(ev.Content)
	if !ok {
		return nil, false
	}
	return p.matchRules(rules, root, derivable), true
}

// fieldRules returns the field rules that read ev's source.
func (p *Policy) fieldRules(ev *Event) []*FieldRule {
	if len(p.Fields) == 0 || ev.Dir != In || ev.Ch == ChanCtrl {
		return nil
	}
	var rules []*FieldRule
	for i := range p.Fields {
		if p.Fields[i].Source.Match(ev) {
			rules = append(rules, &p.Fields[i])
		}
	}
	return rules
}

func (p *Policy) matchRules(rules []*FieldRule, root *yaml.Node, derivable func(string) bool) []FieldMatch {
	var out []FieldMatch
	for _, r := range rules {
		r.selectFields(root, func(rec *yaml.Node, m FieldMatch) {
			if p.holds(r, rec, derivable) {
				out = append(out, m)
			}
		})
	}
	return out
}

// Derivable reports whether x is derivable from T as the engine holds it
// now (D(x, T) with the written forms of docs/provenance.md, for a
// selector): what a record condition "trusted" asks. For tests and tools
// that check what field rules vouch for (Policy.MatchFields).
func (e *Engine) Derivable(x string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.derivableAs(RoleSelector, x)
}

// fieldValues are values a trusted field vouches for, with their origin.
type fieldValues struct {
	origin string
	values []string
}

// fieldTrustLocked applies the policy's field rules to an incoming
// event, against T as it is before the event's values are added. It
// returns the values the event's source vouches for as a whole (values
// itself, unless the source is trusted and some of its fields are marked
// untrusted: then the values of its other fields, or none when the output
// does not parse) and the values of fields marked trusted, each with its
// origin. A selected value that reads back the agent's own effect
// (echoesEffect) or is one of the principal's identities adds nothing.
// With the ablation switch Fields, the rules are ignored.
func (e *Engine) fieldTrustLocked(p *Policy, ev *Event, integrity Integrity, values []string) ([]string, []fieldValues) {
	if e.opt.Ablate.Fields {
		return values, nil
	}
	var rules []*FieldRule
	restrict := false
	for _, r := range p.fieldRules(ev) {
		switch {
		case r.Trust == Trusted && integrity == Trusted:
			continue // vouched for with the whole output already
		case r.Trust == Untrusted && integrity != Trusted:
			continue // nothing of an untrusted source enters T anyway
		case r.Trust == Untrusted:
			restrict = true
		}
		rules = append(rules, r)
	}
	if len(rules) == 0 {
		return values, nil
	}
	root, ok := parseStructured(ev.Content)
	if !ok {
		if restrict {
			return nil, nil // its untrusted fields cannot be told apart
		}
		return values, nil
	}
	var out []fieldValues
	var excluded map[*yaml.Node]bool
	origin := ev.Origin()
	derivable := func(v string) bool { return e.derivableAs(RoleSelector, v) }
	for _, m := range p.matchRules(rules, root, derivable) {
		if m.Rule.Trust == Untrusted {
			if excluded == nil {
				excluded = map[*yaml.Node]bool{}
			}
			excluded[m.node] = true
			continue
		}
		if e.echoesEffect(m.Value) {
			continue // the agent's own effect read back: state must not launder labels
		}
		if containsString(p.Principal, Norm(m.Value)) {
			// Her identity is in every record of her own data (a
			// participant of her events, a recipient of her mail); it
			// vouches for no effect addressed to her alone (classes.go).
			continue
		}
		out = append(out, fieldValues{
			origin: origin + ", field " + m.Loc + " (fields: " + m.Rule.Name + ")",
			values: match.Extract(m.Value),
		})
	}
	if restrict {
		values = keptValues(root, excluded)
	}
	return values, out
}

// echoesEffect reports whether v (or, for a list, one of its items) is
// the value of a field (other than content) of an outgoing effect of this
// episode, as far as the engine's trace remembers
// (Options.MaxTraceEvents). A platform field
// that holds what the agent itself sent (the recipient of a transfer it
// made, the participants it invited) reads the agent's own effect back:
// it vouches for nothing the effect's own provenance did not (Kairos
// §III-C: state must not launder labels).
func (e *Engine) echoesEffect(v string) bool {
	items, ok := e.listItems(v)
	if !ok {
		items = []string{v}
	}
	want := make(map[string]bool, len(items))
	for _, it := range items {
		if n := Norm(it); n != "" {
			want[n] = true
		}
	}
	if len(want) == 0 {
		return false
	}
	for i := range e.trace {
		t := &e.trace[i]
		if t.ev.Dir != Out {
			continue
		}
		for _, f := range t.ev.Fields {
			if f.Role == RoleContent {
				continue // text, not a value that steers (its list items are phrases)
			}
			if want[Norm(f.Value)] {
				return true
			}
			if fi, ok := e.listItems(f.Value); ok {
				for _, it := range fi {
					if want[Norm(it)] {
						return true
					}
				}
			}
		}
	}
	return false
}

// keptValues extracts the values of every scalar of the document (keys
// and values) except the excluded ones.
func keptValues(root *yaml.Node, excluded map[*yaml.Node]bool) []string {
	var ex match.Extractor
	var out []string
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if n == nil || depth > maxFieldDepth || excluded[n] {
			return
		}
		if n.Kind == yaml.ScalarNode {
			out = ex.Append(out, n.Value)
			return
		}
		for _, c := range n.Content {
			walk(c, depth+1)
		}
	}
	walk(root, 0)
	return out
}
