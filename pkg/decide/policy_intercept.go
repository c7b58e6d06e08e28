package decide

import (
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The policy's intercept section: how carbd's TLS interception treats
// the guest's TLS connections (docs/interception.md, docs/policy.md).

// RefusedCA says what a TLS client that refuses carbd's CA gets.
type RefusedCA uint8

const (
	// RefusedCAClose: the connection is closed (the client's own alert
	// ends it) and a tls:ca-refused record is audited. The default.
	RefusedCAClose RefusedCA = iota
	// RefusedCAPass: as RefusedCAClose, and later connections to the
	// same server name pass through opaque for the rest of the run,
	// decided by that name as carrying everything read so far.
	RefusedCAPass
)

func (r RefusedCA) String() string {
	if r == RefusedCAPass {
		return "pass"
	}
	return "close"
}

// InterceptPolicy is the policy's intercept section. Its zero value is
// the default: TCP 443 only, every party intercepted, a client that
// refuses carbd's CA closed.
type InterceptPolicy struct {
	// Ports are TCP ports intercepted as TLS besides 443 (sorted, no
	// duplicates).
	Ports []uint16
	// Pass are the server names (lowercased host globs) whose
	// connections are not intercepted: they pass through opaque, decided
	// by their server name as TLS was before interception (for
	// certificate-pinned clients).
	Pass []Glob
	// OnRefusedCA is what a client that refuses carbd's CA gets.
	OnRefusedCA RefusedCA
}

// DefaultInterceptPort is the TLS port always intercepted.
const DefaultInterceptPort = 443

// maxInterceptPorts bounds intercept.ports.
const maxInterceptPorts = 64

// Passes reports whether a connection with server name sni passes
// through opaque. A connection without a server name is intercepted.
func (ip *InterceptPolicy) Passes(sni string) bool {
	sni = strings.ToLower(strings.TrimSuffix(sni, "."))
	return sni != "" && matchAny(ip.Pass, sni)
}

// reservedInterceptPorts are TCP ports intercept.ports may not name, and
// why.
var reservedInterceptPorts = map[uint16]string{
	DefaultInterceptPort: "port 443 is always intercepted; list only the other TLS ports",
	53:                   "port 53 is DNS (carbd's resolver answers the sandbox over it), not TLS",
	80:                   "port 80 is plain HTTP, decided request by request without interception",
}

var policyInterceptKeys = []string{"ports", "pass", "on_refused_ca"}

// parseIntercept reads the intercept section.
func (p *policyParser) parseIntercept(n *yaml.Node, pol *Policy) {
	m, ok := p.fields(n, "intercept", policyInterceptKeys, true)
	if !ok {
		return
	}
	ip := &pol.Intercept
	if v := m["ports"]; nodePresent(v) {
		seen := map[uint16]*yaml.Node{}
		ip.Ports = policyList(p, v, "intercept.ports", func(n *yaml.Node, path string) (uint16, bool) {
			port, ok := p.port(n, path)
			if !ok {
				return 0, false
			}
			if why, reserved := reservedInterceptPorts[port]; reserved {
				p.errAt(n, path, "%s", why)
				return 0, false
			}
			if first, dup := seen[port]; dup {
				p.errAt(n, path, "port %d is already listed at line %d", port, first.Line)
				return 0, false
			}
			seen[port] = n
			return port, true
		})
		if len(ip.Ports) > maxInterceptPorts {
			p.errAt(v, "intercept.ports", "%d ports; at most %d", len(ip.Ports), maxInterceptPorts)
		}
		slices.Sort(ip.Ports)
	}
	if v := m["pass"]; nodePresent(v) {
		ip.Pass = p.list(v, "intercept.pass", p.hostGlob)
	}
	if v := m["on_refused_ca"]; nodePresent(v) {
		if s, ok := p.str(v, "intercept.on_refused_ca"); ok {
			switch s {
			case "close":
				ip.OnRefusedCA = RefusedCAClose
			case "pass":
				ip.OnRefusedCA = RefusedCAPass
			default:
				p.errAt(v, "intercept.on_refused_ca", "unknown value %q (want close or pass)", clipForMsg(s))
			}
		}
	}
}

// interceptDoc is the canonical form of the intercept section.
type interceptDoc struct {
	Ports       []uint16 `yaml:"ports,omitempty,flow"`
	Pass        []string `yaml:"pass,omitempty,flow"`
	OnRefusedCA string   `yaml:"on_refused_ca,omitempty"`
}

// doc renders the section; nil when it is the default.
func (ip *InterceptPolicy) doc() *interceptDoc {
	if len(ip.Ports) == 0 && len(ip.Pass) == 0 && ip.OnRefusedCA == RefusedCAClose {
		return nil
	}
	return &interceptDoc{Ports: ip.Ports, Pass: globPatterns(ip.Pass), OnRefusedCA: ip.OnRefusedCA.String()}
}

// summary is the section's line in Policy.Summary.
func (ip *InterceptPolicy) summary() string {
	ports := []string{"443"}
	for _, p := range ip.Ports {
		ports = append(ports, strconv.Itoa(int(p)))
	}
	pass := "every party intercepted"
	if len(ip.Pass) > 0 {
		pass = summaryCount(len(ip.Pass), "server name") + " passed opaque" + summaryNames(globPatterns(ip.Pass))
	}
	return "tcp " + strings.Join(ports, ",") + "; " + pass + "; a client refusing carbd's CA: " + ip.OnRefusedCA.String()
}
