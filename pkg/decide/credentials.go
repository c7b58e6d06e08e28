package decide

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/carbd/carbd/pkg/decide/match"
)

// Credential is a secret the operator hands the agent (carbd run --env)
// and the destinations it is bound to (Guarantee 7: a credential reaches
// only the parties it is bound to). An outgoing effect that carries its
// value anywhere (object, any field, content) to any other destination is
// refused, whatever the other checks say; the value is also a sensitive
// token at Level, so an opaque effect to a destination it is not bound
// to is treated as possibly carrying it.
type Credential struct {
	Name     string   // the environment variable's name
	Parties  []string // names of parties and internal channels that may receive it
	Endpoint Endpoint // destinations that may receive it, named directly
	Level    Level    // its sensitivity; the policy's top level unless given
}

// CredentialValue is the value of a credential for one run, with the
// destinations the command line binds it to besides the policy's.
type CredentialValue struct {
	Name  string
	Value string
	// Hosts are host globs, addresses or CIDRs (--env NAME=VALUE@host,host).
	// A match-everything glob ("*") makes the variable plain environment:
	// not a credential, never checked.
	Hosts []string
}

// MinCredentialLen is the shortest credential value, in bytes after
// Norm, that carbd can recognise in effects.
const MinCredentialLen = match.MinTokenLen

// CodeCredential is the reason code of an effect refused because it
// carries a credential to a destination the credential is not bound to.
const CodeCredential = "credential-unbound"

// credentialSet is what WithCredentials compiles: the values, indexed.
type credentialSet struct {
	idx    match.Index         // normalised values; origin: the first name given it
	byNorm map[string][]string // normalised value -> every credential name with it
	raw    map[string][]string // name -> raw values
	byName map[string]*Credential
	order  []namedValue // every raw value, longest first, for redaction
}

type namedValue struct{ name, value string }

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidEnvName reports whether s is a valid environment variable name.
func ValidEnvName(s string) bool { return envNameRE.MatchString(s) && len(s) <= 128 }

// CredentialMarker is what a credential's value is replaced with in
// every record carbd keeps of an effect (audit, status, summary, the
// oracle's view): "$NAME".
func CredentialMarker(name string) string { return "$" + name }

// WithCredentials returns a copy of the policy with the credentials'
// values bound. A value named in the policy's credentials section is
// bound to its destinations there plus the Hosts given with it; any
// other is bound to its Hosts only, or to nothing (then every effect
// carrying it is refused). A value that normalises to fewer than
// match.MinTokenLen bytes cannot be recognised in effects and is an
// error, unless it is plain environment ("*").
func (p *Policy) WithCredentials(vals []CredentialValue) (*Policy, error) {
	np := *p
	np.Credentials = slices.Clone(p.Credentials)
	set := &credentialSet{byNorm: map[string][]string{}, raw: map[string][]string{}, byName: map[string]*Credential{}}
	var errs []error
	for _, v := range vals {
		if !ValidEnvName(v.Name) {
			errs = append(errs, fmt.Errorf("decide: credential %q: not a valid environment variable name", v.Name))
			continue
		}
		plain := false
		var ep Endpoint
		for _, h := range v.Hosts {
			if globMatchesAll(h) {
				plain = true
				continue
			}
			if err := addBinding(&ep, h); err != nil {
				errs = append(errs, fmt.Errorf("decide: credential %s: %w", v.Name, err))
			}
		}
		if plain {
			continue
		}
		n := match.Norm(v.Value)
		if len(n) < match.MinTokenLen {
			errs = append(errs, fmt.Errorf("decide: credential %s: its value is shorter than %d characters and cannot be recognised in effects (pass it as plain environment with %s=VALUE@*)", v.Name, match.MinTokenLen, v.Name))
			continue
		}
		i := slices.IndexFunc(np.Credentials, func(c Credential) bool { return c.Name == v.Name })
		if i < 0 {
			np.Credentials = append(np.Credentials, Credential{Name: v.Name, Level: p.TopLevel()})
			i = len(np.Credentials) - 1
		}
		c := &np.Credentials[i]
		c.Endpoint.Hosts = append(slices.Clone(c.Endpoint.Hosts), ep.Hosts...)
		c.Endpoint.Prefixes = append(slices.Clone(c.Endpoint.Prefixes), ep.Prefixes...)
		set.idx.Add(v.Name, uint8(c.Level), n)
		if !slices.Contains(set.byNorm[n], v.Name) {
			set.byNorm[n] = append(set.byNorm[n], v.Name)
		}
		set.raw[v.Name] = append(set.raw[v.Name], v.Value)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i := range np.Credentials {
		set.byName[np.Credentials[i].Name] = &np.Credentials[i]
	}
	for name, vs := range set.raw {
		for _, v := range vs {
			set.order = append(set.order, namedValue{name, v})
		}
	}
	slices.SortFunc(set.order, func(a, b namedValue) int {
		if len(a.value) != len(b.value) {
			return len(b.value) - len(a.value)
		}
		return strings.Compare(a.name, b.name)
	})
	if set.idx.Len() > 0 {
		np.creds = set
	} else {
		np.creds = nil
	}
	return &np, nil
}

// addBinding adds a host glob, an address or a CIDR to ep.
func addBinding(ep *Endpoint, s string) error {
	if a, err := netip.ParseAddr(s); err == nil {
		ep.Prefixes = append(ep.Prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		return nil
	}
	if pf, err := netip.ParsePrefix(s); err == nil {
		ep.Prefixes = append(ep.Prefixes, pf.Masked())
		return nil
	}
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if h == "" {
		return errors.New("empty host")
	}
	if strings.HasSuffix(h, ".") || strings.Contains(h, "..") {
		return fmt.Errorf("%q has an empty label", s)
	}
	for _, r := range h {
		if !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || strings.ContainsRune("-._*?[]{}", r)) {
			return fmt.Errorf("%q is not a host name, address or CIDR", s)
		}
	}
	if !doublestar.ValidatePattern(h) {
		return fmt.Errorf("%q is not a valid host glob", s)
	}
	ep.Hosts = append(ep.Hosts, NewGlob(h))
	return nil
}

// CredentialNames returns the names of the credentials bound for this
// run, in policy order.
func (p *Policy) CredentialNames() []string {
	if p.creds == nil {
		return nil
	}
	var out []string
	for _, c := range p.Credentials {
		if _, ok := p.creds.raw[c.Name]; ok {
			out = append(out, c.Name)
		}
	}
	return out
}

// Redact replaces every bound credential value in s with its marker
// ($NAME). A value written with other case or whitespace inside (the
// scan's normalisation) replaces the whole of s with the markers.
func (p *Policy) Redact(s string) string {
	if p.creds == nil || s == "" {
		return s
	}
	return p.creds.redact(s)
}

func (cs *credentialSet) redact(s string) string {
	if _, found := cs.idx.MaxLevel(s); !found {
		return s
	}
	for _, nv := range cs.order {
		s = strings.ReplaceAll(s, nv.value, CredentialMarker(nv.name))
	}
	if _, hits := cs.idx.Scan(s); len(hits) > 0 {
		var ms []string
		for _, h := range hits {
			for _, n := range cs.byNorm[h.Token] {
				ms = append(ms, CredentialMarker(n))
			}
		}
		return strings.Join(ms, " ")
	}
	return s
}

// basicCredentials returns the decoded user:password of an HTTP Basic
// authorization value, if it is one.
func basicCredentials(v string) (string, bool) {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// carried returns the names of the credentials whose values an effect
// carries: in its object, any field (and the decoded user:password of a
// Basic authorization), or its content, after match.Norm.
func (cs *credentialSet) carried(ev *Event) []string {
	var names []string
	scan := func(s string) {
		if s == "" {
			return
		}
		if _, found := cs.idx.MaxLevel(s); !found {
			return
		}
		_, hits := cs.idx.Scan(s)
		for _, h := range hits {
			for _, n := range cs.byNorm[h.Token] {
				if !slices.Contains(names, n) {
					names = append(names, n)
				}
			}
		}
	}
	scan(ev.Obj)
	for _, f := range ev.Fields {
		scan(f.Value)
		if f.Role == RoleCredential {
			if up, ok := basicCredentials(f.Value); ok {
				scan(up)
			}
		}
	}
	scan(ev.Content)
	return names
}

// redactEvent replaces the credential values ev carries by their markers,
// in place (the fields are copied first: the caller's slice is shared).
func (cs *credentialSet) redactEvent(ev *Event) {
	ev.Obj = cs.redact(ev.Obj)
	ev.Content = cs.redact(ev.Content)
	if ev.Dest != nil && ev.Dest.Host != "" {
		if h := cs.redact(ev.Dest.Host); h != ev.Dest.Host {
			d := *ev.Dest
			d.Host = h
			ev.Dest = &d
		}
	}
	fs := make([]Field, len(ev.Fields))
	copy(fs, ev.Fields)
	for i := range fs {
		if fs[i].Role == RoleCredential {
			if up, ok := basicCredentials(fs[i].Value); ok {
				if r := cs.redact(up); r != up {
					fs[i].Value = "Basic " + r
					continue
				}
			}
		}
		fs[i].Value = cs.redact(fs[i].Value)
	}
	ev.Fields = fs
}

// NameCheck reports whether the sandbox's resolver answered host with
// addr: only then is a destination's name (an HTTP Host header, a TLS
// SNI) the name of the address the effect goes to.
type NameCheck func(host string, addr netip.Addr) bool

// WithNameCheck returns a copy of the policy whose credential bindings
// trust a destination's name only when check confirms it for the
// destination's address, or when the effect is intercepted HTTPS (its
// url is https://: the upstream certificate was verified for the name).
// Otherwise the destination is matched by its address alone, so a Host
// header or an SNI naming a bound host cannot carry a credential to
// another address. Without a check, names are taken as given.
func (p *Policy) WithNameCheck(check NameCheck) *Policy {
	np := *p
	np.nameCheck = check
	return &np
}

// nameAuthentic reports whether ev's destination name may be trusted
// for the credential bindings (see WithNameCheck).
func (p *Policy) nameAuthentic(ev *Event) bool {
	d := ev.Dest
	if p.nameCheck == nil || d == nil || d.Host == "" || !d.Addr.IsValid() {
		return true
	}
	for _, f := range ev.Fields {
		if f.Name == "url" && strings.HasPrefix(f.Value, "https://") {
			return true
		}
	}
	return p.nameCheck(strings.ToLower(strings.TrimSuffix(d.Host, ".")), d.Addr.Unmap())
}

// credentialBound reports whether an effect's destination may receive
// the credential name: a net effect (or one with a destination field)
// whose destination matches the credential's endpoint, or whose party or
// internal channel it names. The working directory is no party: a write
// carrying a credential is never bound (the user's files would keep it).
func (p *Policy) credentialBound(name string, ev *Event, spec *OpSpec) bool {
	c := p.creds.byName[name]
	if c == nil || ev.Ch == ChanFile {
		return false
	}
	if _, dns := dnsNames(ev); ev.Ch == ChanNet && !dns && !p.nameAuthentic(ev) {
		// The name the guest gave is not its address's: match by address.
		cp := *ev
		d := *ev.Dest
		d.Host = ""
		cp.Dest = &d
		ev = &cp
	}
	if ev.Ch == ChanNet {
		if names, ok := dnsNames(ev); ok {
			all := len(c.Endpoint.Hosts) > 0
			for _, n := range names {
				all = all && matchAny(c.Endpoint.Hosts, strings.ToLower(strings.TrimSuffix(n, ".")))
			}
			if all {
				return true
			}
		} else if c.Endpoint.Match(ev.Dest) {
			return true
		}
	}
	if len(c.Parties) == 0 {
		return false
	}
	if in, ok := p.InternalChannel(ev); ok && slices.Contains(c.Parties, in.Name) {
		return true
	}
	var dest string
	if spec.DestField != "" {
		for _, f := range ev.Fields {
			if f.Name == spec.DestField {
				dest = f.Value
				break
			}
		}
	}
	pt, ok := p.Party(ev, dest)
	return ok && slices.Contains(c.Parties, pt.Name)
}

// credentialCheck decides the credentials an effect carries: refused when
// one goes to a destination it is not bound to. It returns the names
// carried (all bound, when ok).
func (p *Policy) credentialCheck(ev *Event, spec *OpSpec) (carried []string, unbound string) {
	if p.creds == nil || ev.Ch == ChanCtrl {
		return nil, ""
	}
	carried = p.creds.carried(ev)
	for _, name := range carried {
		if !p.credentialBound(name, ev, spec) {
			// A value shared by several credentials may go where any
			// of them is bound.
			shared := false
			for _, other := range p.creds.sharing(name) {
				shared = shared || (other != name && p.credentialBound(other, ev, spec))
			}
			if !shared {
				return carried, name
			}
		}
	}
	return carried, ""
}

// sharing returns every credential name that has one of name's values.
func (cs *credentialSet) sharing(name string) []string {
	var out []string
	for _, v := range cs.raw[name] {
		for _, n := range cs.byNorm[match.Norm(v)] {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// credentialWhere names a credential's destinations in words; empty
// when it has none.
func (p *Policy) credentialWhere(name string) string {
	c := p.creds.byName[name]
	if c == nil {
		return ""
	}
	var ws []string
	ws = append(ws, c.Parties...)
	for _, h := range c.Endpoint.Hosts {
		ws = append(ws, h.Pattern)
	}
	for _, pf := range c.Endpoint.Prefixes {
		ws = append(ws, pf.String())
	}
	return strings.Join(ws, ", ")
}

// boundCredentialItem reports whether a gated credential-role value is a
// credential bound to the effect's destination: its marker, alone or
// after an authorization scheme ("Bearer $NAME", "Basic user:$NAME"), as
// the redaction left it. The operator handed the value over for exactly
// this use. Only the marker is compared, so an effect evaluated again
// decides the same; an agent writing the marker itself sends no secret.
func (p *Policy) boundCredentialItem(it gatedItem, ev *Event, spec *OpSpec) bool {
	if it.Role != RoleCredential || p.creds == nil {
		return false
	}
	v := strings.TrimSpace(it.Value)
	if scheme, rest, ok := strings.Cut(v, " "); ok {
		switch strings.ToLower(scheme) {
		case "bearer", "token":
			v = strings.TrimSpace(rest)
		case "basic": // user:$NAME, as redactEvent writes it
			v = strings.TrimSpace(rest)
			if i := strings.LastIndexByte(v, ':'); i >= 0 {
				v = v[i+1:]
			}
		}
	}
	name, ok := strings.CutPrefix(v, "$")
	if !ok {
		return false
	}
	_, known := p.creds.raw[name]
	return known && p.credentialBound(name, ev, spec)
}

// credentialLevel is the sensitivity an opaque effect gets from the
// credentials: the join of the levels of those not bound to its
// destination (it may carry any of them).
func (p *Policy) credentialLevel(ev *Event, spec *OpSpec) Level {
	var l Level
	if p.creds == nil || !(ev.Opaque || packedContent(ev)) {
		return 0
	}
	for name := range p.creds.raw {
		if c := p.creds.byName[name]; c != nil && c.Level > l && !p.credentialBound(name, ev, spec) {
			l = c.Level
		}
	}
	return l
}
