package decide_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/carbd/carbd/pkg/decide"
)

// policyCmp compares compiled policies; netip.Prefix is compared by value.
var policyCmp = []cmp.Option{cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty(), cmpopts.IgnoreUnexported(decide.Glob{}, decide.Policy{})}

func policyGlobs(ps ...string) []decide.Glob {
	var out []decide.Glob
	for _, p := range ps {
		out = append(out, decide.Glob{Pattern: p})
	}
	return out
}

func policyPrefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func policyRoleSet(rs ...decide.Role) decide.RoleSet {
	var s decide.RoleSet
	for _, r := range rs {
		s = s.With(r)
	}
	return s
}

var policyDefaultOp = decide.OpSpec{Gate: decide.DefaultGate}

// policyValidCases are valid policies and what they compile to. The fuzz
// target seeds its corpus with them.
var policyValidCases = []struct {
	name string
	yaml string
	want decide.Policy
}{{
	name: "minimal",
	yaml: "version: 1\nlevels: [public]\n",
	want: decide.Policy{Levels: []string{"public"}, TaskTrusted: true, DefaultOp: policyDefaultOp},
}, {
	name: "empty sections are absent",
	yaml: "version: 1\nlevels: [public, secret]\ntrusted:\nsensitive:\nparties: []\nrefuse:\noperations:\ndefaults:\n",
	want: decide.Policy{Levels: []string{"public", "secret"}, TaskTrusted: true, DefaultOp: policyDefaultOp},
}, {
	name: "trusted values, hosts and addresses are normalised",
	yaml: `version: 1
levels: [public, internal, secret]
trusted:
  task: false
  values: [" Alice@Example.COM ", "alice@example.com", 12345, "GB29 NWBK 6016"]
  paths: ["docs/**", README.md]
  hosts: ["API.GitHub.com.", "*.Example.org"]
  cidrs: ["10.1.2.3", "fd00::/8", "2001:DB8::1"]
  ports: [443, 0x50]
  objects: ["tool:get_user_info"]
`,
	want: decide.Policy{
		Levels: []string{"public", "internal", "secret"}, TaskTrusted: false,
		TrustedValues: []string{"alice@example.com", "12345", "gb29nwbk6016"},
		Trusted: []decide.Source{{
			Paths: policyGlobs("docs/**", "README.md"),
			Net: decide.Endpoint{Hosts: policyGlobs("api.github.com", "*.example.org"),
				Prefixes: policyPrefixes("10.1.2.3/32", "fd00::/8", "2001:db8::1/128"), Ports: []uint16{443, 80}},
			Objects: policyGlobs("tool:get_user_info"),
		}},
		DefaultOp: policyDefaultOp,
	},
}, {
	name: "sensitive sources, parties and internal channels",
	yaml: `version: 1
levels: [public, internal, secret]
sensitive:
  - name: keys
    level: secret
    paths: ["**/*.pem"]
  - name: corp
    level: internal
    hosts: [corp.example.com]
    ports: [443]
parties:
  - name: github
    hosts: ["github.com", "*.github.com"]
    cidrs: ["140.82.112.0/20"]
    ports: [443]
    clearance: internal
  - name: mail
    objects: ["Bob @Example.com"]
    clearance: public
internal:
  - name: model-provider
    hosts: [api.openai.com]
unknown_parties: defer
`,
	want: decide.Policy{
		Levels: []string{"public", "internal", "secret"}, TaskTrusted: true,
		Sensitive: []decide.SensitiveSource{
			{Name: "keys", Source: decide.Source{Paths: policyGlobs("**/*.pem")}, Level: 2},
			{Name: "corp", Source: decide.Source{Net: decide.Endpoint{Hosts: policyGlobs("corp.example.com"), Ports: []uint16{443}}}, Level: 1},
		},
		Parties: []decide.Party{
			{Name: "github", Endpoint: decide.Endpoint{Hosts: policyGlobs("github.com", "*.github.com"),
				Prefixes: policyPrefixes("140.82.112.0/20"), Ports: []uint16{443}}, Clearance: 1},
			{Name: "mail", Objects: policyGlobs("bob@example.com"), Clearance: 0},
		},
		// Internal channels are released: they carry the top level.
		Internal:          []decide.Party{{Name: "model-provider", Endpoint: decide.Endpoint{Hosts: policyGlobs("api.openai.com")}, Clearance: 2}},
		UnknownPartyDefer: true,
		DefaultOp:         policyDefaultOp,
	},
}, {
	name: "refuse rules",
	yaml: `version: 1
levels: [public]
refuse:
  - name: git-hooks
    ops: ["file:*"]
    paths: [".git/hooks/**"]
  - name: metadata
    cidrs: ["169.254.0.0/16", "fd00:ec2::254/128"]
    hosts: [metadata.google.internal]
    ports: [80]
  - name: token
    values: ["  SECRET Token "]
`,
	want: decide.Policy{
		Levels: []string{"public"}, TaskTrusted: true,
		Refuse: []decide.RefuseRule{
			{Name: "git-hooks", Ops: policyGlobs("file:*"), Paths: policyGlobs(".git/hooks/**")},
			{Name: "metadata", Net: decide.Endpoint{Hosts: policyGlobs("metadata.google.internal"),
				Prefixes: policyPrefixes("169.254.0.0/16", "fd00:ec2::254/128"), Ports: []uint16{80}}},
			{Name: "token", Values: []string{"secrettoken"}},
		},
		DefaultOp: policyDefaultOp,
	},
}, {
	name: "operations inherit the defaults",
	yaml: `version: 1
levels: [public]
operations:
  - ops: ["http:GET", "dns:query"]
    kind: blocking
    gate: [target]
  - ops: ["http:*"]
  - ops: ["tool:send_money"]
    kind: stallable
    roles: {recipient: target, amount: control}
    dest_field: recipient
    financial: true
    external: false
  - ops: ["file:*"]
    kind: auto
    gate: []
defaults:
  kind: stallable
  gate: [target, credential, command, selector]
  external: true
  message: true
`,
	want: decide.Policy{
		Levels: []string{"public"}, TaskTrusted: true,
		Operations: []decide.OpSpec{
			{Ops: policyGlobs("http:GET", "dns:query"), Kind: decide.Blocking, Gate: policyRoleSet(decide.RoleTarget), External: true, Message: true},
			{Ops: policyGlobs("http:*"), Kind: decide.Stallable,
				Gate:     policyRoleSet(decide.RoleTarget, decide.RoleCredential, decide.RoleCommand, decide.RoleSelector),
				External: true, Message: true},
			{Ops: policyGlobs("tool:send_money"), Kind: decide.Stallable,
				Gate:      policyRoleSet(decide.RoleTarget, decide.RoleCredential, decide.RoleCommand, decide.RoleSelector),
				Roles:     map[string]decide.Role{"recipient": decide.RoleTarget, "amount": decide.RoleControl},
				DestField: "recipient", Financial: true, Message: true},
			{Ops: policyGlobs("file:*"), Kind: decide.KindUnset, Gate: 0, External: true, Message: true},
		},
		DefaultOp: decide.OpSpec{Kind: decide.Stallable,
			Gate:     policyRoleSet(decide.RoleTarget, decide.RoleCredential, decide.RoleCommand, decide.RoleSelector),
			External: true, Message: true},
	},
}}

func TestParsePolicyValid(t *testing.T) {
	for _, tt := range policyValidCases {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decide.ParsePolicy("t.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatalf("ParsePolicy: %v", err)
			}
			tt.want.Name = "t.yaml"
			if d := cmp.Diff(&tt.want, got, policyCmp...); d != "" {
				t.Errorf("compiled policy (-want +got):\n%s", d)
			}
		})
	}
}

// policyErrorCases are single mistakes and the exact errors they produce.
// The fuzz target seeds its corpus with them.
var policyErrorCases = []struct {
	name string
	yaml string
	want []string
}{
	{"empty file", "", []string{"t.yaml: empty policy (want a mapping with version and levels)"}},
	{"comment only", "# nothing\n", []string{"t.yaml: empty policy (want a mapping with version and levels)"}},
	{"syntax error", "version: 1\nlevels: [public\n", []string{"t.yaml:2: yaml syntax: did not find expected ',' or ']'"}},
	{"tab indentation", "version: 1\nlevels: [public]\ntrusted:\n\ttask: true\n", []string{
		"t.yaml:4: yaml syntax: found character that cannot start any token"}},
	{"list in a mapping", "version: 1\nlevels: [public]\n- x\n", []string{
		"t.yaml:3: yaml syntax: did not find expected key"}},
	{"two documents", "version: 1\nlevels: [public]\n---\nversion: 1\n", []string{
		"t.yaml:3:1: more than one YAML document; a policy is a single document"}},
	{"not a mapping", "- version\n", []string{"t.yaml:1:1: want a mapping, got a list"}},
	{"missing version and levels", "trusted: {task: true}\n", []string{
		"t.yaml:1:1: version is required (version: 1)",
		"t.yaml:1:1: levels is required: the ordered sensitivity levels, lowest first (e.g. [public, internal, secret])"}},
	{"unsupported version", "version: 2\nlevels: [public]\n", []string{
		"t.yaml:1:10: version: unsupported version 2 (this carbd reads version 1)"}},
	{"version as a string", "version: \"1\"\nlevels: [public]\n", []string{
		`t.yaml:1:10: version: want an integer, got the string "1"`}},
	{"unknown top-level key with suggestion", "version: 1\nlevels: [public]\nparites: []\n", []string{
		`t.yaml:3:1: parites: unknown field (did you mean "parties"?)`}},
	{"unknown nested key", "version: 1\nlevels: [public]\ntrusted:\n  urls: [x]\n", []string{
		"t.yaml:4:3: trusted.urls: unknown field (want one of task, values, principal, paths, hosts, cidrs, ports, objects)"}},
	{"duplicate top-level key", "version: 1\nlevels: [public]\nversion: 1\n", []string{
		"t.yaml:3:1: version: repeated key (first given at line 1)"}},
	{"duplicate nested key", "version: 1\nlevels: [public]\nparties:\n  - name: a\n    hosts: [a.com]\n    clearance: public\n    hosts: [b.com]\n", []string{
		"t.yaml:7:5: parties[0].hosts: repeated key (first given at line 5)"}},
	{"levels not a list", "version: 1\nlevels: public\n", []string{
		`t.yaml:2:9: levels: want a list, got the string "public"`}},
	{"no levels", "version: 1\nlevels: []\n", []string{
		"t.yaml:2:9: levels: at least one level is required (e.g. [public, internal, secret])"}},
	{"duplicate level", "version: 1\nlevels: [public, secret, public]\n", []string{
		`t.yaml:2:26: levels[2]: level "public" is declared twice (first at line 2)`}},
	{"bad level name", "version: 1\nlevels: [public, \"top secret\"]\n", []string{
		`t.yaml:2:18: levels[1]: invalid level name "top secret" (want letters, digits, '.', '_' and '-', at most 64)`}},
	{"undeclared clearance", "version: 1\nlevels: [public, internal]\nparties:\n  - name: a\n    hosts: [a.com]\n    clearance: topsecret\n", []string{
		`t.yaml:6:16: parties[0].clearance: level "topsecret" is not declared in levels (declared: public, internal)`}},
	{"undeclared sensitive level", "version: 1\nlevels: [public]\nsensitive:\n  - name: k\n    level: secret\n    paths: [k]\n", []string{
		`t.yaml:5:12: sensitive[0].level: level "secret" is not declared in levels (declared: public)`}},
	{"no cascade from bad levels", "version: 1\nlevels: [public, public]\nparties:\n  - name: a\n    hosts: [a.com]\n    clearance: secret\n", []string{
		`t.yaml:2:18: levels[1]: level "public" is declared twice (first at line 2)`}},
	{"missing clearance, level and names", "version: 1\nlevels: [public]\nparties:\n  - hosts: [a.com]\nsensitive:\n  - name: s\n    paths: [s]\nrefuse:\n  - ops: [\"file:unlink\"]\n", []string{
		"t.yaml:4:5: parties[0]: name is required: every party is named in audit records",
		`t.yaml:4:5: parties[0]: clearance is required: the highest level of data "" may receive`,
		"t.yaml:6:5: sensitive[0]: level is required: the sensitivity of what this source yields",
		"t.yaml:9:5: refuse[0]: name is required: every refuse rule is named in audit records"}},
	{"bad name", "version: 1\nlevels: [public]\nrefuse:\n  - name: \"git hooks\"\n    paths: [.git/hooks/**]\n", []string{
		`t.yaml:4:11: refuse[0].name: invalid name "git hooks" (want letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64)`}},
	{"duplicate party name across internal", "version: 1\nlevels: [public]\nparties:\n  - name: a\n    hosts: [a.com]\n    clearance: public\ninternal:\n  - name: a\n    hosts: [b.com]\n", []string{
		`t.yaml:8:11: internal[0].name: name "a" is already used at line 4`}},
	{"duplicate refuse name", "version: 1\nlevels: [public]\nrefuse:\n  - name: r\n    paths: [a]\n  - name: r\n    paths: [b]\n", []string{
		`t.yaml:6:11: refuse[1].name: name "r" is already used at line 4`}},
	{"bad globs", "version: 1\nlevels: [public]\ntrusted:\n  paths: [\"docs/[abc\"]\n  objects: [\"tool:{a,b\"]\n", []string{
		`t.yaml:4:11: trusted.paths[0]: "docs/[abc" is not a valid glob (an unclosed [ or {, or a trailing \)`,
		`t.yaml:5:13: trusted.objects[0]: "tool:{a,b" is not a valid glob (an unclosed [ or {, or a trailing \)`}},
	{"bad paths", "version: 1\nlevels: [public]\ntrusted:\n  paths: [/etc/passwd, ../x, ./docs, ~/.ssh, \"\", a//b]\n", []string{
		`t.yaml:4:11: trusted.paths[0]: "/etc/passwd" is absolute; paths are relative to the working directory (drop the leading /)`,
		`t.yaml:4:24: trusted.paths[1]: "../x" leaves the working directory`,
		`t.yaml:4:30: trusted.paths[2]: "./docs" is not a clean path; write "docs"`,
		`t.yaml:4:38: trusted.paths[3]: "~/.ssh": ~ is not expanded; paths are relative to the working directory ("**/.ssh/**" matches at any depth)`,
		`t.yaml:4:46: trusted.paths[4]: empty path glob`,
		`t.yaml:4:50: trusted.paths[5]: "a//b" is not a clean path; write "a/b"`}},
	{"bad hosts", "version: 1\nlevels: [public]\ntrusted:\n  hosts: [\"https://a.com\", \"a.com:443\", 10.0.0.1, \"a b.com\", \"bücher.de\"]\n", []string{
		`t.yaml:4:11: trusted.hosts[0]: "https://a.com" is a URL; write the host name only`,
		`t.yaml:4:28: trusted.hosts[1]: "a.com:443" has a port; list ports under ports`,
		`t.yaml:4:41: trusted.hosts[2]: "10.0.0.1" is an address; list addresses under cidrs`,
		`t.yaml:4:51: trusted.hosts[3]: "a b.com": character ' ' is not allowed in a host glob`,
		`t.yaml:4:62: trusted.hosts[4]: "bücher.de" is not ASCII; write the IDNA (xn--) form`}},
	{"empty host labels", "version: 1\nlevels: [public]\ntrusted:\n  hosts: [\"a.com..\", \"a..com\"]\n", []string{
		`t.yaml:4:11: trusted.hosts[0]: "a.com.." has an empty label`,
		`t.yaml:4:22: trusted.hosts[1]: "a..com" has an empty label`}},
	{"addresses as hosts", "version: 1\nlevels: [public]\ntrusted:\n  hosts: [\"10.0.0.1.\", \"[fd00::1]\"]\n", []string{
		`t.yaml:4:11: trusted.hosts[0]: "10.0.0.1." is an address; list addresses under cidrs`,
		`t.yaml:4:24: trusted.hosts[1]: "[fd00::1]" is an address; list addresses under cidrs`}},
	{"bad cidrs", "version: 1\nlevels: [public]\nrefuse:\n  - name: r\n    cidrs: [10.0.0.0/33, 10.0.0.1/8, 300.1.1.1, \"::ffff:1.2.3.4\", \"fe80::1%eth0\", example.com, 10.0.0.0/08]\n", []string{
		`t.yaml:5:13: refuse[0].cidrs[0]: "10.0.0.0/33" is not a CIDR: prefix length "33" is not in 0..32`,
		`t.yaml:5:26: refuse[0].cidrs[1]: "10.0.0.1/8" has address bits set beyond /8; write "10.0.0.0/8"`,
		`t.yaml:5:38: refuse[0].cidrs[2]: "300.1.1.1" is not an IP address or CIDR (host names go under hosts)`,
		`t.yaml:5:49: refuse[0].cidrs[3]: "::ffff:1.2.3.4" is an IPv4-mapped IPv6 address; write it as IPv4`,
		`t.yaml:5:67: refuse[0].cidrs[4]: "fe80::1%eth0" has a zone; zones are not supported`,
		`t.yaml:5:83: refuse[0].cidrs[5]: "example.com" is not an IP address or CIDR (host names go under hosts)`,
		`t.yaml:5:96: refuse[0].cidrs[6]: "10.0.0.0/08" is not a CIDR: prefix length "08" is not in 0..32`}},
	{"bad ports", "version: 1\nlevels: [public]\nparties:\n  - name: a\n    hosts: [a.com]\n    ports: [0, 65536, \"443\", -1]\n    clearance: public\n", []string{
		"t.yaml:6:13: parties[0].ports[0]: port 0 is out of range 1..65535",
		"t.yaml:6:16: parties[0].ports[1]: port 65536 is out of range 1..65535",
		`t.yaml:6:23: parties[0].ports[2]: want an integer, got the string "443"`,
		"t.yaml:6:30: parties[0].ports[3]: port -1 is out of range 1..65535"}},
	{"ports without hosts or cidrs", "version: 1\nlevels: [public]\nrefuse:\n  - name: smtp\n    ports: [25]\n", []string{
		`t.yaml:4:5: refuse[0]: refuse rule "smtp" has no selector and would refuse every effect: give ops, paths, hosts, cidrs or values`,
		`t.yaml:5:12: refuse[0].ports: ports apply to hosts or cidrs and none are given (for any address use cidrs: [0.0.0.0/0, "::/0"])`}},
	{"wrong scalar types", "version: 1\nlevels: [public]\ntrusted:\n  task: \"yes\"\n  values: [true, ~, {a: b}]\n", []string{
		`t.yaml:4:9: trusted.task: want true or false, got the string "yes"`,
		"t.yaml:5:12: trusted.values[0]: want a string, got the boolean true (quote it if you mean the text)",
		"t.yaml:5:18: trusted.values[1]: want a string, got null (quote it if you mean the text)",
		"t.yaml:5:21: trusted.values[2]: want a string, got a mapping"}},
	{"empty value", "version: 1\nlevels: [public]\ntrusted:\n  values: [\" \\t \"]\n", []string{
		"t.yaml:4:12: trusted.values[0]: empty value (values are compared with whitespace removed)"}},
	{"refuse rule without selector", "version: 1\nlevels: [public]\nrefuse:\n  - name: oops\n    paths: []\n", []string{
		`t.yaml:4:5: refuse[0]: refuse rule "oops" has no selector and would refuse every effect: give ops, paths, hosts, cidrs or values`}},
	{"refuse rule with only a match-all op", "version: 1\nlevels: [public]\nrefuse:\n  - name: all\n    ops: [\"file:unlink\", \"*\"]\n", []string{
		`t.yaml:5:26: refuse[0].ops[1]: refuse rule "all" would refuse every effect ("*" with no paths, hosts, cidrs or values)`}},
	{"sensitive and party select nothing", "version: 1\nlevels: [public]\nsensitive:\n  - name: s\n    level: public\nparties:\n  - name: p\n    clearance: public\n", []string{
		`t.yaml:4:5: sensitive[0]: sensitive source "s" selects nothing: give paths, hosts, cidrs or objects`,
		`t.yaml:7:5: parties[0]: party "p" selects nothing: give hosts, cidrs or objects`}},
	{"internal takes no clearance", "version: 1\nlevels: [public]\ninternal:\n  - name: m\n    hosts: [m.com]\n    clearance: public\n", []string{
		`t.yaml:6:5: internal[0].clearance: unknown field (want one of name, hosts, cidrs, ports, objects)`}},
	{"unknown parties value", "version: 1\nlevels: [public]\nunknown_parties: refuse\n", []string{
		`t.yaml:3:18: unknown_parties: unknown value "refuse" (want public or defer)`}},
	{"bad kind and roles", "version: 1\nlevels: [public]\noperations:\n  - ops: [\"tool:x\"]\n    kind: held\n    gate: [target, owner, target]\n    roles: {to: recipient, \"\": target}\n", []string{
		`t.yaml:5:11: operations[0].kind: unknown kind "held" (want stageable, stallable, blocking or auto)`,
		`t.yaml:6:20: operations[0].gate[1]: unknown role "owner" (want target, credential, command, selector, control or content)`,
		"t.yaml:6:27: operations[0].gate[2]: role target is listed twice",
		`t.yaml:7:17: operations[0].roles.to: unknown role "recipient" (want target, credential, command, selector, control or content)`,
		"t.yaml:7:28: operations[0].roles: empty field name"}},
	{"operation without ops", "version: 1\nlevels: [public]\noperations:\n  - kind: blocking\n", []string{
		"t.yaml:4:5: operations[0]: ops is required: an operation entry without ops applies to nothing"}},
	{"shadowed operations", "version: 1\nlevels: [public]\noperations:\n  - ops: [\"http:*\"]\n  - ops: [\"http:POST\", \"dns:query\", \"http:*\"]\n  - ops: [\"*\"]\n  - ops: [\"tls:*\"]\n", []string{
		`t.yaml:5:11: operations[1].ops[0]: "http:POST" is never used: operations[0] ("http:*") matches it first`,
		`t.yaml:5:37: operations[1].ops[2]: "http:*" is never used: operations[0] ("http:*") matches it first`,
		`t.yaml:7:11: operations[3].ops[0]: "tls:*" is never used: operations[2] ("*") matches it first`}},
	{"defaults take no ops", "version: 1\nlevels: [public]\ndefaults:\n  ops: [\"*\"]\n", []string{
		`t.yaml:4:3: defaults.ops: unknown field (want one of kind, gate, on_untrusted, financial, irreversible, message, external)`}},
	{"aliases and merge keys", "version: 1\nlevels: [public]\nparties:\n  - &p {name: a, hosts: [a.com], clearance: public}\n  - <<: *p\n    name: b\n  - *p\n", []string{
		"t.yaml:5:5: parties[1]: merge keys (<<) are not supported; write the fields out",
		`t.yaml:5:5: parties[1]: clearance is required: the highest level of data "b" may receive`,
		`t.yaml:5:5: parties[1]: party "b" selects nothing: give hosts, cidrs or objects`,
		"t.yaml:7:5: parties[2]: aliases (*p) are not supported; write the value out"}},
	{"custom tag", "version: 1\nlevels: [!secret public]\n", []string{
		"t.yaml:2:10: levels[0]: unsupported tag !secret"}},
	{"credentials", "version: 1\nlevels: [public]\nparties:\n  - {name: gh, hosts: [github.com], clearance: public}\ncredentials:\n  - {name: GH_TOKEN, parties: [gh, gl]}\n  - {name: 9LIVES, hosts: [x.com]}\n  - {name: GH_TOKEN, cidrs: [10.0.0.0/8], level: top}\n  - {name: NOWHERE}\n  - {parties: [gh]}\n", []string{
		`t.yaml:6:36: credentials[0].parties[1]: party "gl" is not declared in parties or internal`,
		`t.yaml:7:12: credentials[1].name: invalid name "9LIVES" (want an environment variable name: letters, digits and '_', not starting with a digit)`,
		`t.yaml:8:12: credentials[2].name: credential "GH_TOKEN" is already declared at line 6`,
		`t.yaml:8:50: credentials[2].level: level "top" is not declared in levels (declared: public)`,
		`t.yaml:9:5: credentials[3]: credential "NOWHERE" is bound to nothing: give parties, hosts or cidrs (a credential no party may receive need not be declared: carbd refuses to send it anywhere)`,
		`t.yaml:10:5: credentials[4]: name is required: the environment variable that holds the credential`}},
	{"on_untrusted", "version: 1\nlevels: [public]\noperations:\n  - {ops: [\"dns:query\"], on_untrusted: drop}\n", []string{
		`t.yaml:4:40: operations[0].on_untrusted: unknown value "drop" (want defer or refuse)`}},
}

func TestParsePolicyErrors(t *testing.T) {
	for _, tt := range policyErrorCases {
		t.Run(tt.name, func(t *testing.T) {
			pol, err := decide.ParsePolicy("t.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParsePolicy succeeded, want errors:\n%s", strings.Join(tt.want, "\n"))
			}
			if pol != nil {
				t.Errorf("ParsePolicy returned a policy with its errors")
			}
			if !errors.Is(err, decide.ErrInvalidPolicy) {
				t.Errorf("error does not match ErrInvalidPolicy: %v", err)
			}
			got := strings.Split(err.Error(), "\n")
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("errors (-want +got):\n%s", d)
			}
		})
	}
}

func TestParsePolicyReportsEveryError(t *testing.T) {
	file := filepath.Join("testdata", "policy", "invalid-many.yaml")
	pol, err := decide.LoadPolicy(file)
	if pol != nil {
		t.Fatal("LoadPolicy returned a policy for an invalid file")
	}
	var list decide.PolicyErrors
	if !errors.As(err, &list) {
		t.Fatalf("error is %T, want decide.PolicyErrors: %v", err, err)
	}
	var got []string
	for _, e := range list {
		if e.File != file {
			t.Errorf("error names file %q, want %q", e.File, file)
		}
		got = append(got, e.Error())
	}
	f := file + ":"
	want := []string{
		f + "1:10: version: unsupported version 2 (this carbd reads version 1)",
		f + `4:9: trusted.task: want true or false, got the string "yes"`,
		f + `5:11: trusted.paths[0]: "/etc/passwd" is absolute; paths are relative to the working directory (drop the leading /)`,
		f + `6:11: trusted.hosts[0]: "https://example.com" is a URL; write the host name only`,
		f + `9:12: sensitive[0].level: level "secret" is not declared in levels (declared: public, internal)`,
		f + "14:13: parties[0].ports[0]: port 0 is out of range 1..65535",
		f + `16:11: parties[1].name: name "registry" is already used at line 12`,
		f + `17:13: parties[1].cidrs[0]: "10.0.0.1/8" has address bits set beyond /8; write "10.0.0.0/8"`,
		f + `20:5: refuse[0]: refuse rule "everything" has no selector and would refuse every effect: give ops, paths, hosts, cidrs or values`,
		f + `24:11: operations[1].ops[0]: "http:POST" is never used: operations[0] ("http:*") matches it first`,
		f + `26:20: operations[1].gate[1]: unknown role "owner" (want target, credential, command, selector, control or content)`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("errors (-want +got):\n%s", d)
	}
	// errors.As reaches the individual errors, too.
	var one *decide.PolicyError
	if !errors.As(err, &one) || one.Line != 1 || one.Column != 10 || one.Path != "version" {
		t.Errorf("errors.As(*PolicyError) = %+v", one)
	}
}

func TestParsePolicyCapsErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nlevels: [public]\ntrusted:\n  ports: [")
	for i := 0; i < 300; i++ {
		b.WriteString("0, ")
	}
	b.WriteString("0]\n")
	_, err := decide.ParsePolicy("t.yaml", []byte(b.String()))
	var list decide.PolicyErrors
	if !errors.As(err, &list) {
		t.Fatalf("error is %T: %v", err, err)
	}
	// 301 bad ports and one "ports apply to hosts or cidrs": the first 100
	// are shown, then a count of the rest.
	if len(list) != 101 || list[100].Msg != "202 more errors not shown" {
		t.Errorf("got %d errors, last %q", len(list), list[len(list)-1].Error())
	}
}

func TestLoadPolicyFileErrors(t *testing.T) {
	_, err := decide.LoadPolicy(filepath.Join(t.TempDir(), "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, decide.ErrInvalidPolicy) {
		t.Errorf("missing file: %v", err)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "decide: read policy: ") {
		t.Errorf("missing file error %q lacks the package prefix", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("version: 1\n"+strings.Repeat("#", 5<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = decide.LoadPolicy(big)
	if err == nil || !errors.Is(err, decide.ErrInvalidPolicy) || !strings.Contains(err.Error(), big+": file is larger than") {
		t.Errorf("oversized file: %v", err)
	}
}

func loadExamplePolicy(t testing.TB) *decide.Policy {
	t.Helper()
	pol, err := decide.LoadPolicy(filepath.Join("..", "..", "examples", "policy.yaml"))
	if err != nil {
		t.Fatalf("examples/policy.yaml: %v", err)
	}
	return pol
}

// TestExamplePolicy checks that examples/policy.yaml says what its
// comments say, through the compiled policy's queries.
func TestExamplePolicy(t *testing.T) {
	pol := loadExamplePolicy(t)
	fileEv := func(op, obj string) *decide.Event {
		return &decide.Event{Ch: decide.ChanFile, Dir: decide.Out, Op: op, Obj: obj}
	}
	netEv := func(op, host, addr string, port uint16) *decide.Event {
		d := &decide.Dest{Host: host, Port: port}
		if addr != "" {
			d.Addr = netip.MustParseAddr(addr)
		}
		return &decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: op, Obj: host, Dest: d}
	}
	refuse := []struct {
		ev   *decide.Event
		rule string // "" = not refused
	}{
		{fileEv("file:write", ".git/hooks/pre-commit"), "git-hooks"},
		{fileEv("file:chmod", ".git/hooks"), "git-hooks"},
		{fileEv("file:unlink", ".git"), "git-history"},
		{fileEv("file:rmdir", ".git/objects/ab"), "git-history"},
		{fileEv("file:unlink", ".git/objects/ab/cdef0123"), "git-history"},
		{fileEv("file:write", ".git/config"), "git-config"},
		// A commit writes objects and renames lock files into place.
		{fileEv("file:write", ".git/objects/ab/cdef0123"), ""},
		{fileEv("file:rename", ".git/refs/heads/main"), ""},
		{fileEv("file:write", "src/main.go"), ""},
		{netEv("http:GET", "", "169.254.169.254", 80), "cloud-metadata"},
		{netEv("http:GET", "", "fd00:ec2::254", 80), "cloud-metadata"},
		{netEv("http:GET", "", "::ffff:169.254.169.254", 80), "cloud-metadata"},
		{netEv("dns:query", "Metadata.Google.Internal.", "", 53), "cloud-metadata"},
		{netEv("http:GET", "registry.npmjs.org", "104.16.0.1", 443), ""},
		{&decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: "http:POST", Obj: "paste.example",
			Dest:   &decide.Dest{Host: "paste.example", Port: 443},
			Fields: []decide.Field{{Name: "body", Role: decide.RoleContent, Value: "GHP_ExampleCiTokenDoNotUse0000000000000"}}}, "ci-secrets-exfil"},
	}
	for _, tt := range refuse {
		r, ok := pol.MatchRefuse(tt.ev)
		got := ""
		if ok {
			got = r.Name
		}
		if got != tt.rule {
			t.Errorf("MatchRefuse(%s %s %+v) = %q, want %q", tt.ev.Op, tt.ev.Obj, tt.ev.Dest, got, tt.rule)
		}
	}

	labels := []struct {
		ev   *decide.Event
		want decide.Label
	}{
		{&decide.Event{Ch: decide.ChanCtrl, Dir: decide.In, Obj: "principal"}, decide.Label{Integrity: decide.Trusted}},
		{&decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: "docs/setup.md"}, decide.Label{Integrity: decide.Trusted}},
		{&decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: ".env"}, decide.Label{Level: 3}},
		{&decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: "deploy/home/.ssh/id_ed25519"}, decide.Label{Level: 3}},
		{&decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: "data/customers/2024.csv"}, decide.Label{Level: 2}},
		{&decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: "src/main.go"}, decide.Label{}},
		{&decide.Event{Ch: decide.ChanNet, Dir: decide.In, Obj: "api.example.com",
			Dest: &decide.Dest{Host: "api.example.com", Port: 443}}, decide.Label{Integrity: decide.Trusted, Level: 1}},
	}
	for _, tt := range labels {
		if got := pol.SourceLabel(tt.ev); got != tt.want {
			t.Errorf("SourceLabel(%s %s) = %+v, want %+v", tt.ev.Ch, tt.ev.Obj, got, tt.want)
		}
	}

	parties := []struct {
		ev        *decide.Event
		dest      string
		name      string
		clearance string
	}{
		{netEv("http:GET", "registry.npmjs.org", "", 443), "", "npm-registry", "public"},
		{netEv("http:GET", "registry.npmjs.org", "", 80), "", "", ""},
		{netEv("http:POST", "", "10.20.3.4", 8443), "", "company-api", "confidential"},
		{&decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: "tool:send_email", Obj: "send_email"}, "Alice@Example.com", "company-mail", "internal"},
		{netEv("http:POST", "evil.example.net", "", 443), "", "", ""},
	}
	for _, tt := range parties {
		pt, ok := pol.Party(tt.ev, tt.dest)
		name, clr := "", ""
		if ok {
			name, clr = pt.Name, pol.LevelName(pt.Clearance)
		}
		if name != tt.name || clr != tt.clearance {
			t.Errorf("Party(%+v, %q) = %q (%s), want %q (%s)", tt.ev.Dest, tt.dest, name, clr, tt.name, tt.clearance)
		}
	}
	if in, ok := pol.InternalChannel(netEv("http:POST", "api.openai.com", "", 443)); !ok || in.Name != "model-provider" {
		t.Errorf("InternalChannel(api.openai.com) = %v, %v", in, ok)
	}
	if pol.UnknownPartyDefer {
		t.Error("unknown_parties: public compiled to defer")
	}

	ops := []struct {
		op           string
		kind         decide.Kind
		gate         decide.RoleSet
		irreversible bool
	}{
		{"http:GET", decide.Blocking, policyRoleSet(decide.RoleTarget, decide.RoleCredential), false},
		{"http:POST", decide.Stallable, decide.DefaultGate, false},
		{"dns:query", decide.Blocking, policyRoleSet(decide.RoleTarget), false},
		{"tls:clienthello", decide.Blocking, policyRoleSet(decide.RoleTarget), false},
		{"file:unlink", decide.Stageable, policyRoleSet(decide.RoleTarget), true},
		{"file:write", decide.Stageable, policyRoleSet(decide.RoleTarget, decide.RoleCommand), false},
		{"icmp:echo", decide.Blocking, policyRoleSet(decide.RoleTarget), false},
		{"udp:send", decide.Blocking, decide.DefaultGate, false},
		{"opaque:tcp", decide.Blocking, decide.DefaultGate, false},
		{"smtp:send", decide.Blocking, decide.DefaultGate, false}, // the defaults
	}
	for _, tt := range ops {
		s := pol.Operation(tt.op)
		if s.Kind != tt.kind || s.Gate != tt.gate || s.Irreversible != tt.irreversible {
			t.Errorf("Operation(%s) = kind %s gate %b irreversible %v, want %s %b %v", tt.op, s.Kind, s.Gate, s.Irreversible, tt.kind, tt.gate, tt.irreversible)
		}
	}
	if s := pol.Operation("tool:send_email"); s.DestField != "recipients" || s.Roles["recipients"] != decide.RoleTarget || !s.Message {
		t.Errorf("Operation(tool:send_email) = %+v", s)
	}
}

// TestPolicyYAMLRoundTrip: the canonical form of a compiled policy parses
// back to the same policy, and is itself a fixed point.
func TestPolicyYAMLRoundTrip(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "policy", "valid-*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no valid test policies: %v", err)
	}
	files = append(files, filepath.Join("..", "..", "examples", "policy.yaml"))
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			pol, err := decide.LoadPolicy(file)
			if err != nil {
				t.Fatal(err)
			}
			out, err := pol.YAML()
			if err != nil {
				t.Fatal(err)
			}
			again, err := decide.ParsePolicy(file, out)
			if err != nil {
				t.Fatalf("canonical form does not parse: %v\n%s", err, out)
			}
			if d := cmp.Diff(pol, again, policyCmp...); d != "" {
				t.Errorf("round trip changed the policy (-first +second):\n%s\ncanonical form:\n%s", d, out)
			}
			out2, err := again.YAML()
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(string(out), string(out2)); d != "" {
				t.Errorf("canonical form is not a fixed point (-first +second):\n%s", d)
			}
		})
	}
}

func TestPolicyYAMLRejectsWhatTheFormatCannotSay(t *testing.T) {
	for _, pol := range []*decide.Policy{
		{Levels: []string{"public"}, Trusted: []decide.Source{{}, {}}},
		{Levels: []string{"public"}, Parties: []decide.Party{{Name: "a", Clearance: 3}}},
		{Levels: []string{"public"}, DefaultOp: decide.OpSpec{Ops: policyGlobs("*")}},
	} {
		if out, err := pol.YAML(); err == nil {
			t.Errorf("YAML() of %+v succeeded:\n%s", pol, out)
		}
	}
}

func TestPolicySummary(t *testing.T) {
	pol, err := decide.LoadPolicy(filepath.Join("testdata", "policy", "valid-banking.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := `policy testdata/policy/valid-banking.yaml
  levels      public < private
  trusted     task trusted, 2 values, 0 paths, 0 hosts, 0 cidrs, 2 objects
  sensitive   1 source: account-data (private)
  parties     1 party: landlord (private); unknown parties are deferred
  internal    0 channels
  refuse      0 rules
  operations  4 entries, first match wins; otherwise stallable, gate target,credential,command
`
	if d := cmp.Diff(want, pol.Summary()); d != "" {
		t.Errorf("Summary (-want +got):\n%s", d)
	}
}

func BenchmarkParsePolicyExample(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "policy.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decide.ParsePolicy("policy.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}

func ExampleParsePolicy() {
	pol, err := decide.ParsePolicy("policy.yaml", []byte(`
version: 1
levels: [public, secret]
sensitive:
  - name: keys
    level: secret
    paths: ["**/*.pem"]
parties:
  - name: github
    hosts: ["github.com", "*.github.com"]
    clearance: public
refuse:
  - name: git-hooks
    paths: [".git/hooks/**"]
operations:
  - ops: ["http:GET"]
    kind: blocking
  - ops: ["http:*"]
    kind: stallable
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	ev := &decide.Event{Ch: decide.ChanNet, Dir: decide.Out, Op: "http:POST",
		Dest: &decide.Dest{Host: "API.GitHub.com", Port: 443}}
	party, _ := pol.Party(ev, "")
	fmt.Println(party.Name, pol.LevelName(party.Clearance), pol.Operation(ev.Op).Kind)
	hook := &decide.Event{Ch: decide.ChanFile, Dir: decide.Out, Op: "file:write", Obj: ".git/hooks/pre-commit"}
	rule, _ := pol.MatchRefuse(hook)
	fmt.Println(rule.Name)
	// Output:
	// github public stallable
	// git-hooks
}

func ExamplePolicyErrors() {
	_, err := decide.ParsePolicy("policy.yaml", []byte(`version: 1
levels: [public, internal]
parties:
  - name: registry
    hosts: ["registry.npmjs.org:443"]
    clearance: topsecret
`))
	var list decide.PolicyErrors
	if errors.As(err, &list) {
		for _, e := range list {
			fmt.Println(e)
		}
	}
	// Output:
	// policy.yaml:5:13: parties[0].hosts[0]: "registry.npmjs.org:443" has a port; list ports under ports
	// policy.yaml:6:16: parties[0].clearance: level "topsecret" is not declared in levels (declared: public, internal)
}
