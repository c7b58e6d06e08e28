package decide

import (
	"fmt"
	"math"
	"strings"

	"github.com/carbd/carbd/pkg/decide/match"
	"github.com/carbd/carbd/pkg/decide/score"
)

// applyCRC is step 4 of the pipeline (role-stratified CRC, Eq. 5 and
// Algorithm 1's enforcement): for an effect the provenance check deferred
// because gated values are not derivable from T, each such field is scored
// (sim to the untrusted context minus sim to the trusted prompt) and
// compared with its role's calibrated threshold. A field at or under its
// threshold is allowed; one over it is reverted to the trusted value it
// resembles (revertValue: a near copy, never a different value) when the
// channel can rewrite effects and such a value exists, else the effect
// stays deferred. An embedded target (subfields.go) has no calibrated
// threshold: it is never allowed on a score and never reverted. When
// every such field passes, the clearance question is asked as before: CRC
// never vouches for confidentiality. It returns the new decision, or d
// unchanged.
func (e *Engine) applyCRC(p *Policy, ev *Event, spec *OpSpec, d Decision) Decision {
	cal := e.opt.Calibration
	if cal == nil || d.Verdict != Defer || d.Reason.Code != CodeUntrustedValue {
		return d
	}
	kind := score.Kind(cal.Score)
	fields := ev.Fields
	var reverts []Revert
	var worst Reason
	worstEmbedded := false
	lookalikeOf, lookalikeItem := "", ""
	var buf [8]gatedItem
	for _, it := range e.gatedItems(buf[:0], spec, ev.Fields) {
		if e.derivableItem(it) {
			continue
		}
		if it.embedded {
			// No calibrated population: never allowed on a score, never
			// reverted (subfields.go).
			worst = Reason{Code: CodeCRCOver, Field: it.Field, Role: it.Role, Value: clip(it.Value, 200), Origin: e.originName(it.Value),
				Score: score.Score(kind, it.Value, &e.uctx, &e.tctx), Threshold: math.Inf(-1)}
			worstEmbedded = true
			break
		}
		f := ev.Fields[it.index]
		s := e.fieldScore(kind, f.Role, f.Value)
		tau, ok := cal.Threshold[f.Role]
		like, likeItem := "", ""
		if f.Role == RoleTarget && !e.opt.Ablate.Classes {
			// A look-alike of a trusted host is never allowed on its
			// score (classes.go); it may still be reverted to the
			// trusted value it copies.
			like, likeItem = e.lookalikeItem(f.Value)
		}
		if ok && s <= tau && like == "" {
			continue
		}
		if !ok {
			tau = math.Inf(-1)
		}
		if e.opt.Revert {
			if to, ok := e.revertValue(f); ok {
				if len(reverts) == 0 {
					fields = append([]Field(nil), ev.Fields...)
				}
				fields[it.index].Value = to
				reverts = append(reverts, Revert{Field: f.Name, Role: f.Role, From: f.Value, To: to, Score: s})
				continue
			}
		}
		worst = Reason{Code: CodeCRCOver, Field: f.Name, Role: f.Role, Value: clip(f.Value, 200), Origin: e.originName(f.Value), Score: s, Threshold: tau}
		lookalikeOf, lookalikeItem = like, likeItem
		break
	}
	if worst.Code != "" {
		d.Layer = LayerCRC
		d.Reason = worst
		stratum := cal.Stratum[worst.Role]
		if stratum == "" || worstEmbedded {
			stratum = "uncalibrated"
		}
		d.Justification = fmt.Sprintf("%s %q in field %s scored %.3f over its %s threshold %.3f and no trusted value can replace it: %s",
			worst.Role, clip(worst.Value, 80), worst.Field, worst.Score, stratum, worst.Threshold, e.originPhrase(worst.Value))
		if lookalikeOf != "" {
			d.Justification = fmt.Sprintf("%s %q in field %s names %q, a look-alike of the trusted host %q: gated whatever its score (%.3f): %s",
				worst.Role, clip(worst.Value, 80), worst.Field, clip(lookalikeItem, 80), lookalikeOf, worst.Score, e.originPhrase(worst.Value))
		}
		e.alsoUncleared(p, ev, spec, &d)
		return d
	}
	rev := *ev
	rev.Fields = fields
	nd := e.clearanceCheck(p, &rev, spec, Decision{Seq: d.Seq, Kind: d.Kind, Fields: fields})
	nd.Policy = Defer
	if nd.Verdict != Release {
		return nd
	}
	nd.Layer = LayerCRC
	nd.Reverts = reverts
	if len(reverts) > 0 {
		nd.Reason.Code = CodeCRCReverted
		parts := make([]string, len(reverts))
		for i, r := range reverts {
			parts[i] = fmt.Sprintf("%s %q -> %q (score %.3f)", r.Field, clip(r.From, 40), clip(r.To, 40), r.Score)
		}
		nd.Justification = "gated values over their calibrated thresholds were reverted to trusted values: " + strings.Join(parts, ", ")
	} else {
		nd.Reason.Code = CodeCRCAllowed
		nd.Justification = "gated values not derivable from trusted sources scored within their calibrated per-role thresholds; data cleared for " + partyOr(nd.Reason.Party)
	}
	return nd
}

// scoreFields scores every field of an effect that has a value with the
// kind of Options.Score, against the contexts as they stand before the
// effect, and says whether provenance would let it through (derivable).
func (e *Engine) scoreFields(p *Policy, ev *Event) []FieldScore {
	kind := score.Kind(e.opt.Score)
	gate := e.opSpec(p, ev.Op).Gate
	out := make([]FieldScore, 0, len(ev.Fields))
	for _, f := range ev.Fields {
		if f.Value == "" {
			continue
		}
		out = append(out, FieldScore{Field: f.Name, Role: f.Role, Gated: gate.Has(f.Role),
			Score: e.fieldScore(kind, f.Role, f.Value), Derivable: e.derivableAs(f.Role, f.Value)})
	}
	return out
}

// RevertMinSimilarity is the least character-trigram similarity (Jaccard,
// after Norm) between a field's value and the trusted value it is
// reverted to. A revert corrects a value the agent evidently meant to be
// a trusted one (a typo, an obfuscated copy: "alice@examp1e.com"); below
// this similarity the trusted value is a different value, and replacing
// the field would make the effect do something nobody asked for, so the
// effect is deferred instead.
const RevertMinSimilarity = 0.5

// revertValue picks the trusted value a field most resembles for its
// role: among values of T with the same shape (e-mail address, URL, IBAN,
// host name, other), the one with the highest character-trigram overlap,
// if that overlap is at least RevertMinSimilarity. Only target and
// credential fields are reverted, and never numbers or dates: a different
// number or date is a different effect, however alike the digits look.
// It reports false when no trusted value qualifies.
func (e *Engine) revertValue(f Field) (string, bool) {
	if e.opt.Ablate.Revert {
		return e.revertAnyValue(f)
	}
	if f.Role != RoleTarget && f.Role != RoleCredential {
		return "", false
	}
	want := shapeOf(f.Value)
	if want == shapeNumber || len(parseDates(f.Value)) > 0 {
		return "", false
	}
	nv := match.Norm(f.Value)
	best, bestSim := "", -1.0
	for v := range e.trusted.All() {
		if shapeOf(v) != want {
			continue
		}
		if s := trigramSim(nv, v); s > bestSim {
			best, bestSim = v, s
		}
	}
	return best, bestSim >= RevertMinSimilarity
}

// revertAnyValue is revertValue without its limits (Ablation.Revert):
// the most similar trusted value of the same shape, at any similarity,
// for any role.
func (e *Engine) revertAnyValue(f Field) (string, bool) {
	want := shapeOf(f.Value)
	best, bestSim := "", -1.0
	for v := range e.trusted.All() {
		if shapeOf(v) != want {
			continue
		}
		if s := trigramSim(match.Norm(f.Value), v); s > bestSim {
			best, bestSim = v, s
		}
	}
	return best, bestSim >= 0
}

type shape uint8

const (
	shapeOther shape = iota
	shapeEmail
	shapeURL
	shapeIBAN
	shapeHost
	shapeNumber
)

func shapeOf(v string) shape {
	v = match.Norm(v)
	switch {
	case strings.Contains(v, "://"):
		return shapeURL
	case strings.Count(v, "@") == 1 && strings.Contains(v[strings.IndexByte(v, '@'):], "."):
		return shapeEmail
	case isIBAN(v):
		return shapeIBAN
	case isNumber(v):
		return shapeNumber
	case strings.Contains(v, ".") && !strings.ContainsAny(v, "/ ") && strings.IndexFunc(v, func(r rune) bool { return !(r == '.' || r == '-' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') }) < 0:
		return shapeHost
	}
	return shapeOther
}

func isIBAN(v string) bool {
	if len(v) < 15 || len(v) > 34 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case i < 2 && !(c >= 'a' && c <= 'z'):
			return false
		case i >= 2 && i < 4 && !(c >= '0' && c <= '9'):
			return false
		case !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9'):
			return false
		}
	}
	return true
}

func isNumber(v string) bool {
	if v == "" {
		return false
	}
	digits := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' || c == ',' || c == '-' || c == '+':
		default:
			return false
		}
	}
	return digits > 0
}

// trigramSim is the Jaccard overlap of the byte trigrams of two
// normalised values.
func trigramSim(a, b string) float64 {
	if len(a) < 3 || len(b) < 3 {
		if a == b {
			return 1
		}
		return 0
	}
	ga := map[string]bool{}
	for i := 0; i+3 <= len(a); i++ {
		ga[a[i:i+3]] = true
	}
	inter, seen := 0, map[string]bool{}
	for i := 0; i+3 <= len(b); i++ {
		g := b[i : i+3]
		if seen[g] {
			continue
		}
		seen[g] = true
		if ga[g] {
			inter++
		}
	}
	return float64(inter) / float64(len(ga)+len(seen)-inter)
}
