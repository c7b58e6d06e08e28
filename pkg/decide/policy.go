package decide

import (
	"net/netip"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// Level is a confidentiality level: an index into the policy's ordered
// list of levels, 0 being the lowest (public). Join is max.
type Level uint8

// Join returns the least upper bound of two levels.
func (l Level) Join(o Level) Level {
	if o > l {
		return o
	}
	return l
}

// Integrity is the integrity label: Untrusted ⊑ Trusted, meet on combination.
type Integrity uint8

const (
	Untrusted Integrity = iota
	Trusted
)

// Meet returns the greatest lower bound of two integrity labels.
func (i Integrity) Meet(o Integrity) Integrity {
	if o < i {
		return o
	}
	return i
}

func (i Integrity) String() string {
	if i == Trusted {
		return "trusted"
	}
	return "untrusted"
}

// Label is the pair of labels carried by a value or a location.
type Label struct {
	Integrity Integrity `json:"integrity"`
	Level     Level     `json:"level"`
}

// Combine merges two labels towards the conservative element: meet for
// integrity, join for confidentiality.
func (l Label) Combine(o Label) Label {
	return Label{Integrity: l.Integrity.Meet(o.Integrity), Level: l.Level.Join(o.Level)}
}

// Glob is a compiled glob: doublestar syntax for paths ("**" spans
// directories), plain '*' for hosts and operations. Build it with
// NewGlob, which classifies the pattern once; a Glob literal with only
// Pattern set still works (classified on every match).
type Glob struct {
	Pattern string
	shape   globShape // 0: not classified
}

type globShape uint8

const (
	globUnclassified globShape = iota
	globLiteral                // no metacharacter: equality
	globPrefix                 // "prefix*": '*' does not cross '/'
	globSuffix                 // "*suffix"
	globGeneral                // anything else: doublestar
)

// NewGlob returns the glob of pattern, classified for fast matching.
func NewGlob(pattern string) Glob {
	return Glob{Pattern: pattern, shape: classifyGlob(pattern)}
}

func classifyGlob(p string) globShape {
	switch i := strings.IndexAny(p, "*?[{\\"); {
	case i < 0:
		return globLiteral
	case i == len(p)-1 && p[i] == '*' && !strings.ContainsAny(p, "]}"):
		return globPrefix
	case i == 0 && p[0] == '*' && len(p) > 1 && !strings.ContainsAny(p[1:], "*?[]{}\\"):
		return globSuffix
	}
	return globGeneral
}

// Match reports whether s matches the glob. The common shapes (a literal,
// "prefix*", "*suffix") are matched directly; the rest by doublestar.
func (g Glob) Match(s string) bool {
	p := g.Pattern
	shape := g.shape
	if shape == globUnclassified {
		shape = classifyGlob(p)
	}
	switch shape {
	case globLiteral:
		return s == p
	case globPrefix:
		i := len(p) - 1
		return strings.HasPrefix(s, p[:i]) && strings.IndexByte(s[i:], '/') < 0
	case globSuffix:
		return strings.HasSuffix(s, p[1:]) && strings.IndexByte(s[:len(s)-len(p)+1], '/') < 0
	}
	ok, _ := doublestar.Match(p, s)
	return ok
}

func matchAny(gs []Glob, s string) bool {
	for _, g := range gs {
		if g.Match(s) {
			return true
		}
	}
	return false
}

// Endpoint selects network destinations: by host name glob, by address
// prefix, and optionally by port. An Endpoint with neither hosts nor
// prefixes matches nothing.
type Endpoint struct {
	Hosts    []Glob         // lowercased host globs, e.g. "*.github.com"
	Prefixes []netip.Prefix // addresses and CIDRs
	Ports    []uint16       // empty: any port
}

// Match reports whether the destination is selected.
func (ep *Endpoint) Match(d *Dest) bool {
	if d == nil {
		return false
	}
	if len(ep.Ports) > 0 {
		ok := false
		for _, p := range ep.Ports {
			if p == d.Port {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if d.Host != "" && matchAny(ep.Hosts, strings.ToLower(strings.TrimSuffix(d.Host, "."))) {
		return true
	}
	if d.Addr.IsValid() {
		a := d.Addr.Unmap()
		for _, p := range ep.Prefixes {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

// Source selects incoming events: by path glob on the file channel, by
// endpoint on the net channel, and by object glob on any channel (e.g.
// "tool:get_inbox" for traces of tool-calling agents).
type Source struct {
	Paths   []Glob
	Net     Endpoint
	Objects []Glob
}

// Match reports whether the event comes from this source.
func (s *Source) Match(ev *Event) bool {
	switch ev.Ch {
	case ChanFile:
		if matchAny(s.Paths, ev.Obj) {
			return true
		}
	case ChanNet:
		if s.Net.Match(ev.Dest) {
			return true
		}
	}
	return matchAny(s.Objects, ev.Obj)
}

// SensitiveSource is a source whose content is sensitive at Level.
type SensitiveSource struct {
	Name string // as the policy names it (for audit records)
	Source
	Level Level
}

// Party is a named destination with a clearance: the highest level of
// data it may receive.
type Party struct {
	Name      string
	Endpoint  Endpoint
	Objects   []Glob // for non-network destinations (e.g. a tool call's recipient value)
	Clearance Level
}

// RefuseRule is an explicit operator rule: an effect it matches is refused
// and no oracle can release it.
type RefuseRule struct {
	Name  string
	Ops   []Glob   // operations, e.g. "file:write", "file:*"; empty: any
	Paths []Glob   // file objects; empty with Net empty: any object
	Net   Endpoint // network destinations
	// Values: refuse when any field value, normalised, equals one of these.
	Values []string
}

// Match reports whether the rule refuses the effect.
func (r *RefuseRule) Match(ev *Event) bool {
	if len(r.Ops) > 0 && !matchAny(r.Ops, ev.Op) {
		return false
	}
	objSel := len(r.Paths) > 0 || len(r.Net.Hosts) > 0 || len(r.Net.Prefixes) > 0
	if objSel {
		hit := false
		if ev.Ch == ChanFile && matchAny(r.Paths, ev.Obj) {
			hit = true
		}
		if ev.Ch == ChanNet && r.Net.Match(ev.Dest) {
			hit = true
		}
		if !hit {
			return false
		}
	}
	if len(r.Values) > 0 {
		for _, f := range ev.Fields {
			nv := Norm(f.Value)
			for _, v := range r.Values {
				if nv == v {
					return true
				}
			}
		}
		return false
	}
	return true
}

// OpSpec is what the policy says about one operation (or a glob of them).
type OpSpec struct {
	Ops  []Glob
	Kind Kind
	// Gate is the set of roles whose values must be derivable from T.
	Gate RoleSet
	// Roles maps field names to roles, overriding what the hook supplied
	// (used for tool-calling traces: "recipient" -> target).
	Roles map[string]Role
	// DestField names the field whose value is the effect's destination
	// for party and clearance lookups (a tool call's recipient).
	DestField string
	// Ledger features (G-CARB Table 1).
	Financial    bool
	Irreversible bool
	Message      bool
	// External marks the effect as an external sink. Net effects are
	// external unless the destination is an internal channel.
	External bool
	// RefuseUntrusted: a gated value not derivable from trusted sources
	// refuses the effect at once instead of deferring it to the oracle
	// (policy key on_untrusted: refuse). For effects the agent makes on
	// its own that nobody should be asked about, such as the DNS lookups
	// of an agent's telemetry and update checks.
	RefuseUntrusted bool
}

// RoleSet is a set of roles as a bit mask.
type RoleSet uint16

// Has reports whether r is in the set.
func (s RoleSet) Has(r Role) bool { return s&(1<<r) != 0 }

// With returns the set with r added.
func (s RoleSet) With(r Role) RoleSet { return s | 1<<r }

// DefaultGate is the gated set when the policy says nothing: the
// integrity-critical roles.
const DefaultGate RoleSet = 1<<RoleTarget | 1<<RoleCredential | 1<<RoleCommand

// Policy is a compiled, immutable policy. Build it with ParsePolicy or
// LoadPolicy; never modify one after it is built (the engine publishes it
// through an atomic pointer and reads it without locks).
type Policy struct {
	Name   string   // file it came from
	Levels []string // ordered, lowest first

	TaskTrusted   bool     // the principal's task is a trusted source (T_0)
	TrustedValues []string // declared trusted values, normalised
	Trusted       []Source
	Sensitive     []SensitiveSource
	Parties       []Party
	Refuse        []RefuseRule
	Internal      []Party // internal channels (the model provider): released and logged
	Operations    []OpSpec
	DefaultOp     OpSpec // applies when no operation matches

	// Principal lists the principal's own identities (trusted.principal:
	// the account owner's address, account or handle), normalised: an
	// item of a list value that T otherwise derives (classes.go).
	Principal []string

	// Fields mark fields of sources' structured output as trusted or
	// untrusted (policy section fields:, fieldtrust.go), in file order.
	Fields []FieldRule

	// UnknownPartyDefer: an effect to a party the policy does not name is
	// deferred even when its values are trusted (Kairos). When false, an
	// unnamed party has the lowest clearance.
	UnknownPartyDefer bool

	// Credentials are the secrets handed to the agent and the
	// destinations each is bound to (credentials.go). Their values are
	// not part of the policy file: WithCredentials binds them for a run.
	Credentials []Credential
	creds       *credentialSet // the bound values; nil: none
	nameCheck   NameCheck      // confirms destination names for the bindings; nil: taken as given

	// Intercept is the intercept section: which TLS ports are
	// intercepted, which server names pass through opaque, and what a
	// client that refuses carbd's CA gets (policy_intercept.go).
	Intercept InterceptPolicy
}

// LevelName returns the name of a level.
func (p *Policy) LevelName(l Level) string {
	if int(l) < len(p.Levels) {
		return p.Levels[l]
	}
	return "level?"
}

// TopLevel is the highest declared level: the clearance of the mediated state.
func (p *Policy) TopLevel() Level {
	if len(p.Levels) == 0 {
		return 0
	}
	return Level(len(p.Levels) - 1)
}

// MatchRefuse returns the first explicit refuse rule that matches ev.
func (p *Policy) MatchRefuse(ev *Event) (*RefuseRule, bool) {
	for i := range p.Refuse {
		if p.Refuse[i].Match(ev) {
			return &p.Refuse[i], true
		}
	}
	return nil, false
}

// SourceLabel returns the label of an incoming event's source: trusted if
// a trusted source declares it, and the join of the levels of every
// sensitive source that matches it. A ctrl event from the principal is
// trusted when the policy trusts the task.
func (p *Policy) SourceLabel(ev *Event) Label {
	var l Label
	if ev.Ch == ChanCtrl {
		if p.TaskTrusted {
			l.Integrity = Trusted
		}
		return l
	}
	for i := range p.Trusted {
		if p.Trusted[i].Match(ev) {
			l.Integrity = Trusted
			break
		}
	}
	for i := range p.Sensitive {
		if p.Sensitive[i].Match(ev) {
			l.Level = l.Level.Join(p.Sensitive[i].Level)
		}
	}
	return l
}

// Operation returns the spec of the first operation entry matching op, or
// the default.
func (p *Policy) Operation(op string) *OpSpec {
	for i := range p.Operations {
		if matchAny(p.Operations[i].Ops, op) {
			return &p.Operations[i]
		}
	}
	return &p.DefaultOp
}

// InternalChannel returns the internal channel the effect goes to, if any.
func (p *Policy) InternalChannel(ev *Event) (*Party, bool) {
	for i := range p.Internal {
		if p.Internal[i].matches(ev, "") {
			return &p.Internal[i], true
		}
	}
	return nil, false
}

// Party returns the named party an outgoing effect goes to. dest is the
// value of the operation's destination field, if it has one.
func (p *Policy) Party(ev *Event, dest string) (*Party, bool) {
	for i := range p.Parties {
		if p.Parties[i].matches(ev, dest) {
			return &p.Parties[i], true
		}
	}
	return nil, false
}

func (pt *Party) matches(ev *Event, dest string) bool {
	if names, ok := dnsNames(ev); ok {
		// A lookup of a party's name belongs to the party whatever ports
		// it lists: ports restrict the party's traffic, not the lookup
		// that precedes it. Every name the query asks about must match.
		for _, n := range names {
			if !matchAny(pt.Endpoint.Hosts, strings.ToLower(strings.TrimSuffix(n, "."))) {
				return false
			}
		}
		return true
	}
	if ev.Ch == ChanNet && pt.Endpoint.Match(ev.Dest) {
		return true
	}
	if dest != "" {
		nd := Norm(dest)
		for _, g := range pt.Objects {
			if g.Match(nd) {
				return true
			}
		}
	}
	return ev.Ch != ChanFile && matchAny(pt.Objects, ev.Obj)
}

// OpDNSQuery is the operation of a DNS query (pkg/hooks/netparse).
const OpDNSQuery = "dns:query"

// fieldQName is the field holding a DNS query's name, one per question.
const fieldQName = "qname"

// dnsNames returns the names a DNS query asks about: its qname fields,
// or its destination's host when it has none.
func dnsNames(ev *Event) ([]string, bool) {
	if ev.Ch != ChanNet || ev.Op != OpDNSQuery {
		return nil, false
	}
	var names []string
	for _, f := range ev.Fields {
		if f.Name == fieldQName {
			names = append(names, f.Value)
		}
	}
	if len(names) == 0 && ev.Dest != nil && ev.Dest.Host != "" {
		names = append(names, ev.Dest.Host)
	}
	return names, len(names) > 0
}
