package decide

import (
	"fmt"
	"strings"

	"github.com/carbd/carbd/pkg/decide/match"
)

// opSpec returns the policy's spec for an operation, cached per policy.
func (e *Engine) opSpec(p *Policy, op string) *OpSpec {
	if s, ok := e.opCache[op]; ok {
		return s
	}
	s := p.Operation(op)
	if len(e.opCache) < 4096 {
		e.opCache[op] = s
	}
	return s
}

// effectKind is the kind of an effect: what the hook said, else the
// policy's operation table, else stageable for files and blocking for the
// rest (a request is assumed to need its response).
func effectKind(ev *Event, spec *OpSpec) Kind {
	if ev.Kind != KindUnset {
		return ev.Kind
	}
	if spec.Kind != KindUnset {
		return spec.Kind
	}
	if ev.Ch == ChanFile {
		return Stageable
	}
	return Blocking
}

// evaluate answers the policy's three questions for an outgoing effect
// (Kairos §III-C): an explicit refuse rule refuses; every gated value
// derivable from T_{i-1} and the sensitivity join of S_{i-1} tokens in the
// effect within the destination's clearance releases; anything else
// defers. It changes no state.
func (e *Engine) evaluate(p *Policy, ev *Event) Decision {
	spec := e.opSpec(p, ev.Op)
	d := Decision{Seq: ev.Seq, Kind: effectKind(ev, spec)}
	if ev.Dir != Out {
		d.Verdict, d.Layer = Refuse, LayerProvenance
		d.Reason = Reason{Code: CodeMalformed}
		d.Justification = "not an outgoing event"
		return d
	}
	// Field roles: the operation table overrides what the hook supplied.
	if len(spec.Roles) > 0 {
		fs := make([]Field, len(ev.Fields))
		copy(fs, ev.Fields)
		for i := range fs {
			if r, ok := spec.Roles[fs[i].Name]; ok {
				fs[i].Role = r
			}
		}
		ev.Fields = fs
	}

	// The operator's rules and the credentials' bindings are decided on
	// the effect as it is; then every credential value in it is replaced
	// by its marker ($NAME), so that no record of the effect (audit,
	// status, the oracle's view, notices) holds a value. The rest of the
	// pipeline sees the markers: a second evaluation of the same event
	// (after a scope resolution) decides the same.
	rule, refused := p.MatchRefuse(ev)
	carried, unbound := p.credentialCheck(ev, spec)
	if len(carried) > 0 {
		p.creds.redactEvent(ev)
	}
	d.Fields = ev.Fields

	// 1. An explicit rule of the operator.
	if refused {
		d.Verdict, d.Layer, d.Policy = Refuse, LayerRule, Refuse
		d.Reason = Reason{Code: CodeRefuseRule, Rule: rule.Name}
		d.Justification = fmt.Sprintf("refused by the operator's rule %q", rule.Name)
		return d
	}
	// A credential handed to the agent goes only where it is bound
	// (Guarantee 7), whatever the other checks say.
	if unbound != "" {
		d.Verdict, d.Layer, d.Policy = Refuse, LayerRule, Refuse
		d.Reason = Reason{Code: CodeCredential, Rule: unbound, Value: clip(destName(ev, spec), 200)}
		where := "which no party may receive"
		if w := p.credentialWhere(unbound); w != "" {
			where = "which may be sent only to " + w
		}
		d.Justification = fmt.Sprintf("carries the credential %s, %s; %s is not bound to it",
			CredentialMarker(unbound), where, credentialDest(ev, spec))
		return d
	}
	// Internal channels (the model provider) are released and logged.
	if ev.Ch == ChanNet {
		if in, ok := p.InternalChannel(ev); ok {
			d.Verdict, d.Layer, d.Policy = Release, LayerInternal, Release
			d.Reason = Reason{Code: CodeInternal, Rule: in.Name}
			d.Justification = fmt.Sprintf("internal channel %q: released and logged", in.Name)
			return d
		}
	}
	// Results returned to the principal are not held: their harm lies in
	// the response text, outside the threat model.
	if ev.Ch == ChanCtrl {
		d.Verdict, d.Layer, d.Policy = Release, LayerProvenance, Release
		d.Reason = Reason{Code: CodeTrusted}
		d.Justification = "result returned to the principal"
		return d
	}

	// 2. Every gated value derivable from T_{i-1}: the fields of gated
	// roles and the destinations embedded in content (subfields.go).
	var buf [8]gatedItem
	for _, it := range e.gatedItems(buf[:0], spec, ev.Fields) {
		if !e.derivableItem(it) && !p.boundCredentialItem(it, ev, spec) {
			d.Verdict, d.Layer, d.Policy = Defer, LayerProvenance, Defer
			if spec.RefuseUntrusted {
				d.Verdict, d.Policy = Refuse, Refuse
			}
			d.Reason = Reason{Code: CodeUntrustedValue, Field: it.Field, Role: it.Role, Value: clip(it.Value, 200), Origin: e.originName(it.Value)}
			what := "in field " + it.Field
			if it.embedded {
				what = "embedded in field " + it.Field[:strings.IndexByte(it.Field, '[')]
			}
			d.Justification = fmt.Sprintf("%s %q %s is not derivable from trusted sources: %s",
				it.Role, clip(it.Value, 80), what, e.originPhrase(it.Value))
			e.alsoUncleared(p, ev, spec, &d)
			return d
		}
	}

	return e.clearanceCheck(p, ev, spec, d)
}

// alsoUncleared adds to a decision deferred for an untrusted value the
// clearance question's answer when it defers too, with its evidence
// (which sensitive value, read from where): whoever answers sees every
// reason, not only the first.
func (e *Engine) alsoUncleared(p *Policy, ev *Event, spec *OpSpec, d *Decision) {
	d.Also = nil
	if c := e.clearanceCheck(p, ev, spec, Decision{}); c.Verdict == Defer && c.Reason.Code == CodeUncleared {
		d.Also = append(d.Also, c.Reason)
		d.Justification += "; it also " + c.Justification
	}
}

// clearanceCheck is the third question: the data the effect carries is
// cleared for its destination.
func (e *Engine) clearanceCheck(p *Policy, ev *Event, spec *OpSpec, d Decision) Decision {
	clearance, party, known := e.clearance(p, ev, spec)
	level, tok, tokOrigin := e.sensitivity(p, ev, spec)
	if !known && p.UnknownPartyDefer {
		d.Verdict, d.Layer, d.Policy = Defer, LayerProvenance, Defer
		d.Reason = Reason{Code: CodeUnknownParty, Value: clip(destName(ev, spec), 200)}
		d.Justification = fmt.Sprintf("destination %q is not a party the policy names", clip(destName(ev, spec), 80))
		return d
	}
	if level > clearance {
		d.Verdict, d.Layer, d.Policy = Defer, LayerProvenance, Defer
		d.Reason = Reason{Code: CodeUncleared, Level: p.LevelName(level), Clearance: p.LevelName(clearance),
			Party: party, Token: clip(tok, 40), TokenFrom: tokOrigin}
		what := "carries " + p.LevelName(level) + " data"
		if tok != "" {
			what += fmt.Sprintf(" (%q read from %s)", clip(tok, 24), tokOrigin)
		} else if ev.Opaque {
			what += " (opaque content may carry anything read so far)"
		} else if packedContent(ev) {
			what += " (compressed or archived content may carry anything read so far)"
		}
		d.Justification = fmt.Sprintf("%s but %s is cleared only for %s", what, partyOr(party), p.LevelName(clearance))
		return d
	}
	d.Verdict, d.Layer, d.Policy = Release, LayerProvenance, Release
	d.Reason = Reason{Code: CodeTrusted, Level: p.LevelName(level), Clearance: p.LevelName(clearance), Party: party}
	d.Justification = e.releases.text(p, level, clearance, party)
	return d
}

func partyOr(party string) string {
	if party == "" {
		return "an unnamed destination"
	}
	return party
}

// destName is the destination of an effect in words.
func destName(ev *Event, spec *OpSpec) string {
	if spec.DestField != "" {
		for _, f := range ev.Fields {
			if f.Name == spec.DestField {
				return f.Value
			}
		}
	}
	if ev.Dest != nil {
		if ev.Dest.Host != "" {
			return ev.Dest.Host
		}
		if ev.Dest.Addr.IsValid() {
			return ev.Dest.Addr.String()
		}
	}
	return ev.Obj
}

// derivable is D(x, T): x equals a trusted value after normalisation. A
// list value (newline, comma or semicolon separated) is derivable when
// each of its items is.
func (e *Engine) derivable(x string) bool {
	if e.trusted.Contains(x) {
		return true
	}
	if !strings.ContainsAny(x, "\n,;") {
		return false
	}
	n := 0
	for _, part := range strings.FieldsFunc(x, func(r rune) bool { return r == '\n' || r == ',' || r == ';' }) {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if !e.trusted.Contains(part) {
			return false
		}
		n++
	}
	return n > 0
}

// originOf names where an untrusted value was first seen, if anywhere.
// A value never seen whole is attributed through a part of it only when
// that part names something by itself (a host, an address, a path: it
// has a dot, an @, a slash or a colon); a common word it shares with
// some text is no origin (paste.example.net was not "supplied by" a file
// that mentions status.example.org). part is "" for the whole value.
func (e *Engine) originOf(x string) (origin, part string) {
	if o, ok := e.untrusted.Origin(x); ok {
		return o, ""
	}
	for _, v := range match.Extract(x) {
		if v == x || !strings.ContainsAny(v, ".@/:") {
			continue
		}
		if o, ok := e.untrusted.Origin(v); ok {
			return o, v
		}
	}
	return "", ""
}

// originName is the origin recorded in a reason: where the value, or the
// part of it that names something, was first seen.
func (e *Engine) originName(x string) string {
	o, _ := e.originOf(x)
	return o
}

// originPhrase states a value's provenance as an origin, not a label: a
// language model reads "untrusted" as a verdict (Kairos §III-D).
func (e *Engine) originPhrase(x string) string {
	switch o, part := e.originOf(x); {
	case o == "":
		return "not in the user's message or any trusted source (produced by the agent)"
	case part != "":
		return fmt.Sprintf("not supplied whole by any source; its part %q was supplied by %s, not by the user's message", clip(part, 80), o)
	default:
		return "supplied by " + o + ", not by the user's message"
	}
}

// clearance returns the clearance of an effect's destination, the party's
// name, and whether the destination is known. Locations of the mediated
// state carry the highest clearance: data written there keeps its label.
func (e *Engine) clearance(p *Policy, ev *Event, spec *OpSpec) (Level, string, bool) {
	if ev.Ch == ChanFile {
		return p.TopLevel(), "the working directory", true
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
	if pt, ok := p.Party(ev, dest); ok {
		return pt.Clearance, pt.Name, true
	}
	// The same location written another way (a scheme, "www.", a
	// trailing "/") is the same party, as in derivability (derive.go).
	if dest != "" && !e.opt.Ablate.Classes {
		for _, f := range urlForms(dest) {
			if pt, ok := p.Party(ev, f); ok {
				return pt.Clearance, pt.Name, true
			}
		}
	}
	return 0, "", false
}

// sensitivity is ℓ(e): the join of the levels of S tokens occurring
// anywhere in the effect (object, fields, content). An opaque effect may
// carry anything read so far, and every credential handed to the agent
// that is not bound to its destination. Three kinds of hits are not data the effect
// carries (docs/provenance.md, "What counts as carried data"):
//
//   - the destination's own identity: an item of the destination field
//     (a recipient, an account, a participant) that is derivable from T or
//     is itself, whole, a sensitive token — the address an e-mail is sent
//     to, or the IBAN a payment goes to, is where the effect goes, and
//     only its owner learns it;
//   - tokens the principal's task itself contains: the user supplied them;
//   - tokens that are not distinctive (match.Distinctive): ordinary words
//     and field names read from a sensitive source.
func (e *Engine) sensitivity(p *Policy, ev *Event, spec *OpSpec) (Level, string, string) {
	var best Level
	var tok, origin string
	normTask, taskDone := "", false
	idents := e.destIdentities(ev, spec)
	blank := func(s string) string {
		for _, it := range idents {
			s = strings.ReplaceAll(s, it, " ")
		}
		return s
	}
	var credLevel Level // credentials not bound to the destination an opaque effect may carry
	if ev.Opaque || packedContent(ev) {
		credLevel = p.credentialLevel(ev, spec)
	}
	if e.sens.Len() == 0 {
		return credLevel, "", ""
	}
	scan := func(s string) {
		if s == "" {
			return
		}
		if len(idents) > 0 {
			s = blank(s)
		}
		// Most effects carry no sensitive token: the allocation-free
		// check first, the hits only when there are some.
		if _, found := e.sens.MaxLevel(s); !found {
			return
		}
		_, hits := e.sens.Scan(s)
		for _, h := range hits {
			lv := Level(h.Level)
			if (lv <= best && tok != "") || (!e.opt.Ablate.Distinctive && !e.distinctive(h.Token)) {
				continue
			}
			if !taskDone && !e.opt.Ablate.TaskTokens {
				normTask, taskDone = e.normTask(), true
			}
			if e.isTaskToken(h.Token, normTask) {
				continue
			}
			best, tok, origin = best.Join(lv), h.Token, h.Origin
		}
	}
	scan(ev.Obj)
	for _, f := range ev.Fields {
		if f.Value != ev.Content && f.Value != ev.Obj { // scanned with them
			scan(f.Value)
		}
	}
	scan(ev.Content)
	if (ev.Opaque || packedContent(ev)) && e.sensMax > best {
		best, tok, origin = e.sensMax, "", ""
	}
	if credLevel > best {
		best, tok, origin = credLevel, "", ""
	}
	return best, tok, origin
}

// distinctive is match.Distinctive; with the value classes switched off
// (Ablation.Classes), a time of day with four digits counts again, as it
// did before times of day were a class of their own.
func (e *Engine) distinctive(tok string) bool {
	if match.Distinctive(tok) {
		return true
	}
	if !e.opt.Ablate.Classes || !match.IsTimeOfDay(tok) {
		return false
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		if tok[i] >= '0' && tok[i] <= '9' {
			n++
		}
	}
	return n >= 4
}

// destIdentities returns the items of the effect's destination field that
// are the destination's identity: derivable from T, or equal, whole, to a
// sensitive token. Items shorter than match.MinTokenLen normalised bytes
// are no token and need no exclusion.
func (e *Engine) destIdentities(ev *Event, spec *OpSpec) []string {
	if spec.DestField == "" || e.opt.Ablate.Identity {
		return nil
	}
	var dest string
	for _, f := range ev.Fields {
		if f.Name == spec.DestField {
			dest = f.Value
			break
		}
	}
	if dest == "" {
		return nil
	}
	items := []string{strings.TrimSpace(dest)}
	if list, ok := e.listItems(dest); ok {
		items = list
	}
	var out []string
	for _, it := range items {
		n := match.Norm(it)
		if len(n) < match.MinTokenLen {
			continue
		}
		if e.derivableAs(RoleTarget, it) {
			out = append(out, it)
			continue
		}
		if e.sensIdentity(it, n) {
			out = append(out, it)
		}
	}
	return out
}

// sensIdentity reports whether a destination item (n: its Norm) is,
// whole, a sensitive token: the item itself, or the same location written
// another way (urlForms: "https://www.shop.example/" is the destination
// the token "shop.example" names).
func (e *Engine) sensIdentity(it, n string) bool {
	_, hits := e.sens.Scan(it)
	if len(hits) == 0 {
		return false
	}
	var forms []string
	if !e.opt.Ablate.Classes {
		forms = urlForms(it)
	}
	for _, h := range hits {
		if h.Token == n {
			return true
		}
		for _, f := range forms {
			if h.Token == match.Norm(f) {
				return true
			}
		}
	}
	return false
}

// credentialDest names an effect's destination for a credential refusal.
func credentialDest(ev *Event, spec *OpSpec) string {
	if ev.Ch == ChanFile {
		return "the working directory"
	}
	return fmt.Sprintf("%q", clip(destName(ev, spec), 80))
}
