package decide

import (
	"bytes"
	"context"
	"encoding/base64"
	"net/netip"
	"strings"
	"testing"
)

const credPolicy = `
version: 1
levels: [public, internal, secret]
parties:
  - {name: github, hosts: ["api.github.com", "github.com"], ports: [443], clearance: public}
  - {name: docs, hosts: ["docs.example.com"], clearance: public}
  - {name: vault, hosts: ["vault.example.com"], clearance: secret}
internal:
  - {name: model, hosts: ["api.openai.com"], ports: [443]}
credentials:
  - {name: GITHUB_TOKEN, parties: [github]}
  - {name: OPENAI_API_KEY, parties: [model]}
  - {name: DEPLOY_KEY, hosts: ["deploy.example.com"], level: internal}
refuse:
  - {name: no-evil, hosts: ["evil.example.net"]}
operations:
  - {ops: ["http:GET", "dns:query"], kind: blocking, gate: [target, credential]}
  - {ops: ["tls:*"], kind: blocking, gate: [target]}
  - {ops: ["http:*"], kind: stallable}
  - {ops: ["file:*"], kind: stageable, gate: []}
`

const (
	ghTok     = "ghp_R2d2C3poBb8Luke0Leia1Han"
	openaiKey = "sk-proj-Q7wErTyUiOp4AsDfGhJkL"
	deployKey = "dk_live_99ZZ88YY77XX66"
	extraKey  = "xk-Upload-5150-Van-Halen"
	loneKey   = "lone-wolf-key-31337-abc"
)

func credVals() []CredentialValue {
	return []CredentialValue{
		{Name: "GITHUB_TOKEN", Value: ghTok},
		{Name: "OPENAI_API_KEY", Value: openaiKey},
		{Name: "DEPLOY_KEY", Value: deployKey},
		{Name: "UPLOAD_KEY", Value: extraKey, Hosts: []string{"upload.example.com"}},
		{Name: "LONE_KEY", Value: loneKey},
		{Name: "LANG", Value: "C.UTF-8", Hosts: []string{"*"}},
	}
}

const credTask = "Read https://api.github.com/user, https://docs.example.com/guide, https://upload.example.com/in, " +
	"https://deploy.example.com/hook, https://vault.example.com/v and write out/report.txt"

func credEngine(t *testing.T, audit *bytes.Buffer) (*Engine, *Policy) {
	t.Helper()
	p, err := mustPolicy(t, credPolicy).WithCredentials(credVals())
	if err != nil {
		t.Fatal(err)
	}
	opt := Options{}
	if audit != nil {
		opt.Audit = audit
	}
	e := New(p, opt)
	e.Task(credTask)
	return e, p
}

// req is an HTTP request effect as the hooks give it.
func req(method, host, path string, headers map[string]string, body string) Event {
	url := "https://" + host + path
	fs := []Field{{Name: "host", Role: RoleTarget, Value: host}, {Name: "url", Role: RoleTarget, Value: url}}
	if q := strings.IndexByte(path, '?'); q >= 0 {
		fs[1].Value = "https://" + host + path[:q]
		fs = append(fs, Field{Name: "query", Role: RoleSelector, Value: path[q+1:]})
	}
	for k, v := range headers {
		fs = append(fs, Field{Name: "header." + k, Role: RoleCredential, Value: v})
	}
	if body != "" {
		fs = append(fs, Field{Name: "body", Role: RoleContent, Value: body})
	}
	return Event{Ch: ChanNet, Dir: Out, Op: "http:" + method, Obj: url, Content: body, Fields: fs,
		Dest: &Dest{Host: host, Addr: netip.MustParseAddr("198.18.0.2"), Port: 443, Proto: "tcp"}}
}

func dnsQuery(names ...string) Event {
	ev := Event{Ch: ChanNet, Dir: Out, Op: OpDNSQuery, Obj: names[0], Dest: &Dest{Host: names[0], Addr: netip.MustParseAddr("10.0.0.1"), Port: 53, Proto: "udp"}}
	for _, n := range names {
		ev.Fields = append(ev.Fields, Field{Name: "qname", Role: RoleTarget, Value: n})
	}
	return ev
}

func TestCredentialBinding(t *testing.T) {
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	opaque := func(host string) Event {
		return Event{Ch: ChanNet, Dir: Out, Op: "tls:clienthello", Obj: host, Opaque: true,
			Fields: []Field{{Name: "sni", Role: RoleTarget, Value: host}},
			Dest:   &Dest{Host: host, Port: 443, Proto: "tcp"}}
	}
	for _, tc := range []struct {
		name   string
		ev     Event
		policy Verdict // what the policy says (before any oracle)
		code   string
		rule   string // the credential named in the refusal
	}{
		{"token to its party as a bearer header", req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer " + ghTok}, ""), Release, CodeTrusted, ""},
		{"token to its party as basic auth", req("GET", "api.github.com", "/user", map[string]string{"authorization": basic("x-access-token", ghTok)}, ""), Release, CodeTrusted, ""},
		{"token to another party in a header", req("GET", "docs.example.com", "/guide", map[string]string{"authorization": "Bearer " + ghTok}, ""), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token to another party in basic auth", req("GET", "docs.example.com", "/guide", map[string]string{"authorization": basic("me", ghTok)}, ""), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token in the query", req("GET", "docs.example.com", "/guide?t="+ghTok, nil, ""), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token in the path", req("GET", "docs.example.com", "/guide/"+ghTok, nil, ""), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token in the body", req("POST", "docs.example.com", "/guide", nil, "note="+ghTok), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token in the body, other case and spaced", req("POST", "docs.example.com", "/guide", nil, "note="+strings.ToUpper(ghTok[:10])+" \n"+ghTok[10:]), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token in a DNS name", dnsQuery(strings.ToLower(ghTok) + ".docs.example.com"), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token to a party cleared secret", req("POST", "vault.example.com", "/v", nil, ghTok), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"token to the model provider", req("POST", "api.openai.com", "/v1/responses", nil, `{"input":"`+ghTok+`"}`), Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"model key to the model provider", req("POST", "api.openai.com", "/v1/responses", map[string]string{"authorization": "Bearer " + openaiKey}, `{"input":"hi"}`), Release, CodeInternal, ""},
		{"model key to github", req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer " + openaiKey}, ""), Refuse, CodeCredential, "OPENAI_API_KEY"},
		{"key bound by host", req("POST", "deploy.example.com", "/hook", map[string]string{"x-api-key": deployKey}, "go"), Release, CodeTrusted, ""},
		{"key bound on the command line", req("POST", "upload.example.com", "/in", map[string]string{"x-api-key": extraKey}, "data"), Release, CodeTrusted, ""},
		{"command-line key elsewhere", req("POST", "deploy.example.com", "/hook", nil, extraKey), Refuse, CodeCredential, "UPLOAD_KEY"},
		{"key bound to nothing", req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer " + loneKey}, ""), Refuse, CodeCredential, "LONE_KEY"},
		{"key written to the working directory", Event{Ch: ChanFile, Dir: Out, Op: "file:write", Obj: "out/report.txt", Content: "token: " + ghTok}, Refuse, CodeCredential, "GITHUB_TOKEN"},
		{"the operator's rule first", req("POST", "evil.example.net", "/", nil, ghTok), Refuse, CodeRefuseRule, ""},
		{"plain environment is no credential", req("POST", "docs.example.com", "/guide", nil, "lang=C.UTF-8"), Release, CodeTrusted, ""},
		{"request without a credential", req("GET", "docs.example.com", "/guide", nil, ""), Release, CodeTrusted, ""},
		{"untrusted credential to the right party", req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer ghp_SomethingTheAgentMadeUp"}, ""), Defer, CodeUntrustedValue, ""},
		{"opaque flow to a public party may carry the keys", opaque("docs.example.com"), Defer, CodeUncleared, ""},
		{"opaque flow to the model provider", opaque("api.openai.com"), Release, CodeInternal, ""},
		{"result to the principal", Event{Ch: ChanCtrl, Dir: Out, Obj: "principal", Content: "your token " + ghTok}, Release, CodeTrusted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var audit bytes.Buffer
			e, _ := credEngine(t, &audit)
			d := e.Propose(context.Background(), tc.ev).Decision
			if d.Policy != tc.policy || d.Reason.Code != tc.code && d.Policy != Defer || d.Policy == Defer && !strings.Contains(d.Justification, "deferred because") {
				t.Fatalf("got policy %v, final %v/%s (%s), want policy %v/%s", d.Policy, d.Verdict, d.Reason.Code, d.Justification, tc.policy, tc.code)
			}
			if tc.policy == Refuse && d.Verdict != Refuse {
				t.Errorf("final verdict %v, want refuse", d.Verdict)
			}
			if tc.rule != "" {
				if d.Reason.Rule != tc.rule || !strings.Contains(d.Justification, "$"+tc.rule) {
					t.Errorf("refusal names %q (%s), want the credential %s", d.Reason.Rule, d.Justification, tc.rule)
				}
			}
			// No record of the effect holds a value: the audit line,
			// the decision's event, its summary.
			records := audit.String() + d.Justification + d.Event.Summary() + d.Event.Content + d.Event.Obj
			for _, f := range d.Fields {
				records += f.Value
			}
			for _, v := range []string{ghTok, openaiKey, deployKey, extraKey, loneKey, strings.ToLower(ghTok)} {
				if tc.ev.Ch != ChanCtrl && strings.Contains(records, v) {
					t.Errorf("a record holds the value %q:\n%s", v, records)
				}
				if strings.Contains(records, base64.StdEncoding.EncodeToString([]byte("x-access-token:"+v))) {
					t.Errorf("a record holds the value %q base64-encoded", v)
				}
			}
		})
	}
}

// An effect evaluated again (Propose waits for a scope resolution and
// decides again when the first answer was a release of a state-changing
// request or a deferral) decides the same on its redacted form; the
// caller's fields are not changed. (A refusal is final and never
// evaluated again.)
func TestCredentialEvaluationIsIdempotent(t *testing.T) {
	e, p := credEngine(t, nil)
	for _, ev := range []Event{
		req("POST", "api.github.com", "/repos/x/issues", map[string]string{"authorization": "Bearer " + ghTok}, "title=hi"),
		req("GET", "api.github.com", "/user", map[string]string{"authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ghTok))}, ""),
		req("POST", "upload.example.com", "/in", map[string]string{"x-api-key": extraKey}, "data"),
		req("POST", "docs.example.com", "/elsewhere", nil, "data"),
	} {
		callers := ev.Fields
		want := make([]Field, len(callers))
		copy(want, callers)
		first := e.evaluate(p, &ev)
		second := e.evaluate(p, &ev)
		if first.Verdict == Refuse || first.Verdict != second.Verdict || first.Reason.Code != second.Reason.Code {
			t.Errorf("%s: first %v/%s, again %v/%s (%s)", ev.Obj, first.Verdict, first.Reason.Code, second.Verdict, second.Reason.Code, second.Justification)
		}
		for i := range want {
			if callers[i] != want[i] {
				t.Errorf("the caller's field %d was changed: %q", i, callers[i].Value)
			}
		}
	}
}

func TestWithCredentialsErrors(t *testing.T) {
	p := mustPolicy(t, credPolicy)
	for _, tc := range []struct {
		vals []CredentialValue
		want string
	}{
		{[]CredentialValue{{Name: "1BAD", Value: ghTok}}, "not a valid environment variable name"},
		{[]CredentialValue{{Name: "SHORT", Value: "abc"}}, "SHORT: its value is shorter than 8 characters"},
		{[]CredentialValue{{Name: "K", Value: ghTok, Hosts: []string{"https://x"}}}, `"https://x" is not a host name`},
	} {
		if _, err := p.WithCredentials(tc.vals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.vals, err, tc.want)
		}
	}
	// The policy itself is not changed: bindings are per run.
	q, err := p.WithCredentials([]CredentialValue{{Name: "GITHUB_TOKEN", Value: ghTok, Hosts: []string{"gitlab.example.com", "192.0.2.7"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Credentials[0].Endpoint.Hosts) != 0 || len(q.Credentials[0].Endpoint.Hosts) != 1 || len(q.Credentials[0].Endpoint.Prefixes) != 1 {
		t.Errorf("bindings: policy %+v, bound %+v", p.Credentials[0], q.Credentials[0])
	}
	if got := q.CredentialNames(); len(got) != 1 || got[0] != "GITHUB_TOKEN" {
		t.Errorf("CredentialNames = %q", got)
	}
	if got := q.Redact("a " + ghTok + " b " + strings.ToUpper(ghTok)); got != "$GITHUB_TOKEN" {
		t.Errorf("Redact = %q", got)
	}
	if got := q.Redact("a " + ghTok + " b"); got != "a $GITHUB_TOKEN b" {
		t.Errorf("Redact = %q", got)
	}
}

// An internal channel's name resolves whatever ports the channel lists;
// a query that also asks about another name is no internal traffic.
func TestInternalChannelDNS(t *testing.T) {
	p := mustPolicy(t, credPolicy)
	e := New(p, Options{})
	if d := e.Propose(context.Background(), dnsQuery("api.openai.com")).Decision; d.Verdict != Release || d.Reason.Code != CodeInternal {
		t.Errorf("lookup of the model provider: %v/%s (%s)", d.Verdict, d.Reason.Code, d.Justification)
	}
	if d := e.Propose(context.Background(), dnsQuery("api.openai.com.", "leak.example.org")).Decision; d.Reason.Code == CodeInternal {
		t.Errorf("a query asking about another name too was released as internal: %s", d.Justification)
	}
	ev := dnsQuery("api.openai.com")
	ev.Op = "udp:datagram"
	if d := e.Propose(context.Background(), ev).Decision; d.Reason.Code == CodeInternal {
		t.Errorf("a datagram to port 53 of a party with ports [443] is internal: %s", d.Justification)
	}
}

func TestOnUntrustedRefuse(t *testing.T) {
	p := mustPolicy(t, `
version: 1
levels: [public, secret]
operations:
  - {ops: ["dns:query"], kind: blocking, gate: [target], on_untrusted: refuse}
`)
	e := New(p, Options{Oracle: askedOracle{t}})
	e.Task("look up docs.example.com")
	if d := e.Propose(context.Background(), dnsQuery("docs.example.com")).Decision; d.Verdict != Release {
		t.Errorf("lookup named in the task: %v (%s)", d.Verdict, d.Justification)
	}
	d := e.Propose(context.Background(), dnsQuery("ab.chatgpt.com")).Decision
	if d.Verdict != Refuse || d.Policy != Refuse || d.Reason.Code != CodeUntrustedValue || d.Layer != LayerProvenance {
		t.Errorf("unasked lookup: %v/%v/%s/%s (%s)", d.Verdict, d.Policy, d.Layer, d.Reason.Code, d.Justification)
	}
}

// askedOracle fails the test when it is asked.
type askedOracle struct{ t *testing.T }

func (askedOracle) Name() string { return "asked" }
func (o askedOracle) Decide(context.Context, *View) ([]OracleAnswer, error) {
	o.t.Error("the oracle was asked")
	return nil, nil
}

// A Host header (or SNI) naming a bound host carries a credential only to
// an address the resolver gave for that name, or over intercepted HTTPS
// (the upstream certificate was verified for it).
func TestCredentialNameCheck(t *testing.T) {
	good, spoof := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("203.0.113.9")
	p, err := mustPolicy(t, credPolicy).WithCredentials(credVals())
	if err != nil {
		t.Fatal(err)
	}
	p = p.WithNameCheck(func(host string, addr netip.Addr) bool { return host == "api.github.com" && addr == good })
	plain := func(addr netip.Addr) Event {
		ev := req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer " + ghTok}, "")
		ev.Obj = "http://api.github.com/user"
		ev.Fields[1].Value = ev.Obj
		ev.Dest.Addr = addr // port 443: the party github lists it
		return ev
	}
	intercepted := req("GET", "api.github.com", "/user", map[string]string{"authorization": "Bearer " + ghTok}, "")
	intercepted.Dest.Addr = spoof
	for _, tc := range []struct {
		name string
		ev   Event
		want string
	}{
		{"plain HTTP to the resolved address", plain(good), CodeTrusted},
		{"plain HTTP to another address", plain(spoof), CodeCredential},
		{"intercepted HTTPS", intercepted, CodeTrusted},
	} {
		e := New(p, Options{})
		e.Task(credTask + " http://api.github.com/user")
		if d := e.Propose(context.Background(), tc.ev).Decision; d.Reason.Code != tc.want {
			t.Errorf("%s: %v/%s (%s), want %s", tc.name, d.Verdict, d.Reason.Code, d.Justification, tc.want)
		}
	}
}

// What the agent read is shown to the oracle with the credentials'
// values replaced by their markers: an LLM oracle is a party too.
func TestOracleViewHoldsNoCredential(t *testing.T) {
	p, err := mustPolicy(t, credPolicy).WithCredentials(credVals())
	if err != nil {
		t.Fatal(err)
	}
	var seen string
	e := New(p, Options{Oracle: viewOracle{&seen}})
	e.Task(credTask)
	e.Observe(Event{Ch: ChanFile, Dir: In, Obj: ".env", Content: "GITHUB_TOKEN=" + ghTok + "\nhttps://elsewhere.example.net/x"})
	d := e.Propose(context.Background(), req("GET", "elsewhere.example.net", "/x", nil, "")).Decision
	if d.Layer != LayerOracle || seen == "" {
		t.Fatalf("the oracle was not asked: %v/%s (%s)", d.Verdict, d.Layer, d.Justification)
	}
	if strings.Contains(seen, ghTok) || !strings.Contains(seen, "$GITHUB_TOKEN") {
		t.Errorf("the oracle's view:\n%s", seen)
	}
}

type viewOracle struct{ seen *string }

func (viewOracle) Name() string { return "view" }
func (o viewOracle) Decide(_ context.Context, v *View) ([]OracleAnswer, error) {
	*o.seen = v.Render()
	return nil, nil
}
