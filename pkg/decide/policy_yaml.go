package decide

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	pathpkg "path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/bmatcuk/doublestar/v4"
	"go.yaml.in/yaml/v3"
)

// The policy file format is documented field by field in docs/policy.md;
// examples/policy.yaml is a complete, commented policy.

const (
	// PolicyVersion is the version of the policy format this parser reads.
	PolicyVersion = 1
	// maxPolicySize bounds a policy file: a policy is a short file, and a
	// bound keeps a wrong path (a log, a disk image) from being slurped.
	maxPolicySize = 4 << 20
	// maxPolicyErrors is how many located errors are reported at most.
	maxPolicyErrors = 100
	// maxPolicyNameLen bounds rule, party and level names.
	maxPolicyNameLen = 64
)

// ErrInvalidPolicy matches (errors.Is) every error ParsePolicy and
// LoadPolicy return for a policy file that does not validate.
var ErrInvalidPolicy = errors.New("decide: invalid policy")

// PolicyError is one problem in a policy file, located by line, column and
// field path. It prints as "FILE:LINE:COL: PATH: MESSAGE", e.g.
//
//	examples/policy.yaml:14:5: parties[2].clearance: level "topsecret" is not declared in levels
type PolicyError struct {
	File   string
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	Path   string // field path such as "parties[2].clearance"; empty for the document
	Msg    string
}

func (e *PolicyError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":" + strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// PolicyErrors is every problem found in a policy file, in file order, one
// per line when printed. It matches ErrInvalidPolicy with errors.Is, and
// errors.As finds each *PolicyError.
type PolicyErrors []*PolicyError

func (l PolicyErrors) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns the individual errors.
func (l PolicyErrors) Unwrap() []error {
	out := make([]error, len(l))
	for i, e := range l {
		out[i] = e
	}
	return out
}

// Is reports whether target is ErrInvalidPolicy.
func (l PolicyErrors) Is(target error) bool { return target == ErrInvalidPolicy }

// LoadPolicy reads and compiles the policy file at path; see ParsePolicy.
func LoadPolicy(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("decide: read policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPolicySize+1))
	if err != nil {
		return nil, fmt.Errorf("decide: read policy: %w", err)
	}
	return ParsePolicy(path, data)
}

// ParsePolicy compiles a policy file. name is the file's name, used in
// error messages and as the Policy's Name. The file is checked strictly:
// unknown or repeated keys, wrong types, bad globs, addresses and ports,
// undeclared levels, repeated names and rules that would select nothing or
// everything are errors. On any error ParsePolicy returns no Policy and a
// PolicyErrors listing every problem found, each located by line, column
// and field path.
func ParsePolicy(name string, data []byte) (*Policy, error) {
	if name == "" {
		name = "policy"
	}
	p := &policyParser{file: name}
	pol := p.parse(data)
	if len(p.errs) > 0 {
		return nil, p.result()
	}
	return pol, nil
}

// policyParser walks the YAML node tree and collects every error.
type policyParser struct {
	file   string
	errs   []*PolicyError
	levels map[string]Level // nil when levels did not validate
	names  []string         // declared level names, for messages
}

func (p *policyParser) errAt(n *yaml.Node, path, format string, args ...any) {
	e := &PolicyError{File: p.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	p.errs = append(p.errs, e)
}

func (p *policyParser) result() PolicyErrors {
	sort.SliceStable(p.errs, func(i, j int) bool {
		a, b := p.errs[i], p.errs[j]
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	if len(p.errs) > maxPolicyErrors {
		more := len(p.errs) - maxPolicyErrors
		p.errs = append(p.errs[:maxPolicyErrors:maxPolicyErrors],
			&PolicyError{File: p.file, Msg: fmt.Sprintf("%d more errors not shown", more)})
	}
	return PolicyErrors(p.errs)
}

var yamlSyntaxLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document decodes data into its single YAML document and returns the root
// node, or nil after recording why not.
func (p *policyParser) document(data []byte) *yaml.Node {
	if len(data) > maxPolicySize {
		p.errAt(nil, "", "file is larger than %d bytes; a policy is a short file", maxPolicySize)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			p.errAt(nil, "", "empty policy (want a mapping with version and levels)")
		} else {
			p.syntaxError(err)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == io.EOF:
	case err != nil:
		p.syntaxError(err)
		return nil
	default:
		p.errAt(&next, "", "more than one YAML document; a policy is a single document")
		return nil
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		p.errAt(nil, "", "empty policy (want a mapping with version and levels)")
		return nil
	}
	return doc.Content[0]
}

// yamlParserProblems are the messages of the YAML parser's (as opposed to
// its scanner's) errors. yaml v3 reports their line 0-based (it counts
// the line where the enclosing construct starts, or the problem's line
// when that is the first), while scanner errors are 1-based.
var yamlParserProblems = []string{
	"did not find expected <stream-start>", "did not find expected <document start>",
	"found undefined tag handle", "did not find expected node content",
	"did not find expected '-' indicator", "did not find expected key",
	"did not find expected ',' or ']'", "did not find expected ',' or '}'",
	"found duplicate %YAML directive", "found incompatible YAML document", "found duplicate %TAG directive",
}

func (p *policyParser) syntaxError(err error) {
	msg := err.Error()
	if m := yamlSyntaxLineRE.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		if slices.Contains(yamlParserProblems, m[2]) {
			line++
		}
		p.errs = append(p.errs, &PolicyError{File: p.file, Line: line, Msg: "yaml syntax: " + m[2]})
		return
	}
	p.errAt(nil, "", "yaml syntax: %s", strings.TrimPrefix(msg, "yaml: "))
}

var (
	policyTopKeys       = []string{"version", "levels", "trusted", "sensitive", "parties", "unknown_parties", "internal", "credentials", "refuse", "operations", "defaults", "intercept"}
	policyTrustedKeys   = []string{"task", "values", "principal", "paths", "hosts", "cidrs", "ports", "objects"}
	policySensitiveKeys = []string{"name", "level", "paths", "hosts", "cidrs", "ports", "objects"}
	policyPartyKeys     = []string{"name", "hosts", "cidrs", "ports", "objects", "clearance"}
	policyInternalKeys  = []string{"name", "hosts", "cidrs", "ports", "objects"}
	policyRefuseKeys    = []string{"name", "ops", "paths", "hosts", "cidrs", "ports", "values"}
	policyOpKeys        = []string{"ops", "kind", "gate", "on_untrusted", "roles", "dest_field", "financial", "irreversible", "message", "external"}
	policyDefaultsKeys  = []string{"kind", "gate", "on_untrusted", "financial", "irreversible", "message", "external"}
	policyCredKeys      = []string{"name", "parties", "hosts", "cidrs", "ports", "level"}
)

func (p *policyParser) parse(data []byte) *Policy {
	root := p.document(data)
	if root == nil {
		return nil
	}
	m, ok := p.fields(root, "", policyAllTopKeys, false)
	if !ok {
		return nil
	}
	pol := &Policy{Name: p.file, TaskTrusted: true}

	if v := m["version"]; nodePresent(v) {
		if n, ok := p.integer(v, "version"); ok && n != PolicyVersion {
			p.errAt(v, "version", "unsupported version %d (this carbd reads version %d)", n, PolicyVersion)
		}
	} else {
		p.errAt(root, "", "version is required (version: %d)", PolicyVersion)
	}
	if v := m["levels"]; v != nil {
		pol.Levels = p.parseLevels(v)
	} else {
		p.errAt(root, "", "levels is required: the ordered sensitivity levels, lowest first (e.g. [public, internal, secret])")
	}
	partyNames := map[string]*yaml.Node{}
	if v := m["trusted"]; nodePresent(v) {
		p.parseTrusted(v, pol)
	}
	if v := m["sensitive"]; nodePresent(v) {
		p.parseSensitive(v, pol)
	}
	if v := m["fields"]; nodePresent(v) {
		p.parseFields(v, pol) // fieldtrust_yaml.go
	}
	if v := m["parties"]; nodePresent(v) {
		pol.Parties = p.parseParties(v, "parties", partyNames, false)
	}
	if v := m["internal"]; nodePresent(v) {
		pol.Internal = p.parseParties(v, "internal", partyNames, true)
		for i := range pol.Internal {
			pol.Internal[i].Clearance = pol.TopLevel()
		}
	}
	if v := m["credentials"]; nodePresent(v) {
		p.parseCredentials(v, pol, partyNames)
	}
	if v := m["unknown_parties"]; nodePresent(v) {
		if s, ok := p.str(v, "unknown_parties"); ok {
			switch s {
			case "public":
			case "defer":
				pol.UnknownPartyDefer = true
			default:
				p.errAt(v, "unknown_parties", "unknown value %q (want public or defer)", s)
			}
		}
	}
	if v := m["refuse"]; nodePresent(v) {
		p.parseRefuse(v, pol)
	}
	pol.DefaultOp = OpSpec{Kind: KindUnset, Gate: DefaultGate}
	if v := m["defaults"]; nodePresent(v) {
		if dm, ok := p.fields(v, "defaults", policyDefaultsKeys, true); ok {
			p.parseOpFields(dm, "defaults", &pol.DefaultOp)
		}
	}
	if v := m["operations"]; nodePresent(v) {
		p.parseOperations(v, pol)
	}
	if v := m["intercept"]; nodePresent(v) {
		p.parseIntercept(v, pol)
	}
	return pol
}

// ---- generic node helpers ----

// nodePresent reports whether a key was given a non-null value. A key given
// no value ("hosts:") is the same as a key left out.
func nodePresent(n *yaml.Node) bool { return n != nil && !nodeIsNull(n) }

func nodeIsNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func fieldPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func itemPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// describeNode names what a node is, for "want X, got Y" messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.DocumentNode:
		return "a document"
	}
	switch t := n.ShortTag(); t {
	case "!!null":
		return "null"
	case "!!bool":
		return "the boolean " + n.Value
	case "!!int":
		return "the integer " + clipForMsg(n.Value)
	case "!!float":
		return "the number " + clipForMsg(n.Value)
	case "!!str":
		return "the string " + strconv.Quote(clipForMsg(n.Value))
	default:
		return "a " + t + " value"
	}
}

func clipForMsg(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// alias rejects YAML aliases: the parser does not expand them (an
// expansion bomb is one line long), and a policy is short enough to spell
// out.
func (p *policyParser) alias(n *yaml.Node, path string) bool {
	if n.Kind == yaml.AliasNode {
		p.errAt(n, path, "aliases (*%s) are not supported; write the value out", n.Value)
		return true
	}
	return false
}

type yamlKeyValue struct {
	key  string
	k, v *yaml.Node
}

// pairs checks that n is a mapping with plain, unrepeated keys and returns
// its entries in order. With allowNull a null node is an empty mapping.
func (p *policyParser) pairs(n *yaml.Node, path string, allowNull bool) ([]yamlKeyValue, bool) {
	if p.alias(n, path) {
		return nil, false
	}
	if allowNull && nodeIsNull(n) {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		p.errAt(n, path, "want a mapping, got %s", describeNode(n))
		return nil, false
	}
	seen := map[string]*yaml.Node{}
	var out []yamlKeyValue
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if p.alias(k, path) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.errAt(k, path, "keys must be plain strings, got %s", describeNode(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			p.errAt(k, path, "merge keys (<<) are not supported; write the fields out")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			p.errAt(k, fieldPath(path, k.Value), "repeated key (first given at line %d)", first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, yamlKeyValue{key: k.Value, k: k, v: v})
	}
	return out, true
}

// fields is pairs for a mapping with a fixed set of keys: it returns the
// values by key and reports any key not in known.
func (p *policyParser) fields(n *yaml.Node, path string, known []string, allowNull bool) (map[string]*yaml.Node, bool) {
	kvs, ok := p.pairs(n, path, allowNull)
	if !ok {
		return nil, false
	}
	m := make(map[string]*yaml.Node, len(kvs))
	for _, kv := range kvs {
		if !slices.Contains(known, kv.key) {
			if s := suggestKey(kv.key, known); s != "" {
				p.errAt(kv.k, fieldPath(path, kv.key), "unknown field (did you mean %q?)", s)
			} else {
				p.errAt(kv.k, fieldPath(path, kv.key), "unknown field (want one of %s)", strings.Join(known, ", "))
			}
			continue
		}
		m[kv.key] = kv.v
	}
	return m, true
}

// suggestKey returns the known key closest to a misspelt one, if any is close.
func suggestKey(key string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		if d := keyEditDistance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func keyEditDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// seq checks that n is a list (null: empty) and returns its items.
func (p *policyParser) seq(n *yaml.Node, path string) ([]*yaml.Node, bool) {
	if p.alias(n, path) {
		return nil, false
	}
	if nodeIsNull(n) {
		return nil, true
	}
	if n.Kind != yaml.SequenceNode {
		p.errAt(n, path, "want a list, got %s", describeNode(n))
		return nil, false
	}
	return n.Content, true
}

// nodeGiven reports whether a key holds a non-empty list (or any non-list
// value, which is then reported as a type error of its own).
func nodeGiven(n *yaml.Node) bool {
	if !nodePresent(n) {
		return false
	}
	return n.Kind != yaml.SequenceNode || len(n.Content) > 0
}

// str reads a string scalar. Numbers and dates are taken as the text they
// are written as; null and booleans are errors (quote them if meant).
func (p *policyParser) str(n *yaml.Node, path string) (string, bool) {
	if p.alias(n, path) {
		return "", false
	}
	if n.Kind != yaml.ScalarNode {
		p.errAt(n, path, "want a string, got %s", describeNode(n))
		return "", false
	}
	switch t := n.ShortTag(); t {
	case "!!str", "!!int", "!!float", "!!timestamp":
		return n.Value, true
	case "!!null", "!!bool":
		p.errAt(n, path, "want a string, got %s (quote it if you mean the text)", describeNode(n))
	default:
		p.errAt(n, path, "unsupported tag %s", t)
	}
	return "", false
}

func (p *policyParser) integer(n *yaml.Node, path string) (int64, bool) {
	if p.alias(n, path) {
		return 0, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.errAt(n, path, "want an integer, got %s", describeNode(n))
		return 0, false
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		p.errAt(n, path, "integer %s is out of range", clipForMsg(n.Value))
		return 0, false
	}
	return v, true
}

func (p *policyParser) boolean(n *yaml.Node, path string) (bool, bool) {
	if p.alias(n, path) {
		return false, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		p.errAt(n, path, "want true or false, got %s", describeNode(n))
		return false, false
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		p.errAt(n, path, "want true or false, got %s", describeNode(n))
		return false, false
	}
	return v, true
}

// ---- names and levels ----

var policyNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// name reads a required rule or party name and checks it is unique among
// seen (which it updates).
func (p *policyParser) name(m map[string]*yaml.Node, item *yaml.Node, path, what string, seen map[string]*yaml.Node) string {
	v := m["name"]
	if !nodePresent(v) {
		p.errAt(item, path, "name is required: every %s is named in audit records", what)
		return ""
	}
	s, ok := p.str(v, fieldPath(path, "name"))
	if !ok {
		return ""
	}
	if !policyNameRE.MatchString(s) || len(s) > maxPolicyNameLen {
		p.errAt(v, fieldPath(path, "name"), "invalid name %q (want letters, digits, '.', '_' and '-', starting with a letter or digit, at most %d)", clipForMsg(s), maxPolicyNameLen)
		return s
	}
	if first, dup := seen[s]; dup {
		p.errAt(v, fieldPath(path, "name"), "name %q is already used at line %d", s, first.Line)
		return s
	}
	seen[s] = v
	return s
}

func (p *policyParser) parseLevels(n *yaml.Node) []string {
	items, ok := p.seq(n, "levels")
	if !ok {
		return nil
	}
	if len(items) == 0 {
		p.errAt(n, "levels", "at least one level is required (e.g. [public, internal, secret])")
		return nil
	}
	if len(items) > 256 {
		p.errAt(n, "levels", "%d levels declared; at most 256", len(items))
		return nil
	}
	good := true
	idx := map[string]Level{}
	first := map[string]*yaml.Node{}
	var names []string
	for i, it := range items {
		ip := itemPath("levels", i)
		s, ok := p.str(it, ip)
		if !ok {
			good = false
			continue
		}
		switch {
		case !policyNameRE.MatchString(s) || len(s) > maxPolicyNameLen:
			p.errAt(it, ip, "invalid level name %q (want letters, digits, '.', '_' and '-', at most %d)", clipForMsg(s), maxPolicyNameLen)
			good = false
		case first[s] != nil:
			p.errAt(it, ip, "level %q is declared twice (first at line %d)", s, first[s].Line)
			good = false
		default:
			first[s] = it
			idx[s] = Level(len(names))
			names = append(names, s)
		}
	}
	if !good {
		return nil
	}
	p.levels, p.names = idx, names
	return names
}

// level resolves a level name. When the levels themselves did not
// validate it checks only the type, to avoid a cascade of errors.
func (p *policyParser) level(n *yaml.Node, path string) (Level, bool) {
	s, ok := p.str(n, path)
	if !ok || p.levels == nil {
		return 0, false
	}
	l, ok := p.levels[s]
	if !ok {
		p.errAt(n, path, "level %q is not declared in levels (declared: %s)", clipForMsg(s), strings.Join(p.names, ", "))
		return 0, false
	}
	return l, true
}

// ---- selectors: globs, addresses, ports, values ----

// policySelector is what the selector keys of a rule, source or party compile to.
type policySelector struct {
	paths   []Glob
	net     Endpoint
	objects []Glob
	values  []string
	ops     []Glob
}

// parseSelector reads the selector keys present in m (the caller's key
// list decides which are allowed). normObjects stores object globs
// normalised with Norm (party objects are matched against normalised
// values).
func (p *policyParser) parseSelector(m map[string]*yaml.Node, path string, normObjects bool) policySelector {
	var s policySelector
	if v := m["paths"]; nodePresent(v) {
		s.paths = p.list(v, fieldPath(path, "paths"), p.pathGlob)
	}
	if v := m["hosts"]; nodePresent(v) {
		s.net.Hosts = p.list(v, fieldPath(path, "hosts"), p.hostGlob)
	}
	if v := m["cidrs"]; nodePresent(v) {
		s.net.Prefixes = policyList(p, v, fieldPath(path, "cidrs"), p.prefix)
	}
	if v := m["ports"]; nodePresent(v) {
		s.net.Ports = policyList(p, v, fieldPath(path, "ports"), p.port)
		if !nodeGiven(m["hosts"]) && !nodeGiven(m["cidrs"]) && nodeGiven(v) {
			p.errAt(v, fieldPath(path, "ports"), "ports apply to hosts or cidrs and none are given (for any address use cidrs: [0.0.0.0/0, \"::/0\"])")
		}
	}
	if v := m["objects"]; nodePresent(v) {
		if normObjects {
			s.objects = p.list(v, fieldPath(path, "objects"), p.normObjectGlob)
		} else {
			s.objects = p.list(v, fieldPath(path, "objects"), p.objectGlob)
		}
	}
	if v := m["values"]; nodePresent(v) {
		s.values = policyList(p, v, fieldPath(path, "values"), p.value)
	}
	if v := m["ops"]; nodePresent(v) {
		s.ops = p.list(v, fieldPath(path, "ops"), p.opGlob)
	}
	return s
}

func (p *policyParser) list(n *yaml.Node, path string, item func(*yaml.Node, string) (Glob, bool)) []Glob {
	return policyList(p, n, path, item)
}

func policyList[T any](p *policyParser, n *yaml.Node, path string, item func(*yaml.Node, string) (T, bool)) []T {
	items, ok := p.seq(n, path)
	if !ok {
		return nil
	}
	var out []T
	for i, it := range items {
		if v, ok := item(it, itemPath(path, i)); ok {
			out = append(out, v)
		}
	}
	return out
}

func (p *policyParser) glob(n *yaml.Node, path, what, s string) (Glob, bool) {
	if s == "" {
		p.errAt(n, path, "empty %s", what)
		return Glob{}, false
	}
	if !doublestar.ValidatePattern(s) {
		p.errAt(n, path, "%q is not a valid glob (an unclosed [ or {, or a trailing \\)", clipForMsg(s))
		return Glob{}, false
	}
	return NewGlob(s), true
}

// pathGlob reads a file path glob, relative to the working directory.
func (p *policyParser) pathGlob(n *yaml.Node, path string) (Glob, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return Glob{}, false
	}
	switch {
	case strings.HasPrefix(s, "/"):
		p.errAt(n, path, "%q is absolute; paths are relative to the working directory (drop the leading /)", clipForMsg(s))
		return Glob{}, false
	case strings.HasPrefix(s, "~"):
		p.errAt(n, path, "%q: ~ is not expanded; paths are relative to the working directory (\"**/.ssh/**\" matches at any depth)", clipForMsg(s))
		return Glob{}, false
	case s == ".." || strings.HasPrefix(s, "../") || strings.HasSuffix(s, "/..") || strings.Contains(s, "/../"):
		p.errAt(n, path, "%q leaves the working directory", clipForMsg(s))
		return Glob{}, false
	case s != "" && pathpkg.Clean(s) != s:
		p.errAt(n, path, "%q is not a clean path; write %q", clipForMsg(s), pathpkg.Clean(s))
		return Glob{}, false
	}
	return p.glob(n, path, "path glob", s)
}

// hostGlob reads a host name glob, stored lowercase without a trailing dot.
func (p *policyParser) hostGlob(n *yaml.Node, path string) (Glob, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return Glob{}, false
	}
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
		p.errAt(n, path, "%q is an address; list addresses under cidrs", clipForMsg(s))
		return Glob{}, false
	}
	if strings.Contains(h, "://") {
		p.errAt(n, path, "%q is a URL; write the host name only", clipForMsg(s))
		return Glob{}, false
	}
	if strings.HasSuffix(h, ".") || strings.Contains(h, "..") {
		p.errAt(n, path, "%q has an empty label", clipForMsg(s))
		return Glob{}, false
	}
	for _, r := range h {
		switch {
		case 'a' <= r && r <= 'z', '0' <= r && r <= '9', strings.ContainsRune("-._*?[]{},!^\\", r):
		case r == ':':
			p.errAt(n, path, "%q has a port; list ports under ports", clipForMsg(s))
			return Glob{}, false
		case r > unicode.MaxASCII:
			p.errAt(n, path, "%q is not ASCII; write the IDNA (xn--) form", clipForMsg(s))
			return Glob{}, false
		default:
			p.errAt(n, path, "%q: character %q is not allowed in a host glob", clipForMsg(s), r)
			return Glob{}, false
		}
	}
	return p.glob(n, path, "host glob", h)
}

func (p *policyParser) objectGlob(n *yaml.Node, path string) (Glob, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return Glob{}, false
	}
	return p.glob(n, path, "object glob", s)
}

func (p *policyParser) normObjectGlob(n *yaml.Node, path string) (Glob, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return Glob{}, false
	}
	return p.glob(n, path, "object glob (after removing whitespace)", Norm(s))
}

func (p *policyParser) opGlob(n *yaml.Node, path string) (Glob, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return Glob{}, false
	}
	if strings.IndexFunc(s, unicode.IsSpace) >= 0 {
		p.errAt(n, path, "%q: operation globs contain no whitespace", clipForMsg(s))
		return Glob{}, false
	}
	return p.glob(n, path, "operation glob", s)
}

// prefix reads an address ("10.0.0.1", "fd00::1") or a CIDR
// ("10.0.0.0/8") in canonical form.
func (p *policyParser) prefix(n *yaml.Node, path string) (netip.Prefix, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return netip.Prefix{}, false
	}
	var pf netip.Prefix
	if addr, bits, cidr := strings.Cut(s, "/"); cidr {
		a, err := netip.ParseAddr(addr)
		if err != nil || a.Zone() != "" {
			p.errAt(n, path, "%q is not a CIDR: %q is not an IP address", clipForMsg(s), clipForMsg(addr))
			return netip.Prefix{}, false
		}
		b, err := strconv.Atoi(bits)
		if err != nil || b < 0 || b > a.BitLen() || bits != strconv.Itoa(b) {
			p.errAt(n, path, "%q is not a CIDR: prefix length %q is not in 0..%d", clipForMsg(s), clipForMsg(bits), a.BitLen())
			return netip.Prefix{}, false
		}
		pf = netip.PrefixFrom(a, b)
		if pf.Masked() != pf {
			p.errAt(n, path, "%q has address bits set beyond /%d; write %q", s, b, pf.Masked().String())
			return netip.Prefix{}, false
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			p.errAt(n, path, "%q is not an IP address or CIDR (host names go under hosts)", clipForMsg(s))
			return netip.Prefix{}, false
		}
		if a.Zone() != "" {
			p.errAt(n, path, "%q has a zone; zones are not supported", s)
			return netip.Prefix{}, false
		}
		pf = netip.PrefixFrom(a, a.BitLen())
	}
	if pf.Addr().Is4In6() {
		p.errAt(n, path, "%q is an IPv4-mapped IPv6 address; write it as IPv4", s)
		return netip.Prefix{}, false
	}
	return pf, true
}

func (p *policyParser) port(n *yaml.Node, path string) (uint16, bool) {
	v, ok := p.integer(n, path)
	if !ok {
		return 0, false
	}
	if v < 1 || v > 65535 {
		p.errAt(n, path, "port %d is out of range 1..65535", v)
		return 0, false
	}
	return uint16(v), true
}

// value reads a declared value, stored normalised with Norm.
func (p *policyParser) value(n *yaml.Node, path string) (string, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return "", false
	}
	v := Norm(s)
	if v == "" {
		p.errAt(n, path, "empty value (values are compared with whitespace removed)")
		return "", false
	}
	return v, true
}

// ---- sections ----

func (p *policyParser) parseTrusted(n *yaml.Node, pol *Policy) {
	m, ok := p.fields(n, "trusted", policyTrustedKeys, false)
	if !ok {
		return
	}
	if v := m["task"]; nodePresent(v) {
		if b, ok := p.boolean(v, "trusted.task"); ok {
			pol.TaskTrusted = b
		}
	}
	s := p.parseSelector(m, "trusted", false)
	pol.TrustedValues = dedupeStrings(s.values)
	if v := m["principal"]; nodePresent(v) {
		pol.Principal = dedupeStrings(policyList(p, v, "trusted.principal", p.value))
	}
	src := Source{Paths: s.paths, Net: s.net, Objects: s.objects}
	if len(src.Paths)+len(src.Net.Hosts)+len(src.Net.Prefixes)+len(src.Objects) > 0 {
		pol.Trusted = []Source{src}
	}
}

func dedupeStrings(vs []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, v := range vs {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func (p *policyParser) parseSensitive(n *yaml.Node, pol *Policy) {
	items, ok := p.seq(n, "sensitive")
	if !ok {
		return
	}
	names := map[string]*yaml.Node{}
	for i, it := range items {
		ip := itemPath("sensitive", i)
		m, ok := p.fields(it, ip, policySensitiveKeys, false)
		if !ok {
			continue
		}
		name := p.name(m, it, ip, "sensitive source", names)
		var lv Level
		if v := m["level"]; nodePresent(v) {
			lv, _ = p.level(v, fieldPath(ip, "level"))
		} else {
			p.errAt(it, ip, "level is required: the sensitivity of what this source yields")
		}
		s := p.parseSelector(m, ip, false)
		if !nodeGiven(m["paths"]) && !nodeGiven(m["hosts"]) && !nodeGiven(m["cidrs"]) && !nodeGiven(m["objects"]) {
			p.errAt(it, ip, "sensitive source %q selects nothing: give paths, hosts, cidrs or objects", name)
		}
		pol.Sensitive = append(pol.Sensitive, SensitiveSource{
			Name:   name,
			Source: Source{Paths: s.paths, Net: s.net, Objects: s.objects},
			Level:  lv,
		})
	}
}

// parseParties reads the parties or the internal channels; names are
// unique across both.
func (p *policyParser) parseParties(n *yaml.Node, section string, names map[string]*yaml.Node, internal bool) []Party {
	items, ok := p.seq(n, section)
	if !ok {
		return nil
	}
	keys, what := policyPartyKeys, "party"
	if internal {
		keys, what = policyInternalKeys, "internal channel"
	}
	var out []Party
	for i, it := range items {
		ip := itemPath(section, i)
		m, ok := p.fields(it, ip, keys, false)
		if !ok {
			continue
		}
		name := p.name(m, it, ip, what, names)
		s := p.parseSelector(m, ip, true)
		pt := Party{Name: name, Endpoint: s.net, Objects: s.objects}
		if !internal {
			if v := m["clearance"]; nodePresent(v) {
				pt.Clearance, _ = p.level(v, fieldPath(ip, "clearance"))
			} else {
				p.errAt(it, ip, "clearance is required: the highest level of data %q may receive", name)
			}
		}
		if !nodeGiven(m["hosts"]) && !nodeGiven(m["cidrs"]) && !nodeGiven(m["objects"]) {
			p.errAt(it, ip, "%s %q selects nothing: give hosts, cidrs or objects", what, name)
		}
		out = append(out, pt)
	}
	return out
}

// parseCredentials reads the credentials section: which parties may
// receive each secret handed to the agent. Parties are resolved against
// the parties and internal channels (names).
func (p *policyParser) parseCredentials(n *yaml.Node, pol *Policy, parties map[string]*yaml.Node) {
	items, ok := p.seq(n, "credentials")
	if !ok {
		return
	}
	seen := map[string]*yaml.Node{}
	for i, it := range items {
		ip := itemPath("credentials", i)
		m, ok := p.fields(it, ip, policyCredKeys, false)
		if !ok {
			continue
		}
		var name string
		if v := m["name"]; !nodePresent(v) {
			p.errAt(it, ip, "name is required: the environment variable that holds the credential")
		} else if s, ok := p.str(v, fieldPath(ip, "name")); ok {
			name = s
			switch first, dup := seen[s]; {
			case !ValidEnvName(s):
				p.errAt(v, fieldPath(ip, "name"), "invalid name %q (want an environment variable name: letters, digits and '_', not starting with a digit)", clipForMsg(s))
			case dup:
				p.errAt(v, fieldPath(ip, "name"), "credential %q is already declared at line %d", s, first.Line)
			default:
				seen[s] = v
			}
		}
		c := Credential{Name: name, Level: pol.TopLevel()}
		if v := m["parties"]; nodePresent(v) {
			pp := fieldPath(ip, "parties")
			c.Parties = policyList(p, v, pp, func(n *yaml.Node, path string) (string, bool) {
				s, ok := p.str(n, path)
				if !ok {
					return "", false
				}
				if _, ok := parties[s]; !ok {
					p.errAt(n, path, "party %q is not declared in parties or internal", clipForMsg(s))
					return "", false
				}
				return s, true
			})
		}
		s := p.parseSelector(m, ip, false)
		c.Endpoint = s.net
		if v := m["level"]; nodePresent(v) {
			c.Level, _ = p.level(v, fieldPath(ip, "level"))
		}
		if !nodeGiven(m["parties"]) && !nodeGiven(m["hosts"]) && !nodeGiven(m["cidrs"]) {
			p.errAt(it, ip, "credential %q is bound to nothing: give parties, hosts or cidrs (a credential no party may receive need not be declared: carbd refuses to send it anywhere)", name)
		}
		pol.Credentials = append(pol.Credentials, c)
	}
}

func globMatchesAll(pattern string) bool {
	return pattern != "" && strings.Trim(pattern, "*") == ""
}

func (p *policyParser) parseRefuse(n *yaml.Node, pol *Policy) {
	items, ok := p.seq(n, "refuse")
	if !ok {
		return
	}
	names := map[string]*yaml.Node{}
	for i, it := range items {
		ip := itemPath("refuse", i)
		m, ok := p.fields(it, ip, policyRefuseKeys, false)
		if !ok {
			continue
		}
		name := p.name(m, it, ip, "refuse rule", names)
		s := p.parseSelector(m, ip, false)
		objSel := nodeGiven(m["paths"]) || nodeGiven(m["hosts"]) || nodeGiven(m["cidrs"]) || nodeGiven(m["values"])
		switch {
		case !objSel && !nodeGiven(m["ops"]):
			p.errAt(it, ip, "refuse rule %q has no selector and would refuse every effect: give ops, paths, hosts, cidrs or values", name)
		case !objSel:
			for j, it := range m["ops"].Content {
				if it.Kind == yaml.ScalarNode && globMatchesAll(it.Value) {
					p.errAt(it, itemPath(fieldPath(ip, "ops"), j),
						"refuse rule %q would refuse every effect (%q with no paths, hosts, cidrs or values)", name, it.Value)
				}
			}
		}
		pol.Refuse = append(pol.Refuse, RefuseRule{Name: name, Ops: s.ops, Paths: s.paths, Net: s.net, Values: dedupeStrings(s.values)})
	}
}

// parseOpFields reads the keys an operation entry shares with defaults
// into spec, which starts as the defaults.
func (p *policyParser) parseOpFields(m map[string]*yaml.Node, path string, spec *OpSpec) {
	if v := m["kind"]; nodePresent(v) {
		if s, ok := p.str(v, fieldPath(path, "kind")); ok {
			switch s {
			case "auto":
				spec.Kind = KindUnset
			case "stageable":
				spec.Kind = Stageable
			case "stallable":
				spec.Kind = Stallable
			case "blocking":
				spec.Kind = Blocking
			default:
				p.errAt(v, fieldPath(path, "kind"), "unknown kind %q (want stageable, stallable, blocking or auto)", clipForMsg(s))
			}
		}
	}
	if v := m["gate"]; v != nil {
		// An explicit empty gate (gate: []) gates nothing.
		gp := fieldPath(path, "gate")
		if items, ok := p.seq(v, gp); ok {
			var set RoleSet
			for i, it := range items {
				r, ok := p.role(it, itemPath(gp, i))
				if !ok {
					continue
				}
				if set.Has(r) {
					p.errAt(it, itemPath(gp, i), "role %s is listed twice", r)
				}
				set = set.With(r)
			}
			spec.Gate = set
		}
	}
	if v := m["on_untrusted"]; nodePresent(v) {
		if s, ok := p.str(v, fieldPath(path, "on_untrusted")); ok {
			switch s {
			case "defer":
				spec.RefuseUntrusted = false
			case "refuse":
				spec.RefuseUntrusted = true
			default:
				p.errAt(v, fieldPath(path, "on_untrusted"), "unknown value %q (want defer or refuse)", clipForMsg(s))
			}
		}
	}
	for _, f := range []struct {
		key string
		dst *bool
	}{{"financial", &spec.Financial}, {"irreversible", &spec.Irreversible}, {"message", &spec.Message}, {"external", &spec.External}} {
		if v := m[f.key]; nodePresent(v) {
			if b, ok := p.boolean(v, fieldPath(path, f.key)); ok {
				*f.dst = b
			}
		}
	}
}

func (p *policyParser) role(n *yaml.Node, path string) (Role, bool) {
	s, ok := p.str(n, path)
	if !ok {
		return 0, false
	}
	r, err := ParseRole(s)
	if err != nil {
		p.errAt(n, path, "unknown role %q (want target, credential, command, selector, control or content)", clipForMsg(s))
		return 0, false
	}
	return r, true
}

func globHasMeta(s string) bool { return strings.ContainsAny(s, "*?[]{}\\") }

func (p *policyParser) parseOperations(n *yaml.Node, pol *Policy) {
	items, ok := p.seq(n, "operations")
	if !ok {
		return
	}
	type earlier struct {
		g     Glob
		where string
	}
	var before []earlier
	for i, it := range items {
		ip := itemPath("operations", i)
		m, ok := p.fields(it, ip, policyOpKeys, false)
		if !ok {
			continue
		}
		spec := pol.DefaultOp
		spec.Ops, spec.Roles, spec.DestField = nil, nil, ""
		opsPath := fieldPath(ip, "ops")
		if !nodeGiven(m["ops"]) {
			p.errAt(it, ip, "ops is required: an operation entry without ops applies to nothing")
		} else if items, ok := p.seq(m["ops"], opsPath); ok {
			var mine []earlier
			for j, on := range items {
				g, ok := p.opGlob(on, itemPath(opsPath, j))
				if !ok {
					continue
				}
				spec.Ops = append(spec.Ops, g)
				mine = append(mine, earlier{g, ip})
				// First match wins: a glob an earlier entry already
				// matches is dead configuration, almost always a
				// misordering.
				for _, e := range before {
					if globMatchesAll(e.g.Pattern) || e.g.Pattern == g.Pattern || (!globHasMeta(g.Pattern) && e.g.Match(g.Pattern)) {
						p.errAt(on, itemPath(opsPath, j), "%q is never used: %s (%q) matches it first", g.Pattern, e.where, e.g.Pattern)
						break
					}
				}
			}
			before = append(before, mine...)
		}
		p.parseOpFields(m, ip, &spec)
		if v := m["roles"]; nodePresent(v) {
			rp := fieldPath(ip, "roles")
			if kvs, ok := p.pairs(v, rp, false); ok {
				spec.Roles = map[string]Role{}
				for _, kv := range kvs {
					fp := fieldPath(rp, kv.key)
					if kv.key == "" {
						p.errAt(kv.k, rp, "empty field name")
						continue
					}
					if r, ok := p.role(kv.v, fp); ok {
						spec.Roles[kv.key] = r
					}
				}
			}
		}
		if v := m["dest_field"]; nodePresent(v) {
			if s, ok := p.str(v, fieldPath(ip, "dest_field")); ok {
				if s == "" {
					p.errAt(v, fieldPath(ip, "dest_field"), "empty field name")
				}
				spec.DestField = s
			}
		}
		pol.Operations = append(pol.Operations, spec)
	}
}

// ---- summary and canonical form ----

// Summary is a short human description of the policy: its levels, what
// it trusts and marks sensitive, its parties with their clearances, its
// refuse rules, internal channels and operation table.
func (p *Policy) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "policy %s\n", p.Name)
	fmt.Fprintf(&b, "  levels      %s\n", strings.Join(p.Levels, " < "))
	task := "task untrusted"
	if p.TaskTrusted {
		task = "task trusted"
	}
	var paths, hosts, cidrs, objects int
	for _, s := range p.Trusted {
		paths += len(s.Paths)
		hosts += len(s.Net.Hosts)
		cidrs += len(s.Net.Prefixes)
		objects += len(s.Objects)
	}
	fmt.Fprintf(&b, "  trusted     %s, %s, %s, %s, %s, %s\n", task, summaryCount(len(p.TrustedValues), "value"),
		summaryCount(paths, "path"), summaryCount(hosts, "host"), summaryCount(cidrs, "cidr"), summaryCount(objects, "object"))
	var ss []string
	for _, s := range p.Sensitive {
		ss = append(ss, s.Name+" ("+p.LevelName(s.Level)+")")
	}
	fmt.Fprintf(&b, "  sensitive   %s%s\n", summaryCount(len(p.Sensitive), "source"), summaryNames(ss))
	if len(p.Fields) > 0 {
		fmt.Fprintf(&b, "  fields      %s\n", fieldsSummary(p.Fields)) // fieldtrust_yaml.go
	}
	var ps []string
	for _, pt := range p.Parties {
		ps = append(ps, pt.Name+" ("+p.LevelName(pt.Clearance)+")")
	}
	unknown := "unknown parties have the lowest clearance"
	if p.UnknownPartyDefer {
		unknown = "unknown parties are deferred"
	}
	fmt.Fprintf(&b, "  parties     %s%s; %s\n", summaryCount(len(p.Parties), "party"), summaryNames(ps), unknown)
	var is []string
	for _, pt := range p.Internal {
		is = append(is, pt.Name)
	}
	fmt.Fprintf(&b, "  internal    %s%s\n", summaryCount(len(p.Internal), "channel"), summaryNames(is))
	var cs []string
	for _, c := range p.Credentials {
		cs = append(cs, c.Name)
	}
	if len(cs) > 0 {
		fmt.Fprintf(&b, "  credentials %s%s\n", summaryCount(len(cs), "credential"), summaryNames(cs))
	}
	var rs []string
	for _, r := range p.Refuse {
		rs = append(rs, r.Name)
	}
	fmt.Fprintf(&b, "  refuse      %s%s\n", summaryCount(len(p.Refuse), "rule"), summaryNames(rs))
	fmt.Fprintf(&b, "  operations  %s, first match wins; otherwise %s, gate %s\n",
		summaryCount(len(p.Operations), "entry"), policyKindWord(p.DefaultOp.Kind), gateSummary(p.DefaultOp.Gate))
	if p.Intercept.doc() != nil {
		fmt.Fprintf(&b, "  intercept   %s\n", p.Intercept.summary())
	}
	return b.String()
}

func summaryCount(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	switch {
	case strings.HasSuffix(noun, "y"):
		noun = noun[:len(noun)-1] + "ies"
	default:
		noun += "s"
	}
	return strconv.Itoa(n) + " " + noun
}

// summaryNames lists up to 8 names after a colon.
func summaryNames(ns []string) string {
	if len(ns) == 0 {
		return ""
	}
	if len(ns) > 8 {
		return ": " + strings.Join(ns[:8], ", ") + fmt.Sprintf(", and %d more", len(ns)-8)
	}
	return ": " + strings.Join(ns, ", ")
}

func policyKindWord(k Kind) string {
	if k == KindUnset {
		return "auto"
	}
	return k.String()
}

func gateRoleNames(g RoleSet) []string {
	var out []string
	for _, r := range Roles {
		if g.Has(r) {
			out = append(out, r.String())
		}
	}
	return out
}

func gateSummary(g RoleSet) string {
	if g == 0 {
		return "none"
	}
	return strings.Join(gateRoleNames(g), ",")
}

// The canonical YAML form of a compiled policy.
type (
	policyDoc struct {
		Version        int            `yaml:"version"`
		Levels         []string       `yaml:"levels,flow"`
		Trusted        trustedDoc     `yaml:"trusted"`
		Sensitive      []sourceDoc    `yaml:"sensitive,omitempty"`
		Fields         []fieldDoc     `yaml:"fields,omitempty"`
		Parties        []partyDoc     `yaml:"parties,omitempty"`
		UnknownParties string         `yaml:"unknown_parties"`
		Internal       []partyDoc     `yaml:"internal,omitempty"`
		Credentials    []credDoc      `yaml:"credentials,omitempty"`
		Refuse         []refuseDoc    `yaml:"refuse,omitempty"`
		Operations     []operationDoc `yaml:"operations,omitempty"`
		Defaults       operationDoc   `yaml:"defaults"`
		Intercept      *interceptDoc  `yaml:"intercept,omitempty"`
	}
	trustedDoc struct {
		Task    bool     `yaml:"task"`
		Values  []string `yaml:"values,omitempty,flow"`
		Paths   []string `yaml:"paths,omitempty,flow"`
		Hosts   []string `yaml:"hosts,omitempty,flow"`
		CIDRs   []string `yaml:"cidrs,omitempty,flow"`
		Ports   []uint16 `yaml:"ports,omitempty,flow"`
		Objects []string `yaml:"objects,omitempty,flow"`

		Principal []string `yaml:"principal,omitempty,flow"` // Policy.Principal
	}
	sourceDoc struct {
		Name    string   `yaml:"name"`
		Level   string   `yaml:"level"`
		Paths   []string `yaml:"paths,omitempty,flow"`
		Hosts   []string `yaml:"hosts,omitempty,flow"`
		CIDRs   []string `yaml:"cidrs,omitempty,flow"`
		Ports   []uint16 `yaml:"ports,omitempty,flow"`
		Objects []string `yaml:"objects,omitempty,flow"`
	}
	partyDoc struct {
		Name      string   `yaml:"name"`
		Hosts     []string `yaml:"hosts,omitempty,flow"`
		CIDRs     []string `yaml:"cidrs,omitempty,flow"`
		Ports     []uint16 `yaml:"ports,omitempty,flow"`
		Objects   []string `yaml:"objects,omitempty,flow"`
		Clearance string   `yaml:"clearance,omitempty"`
	}
	credDoc struct {
		Name    string   `yaml:"name"`
		Parties []string `yaml:"parties,omitempty,flow"`
		Hosts   []string `yaml:"hosts,omitempty,flow"`
		CIDRs   []string `yaml:"cidrs,omitempty,flow"`
		Ports   []uint16 `yaml:"ports,omitempty,flow"`
		Level   string   `yaml:"level"`
	}
	refuseDoc struct {
		Name   string   `yaml:"name"`
		Ops    []string `yaml:"ops,omitempty,flow"`
		Paths  []string `yaml:"paths,omitempty,flow"`
		Hosts  []string `yaml:"hosts,omitempty,flow"`
		CIDRs  []string `yaml:"cidrs,omitempty,flow"`
		Ports  []uint16 `yaml:"ports,omitempty,flow"`
		Values []string `yaml:"values,omitempty,flow"`
	}
	operationDoc struct {
		Ops          []string          `yaml:"ops,omitempty,flow"`
		Kind         string            `yaml:"kind"`
		Gate         []string          `yaml:"gate,flow"`
		OnUntrusted  string            `yaml:"on_untrusted,omitempty"`
		Roles        map[string]string `yaml:"roles,omitempty"`
		DestField    string            `yaml:"dest_field,omitempty"`
		Financial    *bool             `yaml:"financial,omitempty"`
		Irreversible *bool             `yaml:"irreversible,omitempty"`
		Message      *bool             `yaml:"message,omitempty"`
		External     *bool             `yaml:"external,omitempty"`
	}
)

func globPatterns(gs []Glob) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Pattern)
	}
	return out
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, pf := range ps {
		out = append(out, pf.String())
	}
	return out
}

// operationDocOf renders an operation entry; flags are written where they
// differ from def (an entry inherits the defaults' flags).
func operationDocOf(s, def *OpSpec) operationDoc {
	flag := func(v, d bool) *bool {
		if v == d {
			return nil
		}
		return &v
	}
	d := operationDoc{
		Ops: globPatterns(s.Ops), Kind: policyKindWord(s.Kind), Gate: gateRoleNames(s.Gate), DestField: s.DestField,
		Financial: flag(s.Financial, def.Financial), Irreversible: flag(s.Irreversible, def.Irreversible),
		Message: flag(s.Message, def.Message), External: flag(s.External, def.External),
	}
	if d.Gate == nil {
		d.Gate = []string{}
	}
	if s.RefuseUntrusted != def.RefuseUntrusted {
		d.OnUntrusted = "defer"
		if s.RefuseUntrusted {
			d.OnUntrusted = "refuse"
		}
	}
	if len(s.Roles) > 0 {
		d.Roles = map[string]string{}
		for k, r := range s.Roles {
			d.Roles[k] = r.String()
		}
	}
	return d
}

// YAML returns the policy in the file format, in canonical form: every
// operation entry with its kind and gate spelled out, normalised values,
// hosts and addresses as they were compiled. For a Policy built by
// ParsePolicy, ParsePolicy(YAML()) yields an equal Policy. It fails for a
// Policy built by hand that the format cannot express (more than one
// trusted source, a level index out of range, defaults with ops).
func (p *Policy) YAML() ([]byte, error) {
	if len(p.Trusted) > 1 {
		return nil, errors.New("decide: policy has more than one trusted source; the format has one")
	}
	lv := func(l Level) (string, error) {
		if int(l) >= len(p.Levels) {
			return "", fmt.Errorf("decide: level %d is not declared (%d levels)", l, len(p.Levels))
		}
		return p.Levels[l], nil
	}
	if len(p.DefaultOp.Ops) > 0 || len(p.DefaultOp.Roles) > 0 || p.DefaultOp.DestField != "" {
		return nil, errors.New("decide: the default operation has ops, roles or dest_field; the format has none")
	}
	d := policyDoc{Version: PolicyVersion, Levels: p.Levels, UnknownParties: "public", Defaults: operationDocOf(&p.DefaultOp, &OpSpec{})}
	if p.UnknownPartyDefer {
		d.UnknownParties = "defer"
	}
	d.Trusted = trustedDoc{Task: p.TaskTrusted, Values: p.TrustedValues, Principal: p.Principal}
	if len(p.Trusted) == 1 {
		s := &p.Trusted[0]
		d.Trusted.Paths, d.Trusted.Hosts, d.Trusted.CIDRs = globPatterns(s.Paths), globPatterns(s.Net.Hosts), prefixStrings(s.Net.Prefixes)
		d.Trusted.Ports, d.Trusted.Objects = s.Net.Ports, globPatterns(s.Objects)
	}
	for _, s := range p.Sensitive {
		name, err := lv(s.Level)
		if err != nil {
			return nil, err
		}
		d.Sensitive = append(d.Sensitive, sourceDoc{Name: s.Name, Level: name, Paths: globPatterns(s.Paths),
			Hosts: globPatterns(s.Net.Hosts), CIDRs: prefixStrings(s.Net.Prefixes), Ports: s.Net.Ports, Objects: globPatterns(s.Objects)})
	}
	d.Fields = fieldDocs(p.Fields)
	for _, pt := range p.Parties {
		name, err := lv(pt.Clearance)
		if err != nil {
			return nil, err
		}
		d.Parties = append(d.Parties, partyDoc{Name: pt.Name, Hosts: globPatterns(pt.Endpoint.Hosts),
			CIDRs: prefixStrings(pt.Endpoint.Prefixes), Ports: pt.Endpoint.Ports, Objects: globPatterns(pt.Objects), Clearance: name})
	}
	for _, pt := range p.Internal {
		d.Internal = append(d.Internal, partyDoc{Name: pt.Name, Hosts: globPatterns(pt.Endpoint.Hosts),
			CIDRs: prefixStrings(pt.Endpoint.Prefixes), Ports: pt.Endpoint.Ports, Objects: globPatterns(pt.Objects)})
	}
	for _, c := range p.Credentials {
		name, err := lv(c.Level)
		if err != nil {
			return nil, err
		}
		d.Credentials = append(d.Credentials, credDoc{Name: c.Name, Parties: c.Parties, Hosts: globPatterns(c.Endpoint.Hosts),
			CIDRs: prefixStrings(c.Endpoint.Prefixes), Ports: c.Endpoint.Ports, Level: name})
	}
	for _, r := range p.Refuse {
		d.Refuse = append(d.Refuse, refuseDoc{Name: r.Name, Ops: globPatterns(r.Ops), Paths: globPatterns(r.Paths),
			Hosts: globPatterns(r.Net.Hosts), CIDRs: prefixStrings(r.Net.Prefixes), Ports: r.Net.Ports, Values: r.Values})
	}
	for i := range p.Operations {
		d.Operations = append(d.Operations, operationDocOf(&p.Operations[i], &p.DefaultOp))
	}
	d.Intercept = p.Intercept.doc()
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&d); err != nil {
		return nil, fmt.Errorf("decide: encode policy: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("decide: encode policy: %w", err)
	}
	return buf.Bytes(), nil
}
