package decide

import (
	"fmt"
	"net/netip"
	"time"
)

// Channel is one of the I/O channels of the isolation boundary (Kairos §II-C).
type Channel uint8

const (
	ChanFile Channel = iota + 1 // the mediated working directory
	ChanNet                     // other parties beyond the boundary
	ChanCtrl                    // the principal: task in, result out
)

var channelNames = [...]string{ChanFile: "file", ChanNet: "net", ChanCtrl: "ctrl"}

func (c Channel) String() string {
	if int(c) < len(channelNames) && channelNames[c] != "" {
		return channelNames[c]
	}
	return fmt.Sprintf("channel(%d)", uint8(c))
}

// ParseChannel parses "file", "net" or "ctrl".
func ParseChannel(s string) (Channel, error) {
	for i, n := range channelNames {
		if n != "" && n == s {
			return Channel(i), nil
		}
	}
	return 0, fmt.Errorf("decide: unknown channel %q (want file, net or ctrl)", s)
}

func (c Channel) MarshalText() ([]byte, error) { return []byte(c.String()), nil }
func (c *Channel) UnmarshalText(b []byte) error {
	v, err := ParseChannel(string(b))
	*c = v
	return err
}

// Direction says whether an event enters (In) or leaves (Out) the sandbox.
type Direction uint8

const (
	In Direction = iota + 1
	Out
)

func (d Direction) String() string {
	switch d {
	case In:
		return "in"
	case Out:
		return "out"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// ParseDirection parses "in" or "out".
func ParseDirection(s string) (Direction, error) {
	switch s {
	case "in":
		return In, nil
	case "out":
		return Out, nil
	}
	return 0, fmt.Errorf("decide: unknown direction %q (want in or out)", s)
}

func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }
func (d *Direction) UnmarshalText(b []byte) error {
	v, err := ParseDirection(string(b))
	*d = v
	return err
}

// Role is the semantic role of a field of an effect (role-stratified CRC
// paper, §Problem Setup). Target, credential and command are
// integrity-critical: untrusted input must not set them.
type Role uint8

const (
	RoleTarget     Role = iota + 1 // where the effect goes: host, URL, recipient, path, account
	RoleCredential                 // which authority it uses: Authorization, cookies, API keys, passwords
	RoleCommand                    // what it runs: a shell command, a script
	RoleSelector                   // which object it picks: a query string, an id
	RoleControl                    // how it runs: flags, amounts, dates, options
	RoleContent                    // what it carries: a body, a message, file data
)

// Roles lists every role in a fixed order.
var Roles = []Role{RoleTarget, RoleCredential, RoleCommand, RoleSelector, RoleControl, RoleContent}

var roleNames = [...]string{RoleTarget: "target", RoleCredential: "credential", RoleCommand: "command",
	RoleSelector: "selector", RoleControl: "control", RoleContent: "content"}

func (r Role) String() string {
	if int(r) < len(roleNames) && roleNames[r] != "" {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	for i, n := range roleNames {
		if n != "" && n == s {
			return Role(i), nil
		}
	}
	return 0, fmt.Errorf("decide: unknown role %q (want target, credential, command, selector, control or content)", s)
}

func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	*r = v
	return err
}

// Kind says how an effect can be held while it is undecided (Kairos §III-B).
type Kind uint8

const (
	KindUnset Kind = iota // not known yet: the policy's operation table decides
	Stageable             // a write to the mediated working directory: applied to a copy
	Stallable             // a request whose response the agent does not need: held at the boundary
	Blocking              // a request whose response the agent needs: decided before it is sent
)

var kindNames = [...]string{KindUnset: "", Stageable: "stageable", Stallable: "stallable", Blocking: "blocking"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		if k == KindUnset {
			return "unset"
		}
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// ParseKind parses "stageable", "stallable" or "blocking".
func ParseKind(s string) (Kind, error) {
	for i, n := range kindNames {
		if n != "" && n == s {
			return Kind(i), nil
		}
	}
	return 0, fmt.Errorf("decide: unknown effect kind %q (want stageable, stallable or blocking)", s)
}

func (k Kind) MarshalText() ([]byte, error) {
	if k == KindUnset {
		return []byte{}, nil
	}
	return []byte(k.String()), nil
}
func (k *Kind) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*k = KindUnset
		return nil
	}
	v, err := ParseKind(string(b))
	*k = v
	return err
}

// Field is one named value of an outgoing event, with its semantic role.
type Field struct {
	Name  string `json:"name"`
	Role  Role   `json:"role"`
	Value string `json:"value"`
}

// Dest is the network destination of a net event, as far as the hook knows
// it. Host is the name the guest asked for (HTTP Host, TLS SNI, DNS name);
// Addr and Port come from the packet.
type Dest struct {
	Host  string     `json:"host,omitempty"`
	Addr  netip.Addr `json:"addr,omitzero"`
	Port  uint16     `json:"port,omitempty"`
	Proto string     `json:"proto,omitempty"` // tcp, udp, icmp, icmpv6, or the IP protocol number
}

// Event is one operation that crossed the boundary (Kairos Eq. 1):
// (ch, dir, obj, v) plus the operation and, for outgoing events, named
// fields with roles. Events are values: the engine never modifies one it
// was given.
type Event struct {
	Seq     uint64    `json:"seq,omitempty"` // assigned by the engine, in arrival order
	Time    time.Time `json:"time,omitzero"` // when the hook saw it
	Ch      Channel   `json:"ch"`            // file, net or ctrl
	Dir     Direction `json:"dir"`           // in or out
	Obj     string    `json:"obj"`           // path relative to W, destination, or "principal"
	Op      string    `json:"op,omitempty"`  // e.g. http:POST, dns:query, file:write, file:unlink, tool:send_money
	Content string    `json:"content"`       // what was read or what would leave
	Fields  []Field   `json:"fields,omitempty"`
	// Source names where an incoming event came from, for origin
	// statements ("read_file:bill.txt"); empty means Obj.
	Source string `json:"source,omitempty"`
	// Kind of an outgoing effect when the hook knows it; KindUnset leaves
	// it to the policy's operation table.
	Kind Kind  `json:"kind,omitempty"`
	Dest *Dest `json:"dest,omitempty"`
	// Opaque marks an outgoing effect whose content carbd cannot see
	// (TLS without interception, an unknown protocol): it is treated as
	// possibly carrying every sensitive value read so far.
	Opaque bool `json:"opaque,omitempty"`
	// WrittenAsDecided marks a file effect whose content the hook proved
	// to be exactly what the earlier decided writes to Obj produced (the
	// file channel's image of a file created or emptied in this run): Obj
	// is labelled with the label those decisions gave the location, not
	// joined with what the agent has read since. Without a label for Obj
	// it is labelled with the read label, as any write.
	WrittenAsDecided bool `json:"written_as_decided,omitempty"`
}

// Origin is how an incoming event is named in provenance statements.
func (e *Event) Origin() string {
	if e.Source != "" {
		return e.Source
	}
	if e.Op != "" {
		return e.Op + ":" + e.Obj
	}
	return e.Ch.String() + ":" + e.Obj
}

// Verdict is the monitor's decision δ(σ_{i-1}, e_i) for an effect.
type Verdict uint8

const (
	Release Verdict = iota + 1 // emit the effect
	Refuse                     // suppress it permanently and tell the agent
	Defer                      // suppress it provisionally: the oracle resolves it with its scope
)

func (v Verdict) String() string {
	switch v {
	case Release:
		return "release"
	case Refuse:
		return "refuse"
	case Defer:
		return "defer"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }
func (v *Verdict) UnmarshalText(b []byte) error {
	switch string(b) {
	case "release":
		*v = Release
	case "refuse":
		*v = Refuse
	case "defer":
		*v = Defer
	default:
		return fmt.Errorf("decide: unknown verdict %q", b)
	}
	return nil
}
