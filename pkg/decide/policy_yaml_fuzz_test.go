package decide_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/decide"
)

// FuzzParsePolicy: ParsePolicy never panics; it returns either a policy or
// located errors, never both; a policy it returns is well formed (every
// level index declared, globs valid, hosts and values normalised, no rule
// without a selector) and its canonical form parses back to it.
//
// Run: go test -run '^$' -fuzz FuzzParsePolicy -fuzztime 30s ./pkg/decide
func FuzzParsePolicy(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "policy", "*.yaml"))
	seeds = append(seeds, filepath.Join("..", "..", "examples", "policy.yaml"))
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, c := range policyValidCases {
		f.Add([]byte(c.yaml))
	}
	for _, c := range policyErrorCases {
		f.Add([]byte(c.yaml))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pol, err := decide.ParsePolicy("f.yaml", data)
		if err != nil {
			if pol != nil {
				t.Fatal("policy returned with an error")
			}
			var list decide.PolicyErrors
			if !errors.As(err, &list) || len(list) == 0 || !errors.Is(err, decide.ErrInvalidPolicy) {
				t.Fatalf("error is not a non-empty PolicyErrors: %T %v", err, err)
			}
			for _, e := range list {
				if e.File != "f.yaml" || e.Msg == "" || e.Line < 0 || e.Column < 0 {
					t.Fatalf("malformed error %+v", e)
				}
			}
			return
		}
		checkPolicyWellFormed(t, pol)
		out, err := pol.YAML()
		if err != nil {
			t.Fatalf("YAML: %v", err)
		}
		again, err := decide.ParsePolicy("f.yaml", out)
		if err != nil {
			t.Fatalf("canonical form does not parse: %v\n%s", err, out)
		}
		if d := cmp.Diff(pol, again, policyCmp...); d != "" {
			t.Fatalf("round trip changed the policy (-first +second):\n%s", d)
		}
	})
}

func checkPolicyWellFormed(t *testing.T, p *decide.Policy) {
	t.Helper()
	n := len(p.Levels)
	if n == 0 || n > 256 {
		t.Fatalf("%d levels", n)
	}
	seen := map[string]bool{}
	for _, l := range p.Levels {
		if l == "" || seen[l] {
			t.Fatalf("level %q empty or repeated", l)
		}
		seen[l] = true
	}
	lvl := func(what string, l decide.Level) {
		if int(l) >= n {
			t.Fatalf("%s: level index %d with %d levels", what, l, n)
		}
	}
	globsOK := func(what string, gs []decide.Glob) {
		for _, g := range gs {
			if g.Pattern == "" || !doublestar.ValidatePattern(g.Pattern) {
				t.Fatalf("%s: invalid glob %q", what, g.Pattern)
			}
		}
	}
	endpoint := func(what string, ep decide.Endpoint) {
		globsOK(what+" hosts", ep.Hosts)
		for _, h := range ep.Hosts {
			if h.Pattern != strings.ToLower(h.Pattern) || strings.HasSuffix(h.Pattern, ".") {
				t.Fatalf("%s: host %q not normalised", what, h.Pattern)
			}
		}
		for _, pf := range ep.Prefixes {
			if !pf.IsValid() || pf.Masked() != pf || pf.Addr().Is4In6() || pf.Addr().Zone() != "" {
				t.Fatalf("%s: prefix %v not canonical", what, pf)
			}
		}
		for _, port := range ep.Ports {
			if port == 0 {
				t.Fatalf("%s: port 0", what)
			}
		}
		if len(ep.Ports) > 0 && len(ep.Hosts)+len(ep.Prefixes) == 0 {
			t.Fatalf("%s: ports without hosts or prefixes", what)
		}
	}
	for _, v := range p.TrustedValues {
		if v == "" || decide.Norm(v) != v {
			t.Fatalf("trusted value %q not normalised", v)
		}
	}
	if len(p.Trusted) > 1 {
		t.Fatalf("%d trusted sources", len(p.Trusted))
	}
	for _, s := range p.Trusted {
		globsOK("trusted paths", s.Paths)
		globsOK("trusted objects", s.Objects)
		endpoint("trusted", s.Net)
	}
	for _, s := range p.Sensitive {
		lvl("sensitive "+s.Name, s.Level)
		globsOK("sensitive paths", s.Paths)
		globsOK("sensitive objects", s.Objects)
		endpoint("sensitive", s.Net)
		if len(s.Paths)+len(s.Objects)+len(s.Net.Hosts)+len(s.Net.Prefixes) == 0 {
			t.Fatalf("sensitive source %q selects nothing", s.Name)
		}
	}
	names := map[string]bool{}
	for _, pts := range [][]decide.Party{p.Parties, p.Internal} {
		for _, pt := range pts {
			if pt.Name == "" || names[pt.Name] {
				t.Fatalf("party name %q empty or repeated", pt.Name)
			}
			names[pt.Name] = true
			lvl("party "+pt.Name, pt.Clearance)
			endpoint("party "+pt.Name, pt.Endpoint)
			globsOK("party objects", pt.Objects)
			for _, g := range pt.Objects {
				if decide.Norm(g.Pattern) != g.Pattern {
					t.Fatalf("party object %q not normalised", g.Pattern)
				}
			}
			if len(pt.Objects)+len(pt.Endpoint.Hosts)+len(pt.Endpoint.Prefixes) == 0 {
				t.Fatalf("party %q selects nothing", pt.Name)
			}
		}
	}
	for _, pt := range p.Internal {
		if pt.Clearance != p.TopLevel() {
			t.Fatalf("internal channel %q has clearance %d, want the top level", pt.Name, pt.Clearance)
		}
	}
	for _, r := range p.Refuse {
		globsOK("refuse ops", r.Ops)
		globsOK("refuse paths", r.Paths)
		endpoint("refuse "+r.Name, r.Net)
		if len(r.Paths)+len(r.Net.Hosts)+len(r.Net.Prefixes)+len(r.Values) == 0 {
			if len(r.Ops) == 0 {
				t.Fatalf("refuse rule %q has no selector", r.Name)
			}
			for _, g := range r.Ops {
				if strings.Trim(g.Pattern, "*") == "" {
					t.Fatalf("refuse rule %q refuses everything", r.Name)
				}
			}
		}
		for _, v := range r.Values {
			if v == "" || decide.Norm(v) != v {
				t.Fatalf("refuse value %q not normalised", v)
			}
		}
	}
	kindOK := func(k decide.Kind) bool { return k <= decide.Blocking }
	const allRoles = decide.DefaultGate | 1<<decide.RoleSelector | 1<<decide.RoleControl | 1<<decide.RoleContent
	for i, o := range p.Operations {
		if len(o.Ops) == 0 {
			t.Fatalf("operations[%d] has no ops", i)
		}
		globsOK("operation ops", o.Ops)
		if !kindOK(o.Kind) || o.Gate&^allRoles != 0 {
			t.Fatalf("operations[%d]: kind %d gate %b", i, o.Kind, o.Gate)
		}
		for name, r := range o.Roles {
			if name == "" || r < decide.RoleTarget || r > decide.RoleContent {
				t.Fatalf("operations[%d]: role %q -> %d", i, name, r)
			}
		}
	}
	if !kindOK(p.DefaultOp.Kind) || len(p.DefaultOp.Ops) > 0 || p.DefaultOp.Gate&^allRoles != 0 {
		t.Fatalf("default operation %+v", p.DefaultOp)
	}
	ic := p.Intercept
	globsOK("intercept pass", ic.Pass)
	endpoint("intercept pass", decide.Endpoint{Hosts: ic.Pass})
	for i, port := range ic.Ports {
		if port == 0 || port == 443 || port == 53 || port == 80 || (i > 0 && port <= ic.Ports[i-1]) {
			t.Fatalf("intercept ports %v", ic.Ports)
		}
	}
	if ic.OnRefusedCA > decide.RefusedCAPass {
		t.Fatalf("intercept on_refused_ca %d", ic.OnRefusedCA)
	}
	if s := p.Summary(); !strings.HasPrefix(s, "policy f.yaml\n") {
		t.Fatalf("summary %q", s)
	}
}
