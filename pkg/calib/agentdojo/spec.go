package agentdojo

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/carbd/carbd/pkg/decide"
)

// Suites are the four AgentDojo suites.
var Suites = []string{"banking", "slack", "travel", "workspace"}

// SuiteSpec is what the operator's policy for a suite says about its tools:
// per tool the kind (blocking read, stallable state change, stageable write
// to the user's own drive), the role of each argument, the destination
// argument and the ledger flags. It is read from the same policy file the
// engine enforces (examples/agentdojo/<suite>.yaml), so the trace and the
// decisions agree.
type SuiteSpec struct {
	Suite  string
	Policy *decide.Policy
}

// ToolSpec is the policy's entry for one tool.
type ToolSpec struct {
	Op string // tool:<function>
	// Declared is false when no operation entry names the tool (a tool
	// the agent made up): the policy's defaults apply.
	Declared  bool
	Kind      decide.Kind
	Channel   decide.Channel // file for stageable tools, net otherwise
	Gate      decide.RoleSet
	Roles     map[string]decide.Role
	DestField string

	Financial, Irreversible, Message, External bool
}

// NewSuiteSpec wraps a compiled policy as the spec of a suite.
func NewSuiteSpec(suite string, p *decide.Policy) *SuiteSpec {
	return &SuiteSpec{Suite: suite, Policy: p}
}

// LoadSuiteSpec reads a suite's policy file; the suite is the file's base
// name (banking.yaml -> banking).
func LoadSuiteSpec(path string) (*SuiteSpec, error) {
	p, err := decide.LoadPolicy(path)
	if err != nil {
		return nil, fmt.Errorf("agentdojo: load suite spec: %w", err)
	}
	suite := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return NewSuiteSpec(suite, p), nil
}

// LoadSuiteSpecs reads <dir>/<suite>.yaml for every suite that has one.
func LoadSuiteSpecs(dir string) (map[string]*SuiteSpec, error) {
	out := map[string]*SuiteSpec{}
	for _, s := range Suites {
		p := filepath.Join(dir, s+".yaml")
		if _, err := os.Stat(p); err != nil {
			continue
		}
		sp, err := LoadSuiteSpec(p)
		if err != nil {
			return nil, err
		}
		out[s] = sp
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("agentdojo: no suite policy (%s.yaml) in %s", strings.Join(Suites, ".yaml, "), dir)
	}
	return out, nil
}

// Tool returns the spec of a tool: the policy's first operation entry
// matching tool:<function>, or its defaults.
func (s *SuiteSpec) Tool(function string) ToolSpec {
	op := "tool:" + function
	ts := ToolSpec{Op: op, Channel: decide.ChanNet, Kind: decide.Blocking, Gate: decide.DefaultGate}
	if s == nil || s.Policy == nil {
		return ts
	}
	o := s.Policy.Operation(op)
	ts.Declared = o != &s.Policy.DefaultOp
	if o.Kind != decide.KindUnset {
		ts.Kind = o.Kind
	}
	if ts.Kind == decide.Stageable {
		ts.Channel = decide.ChanFile
	}
	ts.Gate, ts.Roles, ts.DestField = o.Gate, o.Roles, o.DestField
	ts.Financial, ts.Irreversible, ts.Message, ts.External = o.Financial, o.Irreversible, o.Message, o.External
	return ts
}

// Role returns the role of a tool's argument: the policy's when it
// declares one (declared true), else GuessRole's.
func (s *SuiteSpec) Role(function, arg string) (r decide.Role, declared bool) {
	ts := s.Tool(function)
	if r, ok := ts.Roles[arg]; ok {
		return r, true
	}
	return GuessRole(arg), false
}

// Tools lists the tools the policy names explicitly (operation entries
// without glob characters), sorted.
func (s *SuiteSpec) Tools() []string {
	var out []string
	if s == nil || s.Policy == nil {
		return out
	}
	for _, o := range s.Policy.Operations {
		for _, g := range o.Ops {
			name, ok := strings.CutPrefix(g.Pattern, "tool:")
			if ok && !strings.ContainsAny(name, "*?[]{}\\") {
				out = append(out, name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// ReadOnly lists the named tools whose kind is blocking: reads, whose
// result the agent needs.
func (s *SuiteSpec) ReadOnly() []string {
	var out []string
	for _, t := range s.Tools() {
		if s.Tool(t).Kind == decide.Blocking {
			out = append(out, t)
		}
	}
	return out
}

// GuessRole assigns a role to an argument the policy does not declare (an
// argument the agent made up) from its name, with the vocabulary of the
// suite policies; a name it cannot place is a target, so that it is
// gated.
func GuessRole(arg string) decide.Role {
	a := strings.ToLower(arg)
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(a, w) {
				return true
			}
		}
		return false
	}
	switch {
	case has("password", "token", "secret", "api_key", "apikey", "credential"):
		return decide.RoleCredential
	case a == "command" || a == "cmd" || a == "script":
		return decide.RoleCommand
	case has("recipient", "email", "url", "participant", "user", "channel", "iban", "account") || a == "cc" || a == "bcc" || a == "to":
		return decide.RoleTarget
	case has("subject", "body", "content", "message", "description", "title", "text", "note", "street", "location"):
		return decide.RoleContent
	case has("amount", "date", "time", "day", "recurring", "permission") || a == "n":
		return decide.RoleControl
	case has("id", "query", "name", "file", "city", "restaurant", "hotel", "company", "parameters"):
		return decide.RoleSelector
	}
	return decide.RoleTarget
}
