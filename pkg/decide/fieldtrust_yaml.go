package decide

import (
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The fields section of the policy file (docs/policy.md, "fields"):
//
//	fields:
//	  - name: own-transfer-recipients
//	    objects: ["tool:get_most_recent_transactions"]
//	    path: "*.recipient"
//	    where: {sender: {values: [me]}}
//	    trust: trusted
//	    reason: the account a transfer the user made went to ...

var (
	policyFieldKeys = []string{"name", "paths", "hosts", "cidrs", "ports", "objects", "path", "where", "trust", "reason"}
	// policyAllTopKeys are the top-level keys with the fields section.
	policyAllTopKeys = append(slices.Clip(policyTopKeys), "fields")
)

// maxFieldReasonLen bounds a field rule's reason.
const maxFieldReasonLen = 1024

func (p *policyParser) parseFields(n *yaml.Node, pol *Policy) {
	items, ok := p.seq(n, "fields")
	if !ok {
		return
	}
	names := map[string]*yaml.Node{}
	for i, it := range items {
		ip := itemPath("fields", i)
		m, ok := p.fields(it, ip, policyFieldKeys, false)
		if !ok {
			continue
		}
		r := FieldRule{Name: p.name(m, it, ip, "field rule", names)}
		s := p.parseSelector(m, ip, false)
		r.Source = Source{Paths: s.paths, Net: s.net, Objects: s.objects}
		if !nodeGiven(m["paths"]) && !nodeGiven(m["hosts"]) && !nodeGiven(m["cidrs"]) && !nodeGiven(m["objects"]) {
			p.errAt(it, ip, "field rule %q selects no source: give paths, hosts, cidrs or objects", r.Name)
		}
		if v := m["path"]; nodePresent(v) {
			if s, ok := p.str(v, fieldPath(ip, "path")); ok {
				fp, err := ParseFieldPath(s)
				if err != nil {
					p.errAt(v, fieldPath(ip, "path"), "%s", strings.TrimPrefix(err.Error(), "fields: "))
				}
				r.Path = fp
			}
		} else {
			p.errAt(it, ip, "path is required: the fields of the output the rule marks (e.g. \"*.recipient\")")
		}
		if v := m["where"]; nodePresent(v) {
			r.Where = p.parseFieldWhere(v, fieldPath(ip, "where"), pol)
		}
		if v := m["trust"]; nodePresent(v) {
			if s, ok := p.str(v, fieldPath(ip, "trust")); ok {
				switch s {
				case "trusted":
					r.Trust = Trusted
				case "untrusted":
					r.Trust = Untrusted
				default:
					p.errAt(v, fieldPath(ip, "trust"), "unknown value %q (want trusted or untrusted)", clipForMsg(s))
				}
			}
		} else {
			p.errAt(it, ip, "trust is required: trusted or untrusted")
		}
		if v := m["reason"]; nodePresent(v) {
			if s, ok := p.str(v, fieldPath(ip, "reason")); ok {
				s = strings.Join(strings.Fields(s), " ")
				switch {
				case s == "":
					p.errAt(v, fieldPath(ip, "reason"), "empty reason")
				case len(s) > maxFieldReasonLen:
					p.errAt(v, fieldPath(ip, "reason"), "reason longer than %d bytes", maxFieldReasonLen)
				}
				r.Reason = s
			}
		} else {
			p.errAt(it, ip, "reason is required: why the platform, not a third party, produced these fields (or why a trusted source's field is third-party text)")
		}
		pol.Fields = append(pol.Fields, r)
	}
}

// parseFieldWhere reads the record conditions: a mapping from a key of
// the record to "principal", "trusted" or {values: [...]}.
func (p *policyParser) parseFieldWhere(n *yaml.Node, path string, pol *Policy) []FieldCond {
	kvs, ok := p.pairs(n, path, false)
	if !ok {
		return nil
	}
	var out []FieldCond
	for _, kv := range kvs {
		kp := fieldPath(path, kv.key)
		if kv.key == "" || strings.TrimSpace(kv.key) != kv.key {
			p.errAt(kv.k, kp, "invalid key %q (a record's key, without leading or trailing space)", clipForMsg(kv.key))
			continue
		}
		c := FieldCond{Key: kv.key}
		switch v := kv.v; {
		case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Value == "principal":
			c.Kind = CondPrincipal
			if len(pol.Principal) == 0 {
				p.errAt(v, kp, "principal: the policy declares no principal (trusted.principal)")
				continue
			}
		case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Value == "trusted":
			c.Kind = CondTrusted
		case v.Kind == yaml.MappingNode:
			m, ok := p.fields(v, kp, []string{"values"}, false)
			if !ok {
				continue
			}
			vals := m["values"]
			if !nodeGiven(vals) {
				p.errAt(v, kp, "values is required and not empty: the values the key must hold")
				continue
			}
			c.Kind = CondValues
			c.Values = dedupeStrings(policyList(p, vals, fieldPath(kp, "values"), p.value))
			if len(c.Values) == 0 {
				continue
			}
		default:
			if !p.alias(v, kp) {
				p.errAt(v, kp, "want principal, trusted or {values: [...]}, got %s", describeNode(v))
			}
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b FieldCond) int { return strings.Compare(a.Key, b.Key) }) // canonical order
	return out
}

// fieldDoc is a field rule in the canonical YAML form.
type fieldDoc struct {
	Name    string         `yaml:"name"`
	Paths   []string       `yaml:"paths,omitempty,flow"`
	Hosts   []string       `yaml:"hosts,omitempty,flow"`
	CIDRs   []string       `yaml:"cidrs,omitempty,flow"`
	Ports   []uint16       `yaml:"ports,omitempty,flow"`
	Objects []string       `yaml:"objects,omitempty,flow"`
	Path    string         `yaml:"path"`
	Where   map[string]any `yaml:"where,omitempty"`
	Trust   string         `yaml:"trust"`
	Reason  string         `yaml:"reason"`
}

func fieldDocs(rs []FieldRule) []fieldDoc {
	var out []fieldDoc
	for _, r := range rs {
		d := fieldDoc{Name: r.Name, Paths: globPatterns(r.Paths), Hosts: globPatterns(r.Net.Hosts),
			CIDRs: prefixStrings(r.Net.Prefixes), Ports: r.Net.Ports, Objects: globPatterns(r.Objects),
			Path: r.Path.String(), Trust: r.Trust.String(), Reason: r.Reason}
		for _, c := range r.Where {
			if d.Where == nil {
				d.Where = map[string]any{}
			}
			switch c.Kind {
			case CondPrincipal:
				d.Where[c.Key] = "principal"
			case CondTrusted:
				d.Where[c.Key] = "trusted"
			default:
				d.Where[c.Key] = map[string][]string{"values": c.Values}
			}
		}
		out = append(out, d)
	}
	return out
}

// fieldsSummary is the fields line of Policy.Summary: the rules' names
// with what they mark.
func fieldsSummary(rs []FieldRule) string {
	var names []string
	for _, r := range rs {
		names = append(names, r.Name+" ("+r.Trust.String()+" "+r.Path.String()+")")
	}
	return summaryCount(len(rs), "rule") + summaryNames(names)
}
