package decide

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/carbd/carbd/pkg/decide/match"
)

// maxViewLines bounds the trace lines and mentions the oracle sees.
const (
	maxViewLines    = 200
	maxMentions     = 40
	maxLineInView   = 400
	maxContentLines = 3
)

// viewLocked builds the oracle's view of the deferred effects (Kairos
// §III-D).
func (e *Engine) viewLocked(ds []*Decision) *View {
	p := e.policy.Load()
	v := &View{Task: e.task, Policy: p.Summary()}
	for _, d := range ds {
		de := DeferredEffect{Seq: d.Seq, Reason: d.Justification}
		if d.Event != nil {
			de.Summary = d.Event.Summary()
			de.Key, de.Scope = questionKey(d.Event)
			for _, f := range d.Fields {
				if f.Value == "" || f.Role == RoleContent {
					continue
				}
				var origin string
				switch {
				case e.derivableAs(f.Role, f.Value):
					origin = "supplied by the user's message or a trusted source"
				default:
					origin = e.originPhrase(f.Value)
				}
				de.Values = append(de.Values, ValueOrigin{Field: f.Name, Role: f.Role, Value: f.Value, Origin: origin})
			}
		}
		v.Deferred = append(v.Deferred, de)
	}
	trace := e.recent(len(e.trace))
	start := 0
	if len(trace) > maxViewLines {
		start = len(trace) - maxViewLines
	}
	for _, t := range trace[start:] {
		line := t.ev.Summary()
		if t.ev.Dir == In {
			line = "read from " + t.ev.Origin() + ": " + firstLines(t.ev.Content, maxContentLines)
		} else {
			line = fmt.Sprintf("proposed %s -> %s", line, t.verdict)
		}
		v.Trace = append(v.Trace, TraceLine{Seq: t.ev.Seq, Line: clip(line, maxLineInView), Untrusted: t.untrusted})
	}
	// Earlier lines of incoming content that mention a deferred value.
	for _, de := range v.Deferred {
		for _, val := range de.Values {
			nv := match.Norm(val.Value)
			if len(nv) < 4 {
				continue
			}
			for _, t := range trace {
				if t.ev.Dir != In || len(v.Mentions) >= maxMentions {
					continue
				}
				for _, ln := range strings.Split(t.ev.Content, "\n") {
					if strings.Contains(match.Norm(ln), nv) {
						v.Mentions = append(v.Mentions, Mention{Seq: t.ev.Seq, Origin: t.ev.Origin(), Value: val.Value, Line: clip(strings.TrimSpace(ln), maxLineInView)})
						break
					}
				}
			}
		}
	}
	return v
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, " ⏎ ")
}

// questionKey is an effect as the question a person answers, and the
// scope an answer for the run covers. The scope is the operation and the
// values of its gated target and command fields, in order; control
// fields (a DNS query's type, an offset) are left out, so a name's A and
// AAAA lookups are one question. The key adds a digest of the content
// and credentials, so two requests to one place with different bodies
// are two questions. Without gated fields, both are the summary.
func questionKey(ev *Event) (key, scope string) {
	var b strings.Builder
	b.WriteString(ev.Op)
	n := 0
	h := sha256.New()
	h.Write([]byte(ev.Content))
	for _, f := range ev.Fields {
		switch f.Role {
		case RoleTarget, RoleCommand:
			b.WriteString(" ")
			b.WriteString(f.Value)
			n++
		case RoleCredential, RoleContent:
			h.Write([]byte{0})
			h.Write([]byte(f.Name))
			h.Write([]byte{0})
			h.Write([]byte(f.Value))
		}
	}
	if n == 0 {
		s := ev.Summary()
		return s, s
	}
	scope = b.String()
	return fmt.Sprintf("%s [%x]", scope, h.Sum(nil)[:6]), scope
}
