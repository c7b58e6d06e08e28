package decide

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/carbd/carbd/pkg/decide/match"
	"github.com/carbd/carbd/pkg/decide/score"
)

// Value classes (docs/provenance.md, "Value classes"): kinds of values
// whose meaning the policy's questions must see through. Times of day are
// not distinctive tokens (match.Distinctive); the rest is here and in
// derive.go and evaluate.go. Ablation.Classes switches them off.

// listItems returns the items of a list value: a JSON array of scalars
// (["a@x.org", "b@y.org"]), or a value separated by newlines, commas or
// semicolons; empty items are dropped. It reports false for a value that
// is no list.
func (e *Engine) listItems(x string) ([]string, bool) {
	if !e.opt.Ablate.Classes {
		if items, ok := jsonList(x); ok {
			return items, true
		}
	}
	if !isListValue(x) {
		return nil, false
	}
	return splitList(x), true
}

// jsonList returns the items of a JSON array of strings, numbers or
// booleans, written as such.
func jsonList(x string) ([]string, bool) {
	t := strings.TrimSpace(x)
	if len(t) < 2 || t[0] != '[' || t[len(t)-1] != ']' {
		return nil, false
	}
	var raw []any
	if err := json.Unmarshal([]byte(t), &raw); err != nil {
		return nil, false
	}
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		switch v := v.(type) {
		case string:
			if v = strings.TrimSpace(v); v != "" {
				out = append(out, v)
			}
		case float64:
			out = append(out, strconv.FormatFloat(v, 'f', -1, 64))
		case bool:
			out = append(out, strconv.FormatBool(v))
		default:
			return nil, false
		}
	}
	return out, true
}

// fieldScore is a gated field's score as the CRC step compares it with
// its role's threshold: for a list value (recipients, participants), the
// highest score of its items that are not derivable from T, each scored
// alone; a derivable item (the user's colleague named in the task) says
// nothing about the others. A field passes when every such item does,
// which is the one comparison of this score with the threshold.
func (e *Engine) fieldScore(kind score.Kind, role Role, v string) float64 {
	items, ok := e.listItems(v)
	if !ok || e.opt.Ablate.Classes {
		return score.Score(kind, v, &e.uctx, &e.tctx)
	}
	best, n := math.Inf(-1), 0
	for _, it := range items {
		if e.derivableOne(role, it) || e.isPrincipal(it) {
			continue
		}
		best = max(best, score.Score(kind, it, &e.uctx, &e.tctx))
		n++
	}
	if n == 0 {
		return score.Score(kind, v, &e.uctx, &e.tctx)
	}
	return best
}

// isPrincipal reports whether x is one of the principal's own identities
// the policy declares (trusted.principal). A list value (recipients,
// participants) is derivable when every item is derivable from T or is
// the principal, and at least one item is derivable (derive.go): the
// principal on a list of people the task names adds no party to the
// effect. The principal alone is no such list: an effect addressed only
// to her is one an injection can use to reach her (a note to self with
// the attacker's words), so it needs T like any other destination.
func (e *Engine) isPrincipal(x string) bool {
	if e.opt.Ablate.Classes {
		return false
	}
	p := e.policy.Load()
	if len(p.Principal) == 0 {
		return false
	}
	n := match.Norm(x)
	for _, v := range p.Principal {
		if v == n {
			return true
		}
	}
	return false
}

// LookalikeMinContainment is the least fraction of a trusted host name's
// character trigrams that a different host name must contain to be its
// look-alike (lookalike): one inserted word ("informations.com" ->
// "true-informations.com") keeps all of them, one changed letter most.
// Two names that share only a common word and a top-level domain
// ("own-example.com", "info.example.net") keep about half.
const LookalikeMinContainment = 0.75

// lookalikeMinGrams is the fewest trigrams a trusted host name needs to
// have look-alikes: a short name shares its few trigrams by chance.
const lookalikeMinGrams = 6

// lookalike returns the trusted host name that a target item imitates:
// the item names a host (a URL's, an e-mail address's domain, or a host
// name) that is not a trusted host, nor a subdomain or parent of one, yet
// is the same name under another top-level domain, or contains at least
// LookalikeMinContainment of a trusted host's trigrams.
// Such a value is gated, not scored: its similarity to what the user
// asked for is the attack, so a loosened threshold must not release it.
// It returns "" when the item imitates no trusted host.
func (e *Engine) lookalike(x string) string {
	h := hostOf(x)
	if h == "" {
		return ""
	}
	var hosts []string
	for v := range e.trusted.All() {
		if t := hostOf(v); t != "" {
			if t == h || strings.HasSuffix(h, "."+t) || strings.HasSuffix(t, "."+h) {
				return ""
			}
			hosts = append(hosts, t)
		}
	}
	hg := trigrams(h)
	for _, t := range hosts {
		if hb, tb := stripTLD(h), stripTLD(t); hb == tb && len(tb) >= 3 {
			return t
		}
		tg := trigrams(t)
		if len(tg) < lookalikeMinGrams {
			continue
		}
		in := 0
		for g := range tg {
			if hg[g] {
				in++
			}
		}
		if float64(in)/float64(len(tg)) >= LookalikeMinContainment {
			return t
		}
	}
	return ""
}

// lookalikeItem applies lookalike to a value and, for a list, to each
// of its items that is not derivable from T: the trusted host imitated
// and the item that imitates it, or "" and "".
func (e *Engine) lookalikeItem(v string) (string, string) {
	items, ok := e.listItems(v)
	if !ok {
		items = []string{v}
	}
	for _, it := range items {
		if e.derivableOne(RoleTarget, it) || e.isPrincipal(it) {
			continue
		}
		if t := e.lookalike(it); t != "" {
			return t, it
		}
	}
	return "", ""
}

// hostOf returns the host name a value names, lowercase and without a
// leading "www.": a URL's host, an e-mail address's domain, or the value
// itself when it is a host name with a dot; "" otherwise.
func hostOf(x string) string {
	v := strings.ToLower(strings.TrimSpace(x))
	if i := strings.Index(v, "://"); i > 0 {
		v = v[i+3:]
		if k := strings.IndexAny(v, "/?#"); k >= 0 {
			v = v[:k]
		}
		if k := strings.LastIndexByte(v, '@'); k >= 0 {
			v = v[k+1:]
		}
		if k := strings.IndexByte(v, ':'); k >= 0 {
			v = v[:k]
		}
	} else if at := strings.IndexByte(v, '@'); at > 0 && strings.Count(v, "@") == 1 {
		v = v[at+1:]
	} else if k := strings.IndexAny(v, "/?#"); k >= 0 {
		v = v[:k]
	}
	for strings.HasPrefix(v, "www.") { // "www.www.example.org" too: a name under the same owner
		v = v[len("www."):]
	}
	v = strings.TrimSuffix(v, ".")
	if !looksLikeHost(v) {
		return ""
	}
	return v
}

// stripTLD returns a host name without its last label.
func stripTLD(h string) string {
	if i := strings.LastIndexByte(h, '.'); i > 0 {
		return h[:i]
	}
	return h
}

func trigrams(s string) map[string]bool {
	g := make(map[string]bool, len(s))
	for i := 0; i+3 <= len(s); i++ {
		g[s[i:i+3]] = true
	}
	return g
}
