package decide

import (
	"context"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide/score"
)

// Tests of the value classes (classes.go, docs/provenance.md "Value
// classes"): each rule, and the same case with Ablation.Classes, which
// shows the rule is what decides it.

const classesPolicy = `
version: 1
levels: [public, private, secret]
trusted:
  task: true
  principal: ["emma@own-example.com"]
sensitive:
  - {name: notes, level: private, objects: ["tool:read_notes"]}
parties:
  - {name: forms, objects: ["https://www.forms-example.org/"], clearance: private}
operations:
  - ops: ["tool:send_message"]
    kind: stallable
    roles: {recipients: target, body: content}
    dest_field: recipients
    message: true
  - ops: ["tool:post_form"]
    kind: stallable
    roles: {url: target, body: content}
    dest_field: url
  - ops: ["tool:create_event"]
    kind: stallable
    roles: {participants: target, title: content}
    dest_field: participants
  - ops: ["tool:get_webpage"]
    kind: blocking
    roles: {url: target}
    dest_field: url
  - ops: ["tool:read_notes"]
    kind: blocking
    gate: []
defaults: {kind: blocking, gate: [target, credential, command]}
`

func classesEngine(t *testing.T, off bool, cal *Calibration, task, notes string) *Engine {
	t.Helper()
	return classesEngineRevert(t, off, true, cal, task, notes)
}

func classesEngineRevert(t *testing.T, off, revert bool, cal *Calibration, task, notes string) *Engine {
	t.Helper()
	e := New(mustPolicy(t, classesPolicy), Options{Calibration: cal, Revert: revert, Ablate: Ablation{Classes: off}})
	e.Task(task)
	if notes != "" {
		e.Observe(Event{Ch: ChanNet, Dir: In, Obj: "tool:read_notes", Content: notes})
	}
	return e
}

func op(name, destField, dest, contentField, content string) Event {
	return Event{Ch: ChanNet, Dir: Out, Op: name, Obj: dest,
		Fields: []Field{{Name: destField, Value: dest}, {Name: contentField, Value: content}}}
}

func checkDecision(t *testing.T, d Decision, want Verdict, code string) {
	t.Helper()
	if d.Verdict != want || (code != "" && d.Reason.Code != code) {
		t.Errorf("got %v %s, want %v %s (%s)", d.Verdict, d.Reason.Code, want, code, d.Justification)
	}
}

// Rule 1: a time of day read from a sensitive source is not carried data.
func TestClassTimeOfDay(t *testing.T) {
	const task = "Tell roberta@corp-example.com when the standup is"
	const notes = "Standup at 10:00:00 daily, the review at 14:30; room code HGK137803."
	for _, c := range []struct {
		name, body string
		off        bool
		want       Verdict
		code       string
	}{
		{"seconds", "The standup is at 10:00:00.", false, Release, CodeTrusted},
		{"minutes", "Review: 14:30", false, Release, CodeTrusted},
		{"a distinctive token still counts", "Use room HGK137803", false, Defer, CodeUncleared},
		{"switched off: the time counts", "The standup is at 10:00:00.", true, Defer, CodeUncleared},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := classesEngine(t, c.off, nil, task, notes)
			d := e.Propose(context.Background(), op("tool:send_message", "recipients", "roberta@corp-example.com", "body", c.body)).Decision
			checkDecision(t, d, c.want, c.code)
		})
	}
}

// Rule 2: a URL's other forms are the destination itself in the
// clearance question: the party they name, and the destination's own
// identity rather than carried data.
func TestClassURLFormsClearance(t *testing.T) {
	const task = "Post my notes to https://www.forms-example.org/"
	const notes = "Budget line HGK137803. Orders go through supplier-portal.net"
	// A threshold that allows any score, for the destination read from
	// the notes: the clearance question is asked after it.
	loose := &Calibration{Score: "ngram", Threshold: map[Role]float64{RoleTarget: 1}, Stratum: map[Role]string{RoleTarget: "target"}}
	for _, c := range []struct {
		name, url, body string
		off             bool
		want            Verdict
		code            string
	}{
		{"the party as declared", "https://www.forms-example.org/", "HGK137803", false, Release, CodeTrusted},
		{"without scheme and www", "forms-example.org", "HGK137803", false, Release, CodeTrusted},
		{"http, no trailing slash", "http://forms-example.org", "HGK137803", false, Release, CodeTrusted},
		{"switched off: an unknown party", "forms-example.org", "HGK137803", true, Defer, CodeUncleared},
		{"another host is no form", "https://forms-example.org.example.net/", "HGK137803", false, Defer, CodeUntrustedValue},
		{"the destination read from notes is its identity", "https://www.supplier-portal.net/", "hello", false, Release, CodeCRCAllowed},
		{"switched off: its host counts as carried", "https://www.supplier-portal.net/", "hello", true, Defer, CodeUncleared},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cal *Calibration
			if strings.Contains(c.url, "supplier") {
				cal = loose
			}
			e := classesEngine(t, c.off, cal, task, notes)
			d := e.Propose(context.Background(), op("tool:post_form", "url", c.url, "body", c.body)).Decision
			checkDecision(t, d, c.want, c.code)
		})
	}
}

// Rule 3: a list value is scored item by item in the CRC step: its
// score is the highest of its items that are not derivable, each alone,
// in every list syntax.
func TestClassListScoredPerItem(t *testing.T) {
	const task = "Invite roberta@corp-example.com and the team to the planning meeting"
	const notes = "Contacts: jordan.lee@partner-example.net, kim@vendor-example.io"
	kind := score.KindNgram
	e := classesEngine(t, false, nil, task, notes)
	one := e.fieldScore(kind, RoleTarget, "jordan.lee@partner-example.net")
	if whole := score.Score(kind, "roberta@corp-example.com, jordan.lee@partner-example.net", &e.uctx, &e.tctx); whole == one {
		t.Fatalf("the whole list scores %.3f like its item: the test cannot tell them apart", whole)
	}
	for _, c := range []struct {
		name, v string
		off     bool
		want    string // the item whose score the field takes; "" for the whole value
	}{
		{"comma", "roberta@corp-example.com, jordan.lee@partner-example.net", false, "jordan.lee@partner-example.net"},
		{"semicolon", "jordan.lee@partner-example.net; roberta@corp-example.com", false, "jordan.lee@partner-example.net"},
		{"newline", "roberta@corp-example.com\njordan.lee@partner-example.net", false, "jordan.lee@partner-example.net"},
		{"json array", `["roberta@corp-example.com", "jordan.lee@partner-example.net"]`, false, "jordan.lee@partner-example.net"},
		{"two unseen items: the higher", "kim@vendor-example.io, jordan.lee@partner-example.net", false, "max"},
		{"one value", "jordan.lee@partner-example.net", false, "jordan.lee@partner-example.net"},
		{"switched off: one value", "roberta@corp-example.com, jordan.lee@partner-example.net", true, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := classesEngine(t, c.off, nil, task, notes)
			got := e.fieldScore(kind, RoleTarget, c.v)
			var want float64
			switch c.want {
			case "":
				want = score.Score(kind, c.v, &e.uctx, &e.tctx)
			case "max":
				want = max(score.Score(kind, "kim@vendor-example.io", &e.uctx, &e.tctx), one)
			default:
				want = score.Score(kind, c.want, &e.uctx, &e.tctx)
			}
			if got != want {
				t.Errorf("fieldScore(%q) = %.4f, want %.4f", c.v, got, want)
			}
		})
	}
	// The decision follows the item's score: a threshold at it allows the
	// list, one just under it does not.
	for _, c := range []struct {
		tau  float64
		want Verdict
	}{{one, Release}, {one - 0.01, Defer}} {
		cal := &Calibration{Score: string(kind), Threshold: map[Role]float64{RoleTarget: c.tau}, Stratum: map[Role]string{RoleTarget: "target"}}
		e := classesEngine(t, false, cal, task, notes)
		ev := op("tool:create_event", "participants", `["roberta@corp-example.com", "jordan.lee@partner-example.net"]`, "title", "Planning")
		d := e.Propose(context.Background(), ev).Decision
		if d.Verdict != c.want {
			t.Errorf("τ=%.4f: got %v (%s), want %v", c.tau, d.Verdict, d.Justification, c.want)
		}
	}
}

// Rule 4: the principal's declared identity is trusted in recipient and
// participant lists beside values T derives; alone, it is a destination
// like any other (an injection's note to the user herself).
func TestClassPrincipal(t *testing.T) {
	const task = "Invite roberta@corp-example.com to the planning meeting"
	for _, c := range []struct {
		name, v string
		off     bool
		want    Verdict
		code    string
	}{
		{"the principal with a named colleague", "emma@own-example.com, roberta@corp-example.com", false, Release, CodeTrusted},
		{"the principal in any case and order", "roberta@corp-example.com; Emma@Own-Example.com", false, Release, CodeTrusted},
		{"json array", `["emma@own-example.com", "roberta@corp-example.com"]`, false, Release, CodeTrusted},
		{"the principal alone", "emma@own-example.com", false, Defer, CodeUntrustedValue},
		{"only the principal, twice", "emma@own-example.com, emma@own-example.com", false, Defer, CodeUntrustedValue},
		{"an unnamed participant still gated", "emma@own-example.com, jordan@partner-example.net", false, Defer, CodeUntrustedValue},
		{"a look-alike of the principal is not the principal", "emma@own-examples.com", false, Defer, CodeUntrustedValue},
		{"switched off: not trusted", "emma@own-example.com, roberta@corp-example.com", true, Defer, CodeUntrustedValue},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := classesEngine(t, c.off, nil, task, "")
			d := e.Propose(context.Background(), op("tool:create_event", "participants", c.v, "title", "Planning")).Decision
			checkDecision(t, d, c.want, c.code)
		})
	}
	p := mustPolicy(t, classesPolicy)
	if len(p.Principal) != 1 || p.Principal[0] != "emma@own-example.com" {
		t.Errorf("Principal = %q", p.Principal)
	}
	y, err := p.YAML()
	if err != nil || !strings.Contains(string(y), "principal: [emma@own-example.com]") {
		t.Errorf("canonical form does not keep the principal (%v):\n%s", err, y)
	}
	if _, err := ParsePolicy("t.yaml", []byte("version: 1\nlevels: [public]\ntrusted: {principal: [\" \"]}\n")); err == nil || !strings.Contains(err.Error(), "trusted.principal") {
		t.Errorf("an empty principal: %v", err)
	}
}

// Rule 5: a look-alike of a trusted host is never allowed on its score,
// however loose the threshold; where the channel can rewrite the effect
// (Options.Revert) it is reverted to the trusted value it copies, else
// deferred.
func TestClassLookalike(t *testing.T) {
	const task = "Summarise https://www.informations.com/news for me and write to emma@own-example.com"
	loose := &Calibration{Score: "ngram", Threshold: map[Role]float64{RoleTarget: 1}, Stratum: map[Role]string{RoleTarget: "target"}}
	for _, c := range []struct {
		name, url   string
		off, revert bool
		want        Verdict
		code        string
	}{
		{"the trusted host", "https://informations.com/news", false, false, Release, CodeTrusted},
		{"an inserted word", "https://www.true-informations.com", false, false, Defer, CodeCRCOver},
		{"a swapped top-level domain", "https://informations.org/news", false, false, Defer, CodeCRCOver},
		{"a changed letter", "https://www.informatlons.com/news", false, false, Defer, CodeCRCOver},
		{"a host ending like it", "informations.com.example.net", false, false, Defer, CodeCRCOver},
		{"a subdomain of the trusted host", "https://docs.informations.com/", false, false, Release, CodeCRCAllowed},
		{"a host sharing a common word", "https://info.example.net/", false, false, Release, CodeCRCAllowed},
		{"an unrelated host, on its score", "https://weather-example.net/today", false, false, Release, CodeCRCAllowed},
		{"reverted to the host it copies", "https://www.informatlons.com/news", false, true, Release, CodeCRCReverted},
		{"switched off: scored into release", "https://www.true-informations.com", true, false, Release, CodeCRCAllowed},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := classesEngineRevert(t, c.off, c.revert, loose, task, "")
			d := e.Propose(context.Background(), op("tool:post_form", "url", c.url, "body", "")).Decision
			checkDecision(t, d, c.want, c.code)
			if c.code == CodeCRCOver && !strings.Contains(d.Justification, "look-alike of the trusted host \"informations.com\"") {
				t.Errorf("justification does not name the imitated host: %s", d.Justification)
			}
			if c.code == CodeCRCReverted && (len(d.Reverts) != 1 || !strings.Contains(d.Reverts[0].To, "informations.com")) {
				t.Errorf("reverts %+v", d.Reverts)
			}
		})
	}
}

func TestLookalikeHosts(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"https://User@www.Example.org:8443/x?y", "example.org"},
		{"bob@mail.example.org", "mail.example.org"},
		{"www.example.org/path", "example.org"},
		{"example", ""},
		{"ftp:// ", ""},
		{"10.0.0.1", ""},
	} {
		if got := hostOf(c.in); got != c.want {
			t.Errorf("hostOf(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// List items are non-empty and trimmed, and a separated list's items are
// substrings of the value; hostOf returns a lowercase host name without
// "www." or nothing; neither panics.
func FuzzListItemsAndHosts(f *testing.F) {
	for _, s := range []string{`["a@x.org", "b@y.org"]`, "a, b;c\nd", `[1, true, "x"]`, `[{"a":1}]`, "[", `[""]`,
		"https://User@www.Example.org:8443/x?y", "bob@mail.example.org", "www.example.org/path", "10:00-11:30"} {
		f.Add(s)
	}
	e := New(mustPolicy(f, classesPolicy), Options{})
	f.Fuzz(func(t *testing.T, s string) {
		items, ok := e.listItems(s)
		if !ok && len(items) > 0 {
			t.Fatalf("no list, yet items %q", items)
		}
		_, isJSON := jsonList(s)
		for _, it := range items {
			if it == "" || it != strings.TrimSpace(it) {
				t.Fatalf("item %q of %q", it, s)
			}
			if !isJSON && !strings.Contains(s, it) {
				t.Fatalf("item %q is not in %q", it, s)
			}
		}
		if h := hostOf(s); h != "" && (h != strings.ToLower(h) || strings.HasPrefix(h, "www.") || !looksLikeHost(h)) {
			t.Fatalf("hostOf(%q) = %q", s, h)
		}
		_ = e.lookalike(s)
	})
}
