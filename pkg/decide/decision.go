package decide

import (
	"fmt"
	"strings"
	"time"
)

// Layer names the part of the pipeline that decided (DESIGN.md, "Decision
// pipeline").
type Layer string

const (
	LayerRule       Layer = "rule"       // an explicit refuse rule of the operator
	LayerInternal   Layer = "internal"   // an internal channel (the model provider): released and logged
	LayerProvenance Layer = "provenance" // the policy's provenance and clearance questions
	LayerCRC        Layer = "crc"        // per-role conformal thresholds on the gated fields
	LayerLedger     Layer = "ledger"     // the G-CARB ledger gate stopped the episode
	LayerScope      Layer = "scope"      // held with the open speculative scope
	LayerOracle     Layer = "oracle"     // the decision oracle resolved a deferred effect
)

// Reason codes: the machine-readable part of a decision.
const (
	CodeRefuseRule      = "refuse-rule"        // an explicit rule matched
	CodeInternal        = "internal-channel"   // released to an internal channel
	CodeTrusted         = "trusted"            // every gated value derivable, data cleared
	CodeUntrustedValue  = "untrusted-value"    // a gated value is not derivable from T
	CodeUncleared       = "uncleared"          // sensitive data above the destination's clearance
	CodeUnknownParty    = "unknown-party"      // the policy does not name the destination
	CodeCRCAllowed      = "crc-allowed"        // untrusted gated values scored under their thresholds
	CodeCRCReverted     = "crc-reverted"       // gated values over threshold were reverted to trusted ones
	CodeCRCOver         = "crc-over-threshold" // a gated value scored over its threshold, no trusted value to revert to
	CodeJoinsScope      = "joins-scope"        // admissible alone, held with the open scope
	CodeLedgerStop      = "ledger-stop"        // the ledger gate's score reached λ̂
	CodeEpisodeStopped  = "episode-stopped"    // the episode was stopped earlier
	CodeOracleRelease   = "oracle-release"     // the oracle released a deferred effect
	CodeOracleRefuse    = "oracle-refuse"      // the oracle refused a deferred effect
	CodeOracleFailed    = "oracle-failed"      // the oracle failed (error, timeout, unparsable): refuse
	CodeOracleUnanswerd = "oracle-no-answer"   // the oracle gave no decision for this effect: refuse
	CodeOracleWithdrawn = "oracle-withdrawn"   // the question was withdrawn: nobody waits for the effect any more (refused)
	CodeMalformed       = "malformed-event"    // the event itself is not decidable
)

// Reason is why a decision was taken, in machine-readable form.
type Reason struct {
	Code      string  `json:"code"`
	Rule      string  `json:"rule,omitempty"`      // the refuse rule or internal channel
	Field     string  `json:"field,omitempty"`     // the field that failed
	Role      Role    `json:"role,omitempty"`      // its role
	Value     string  `json:"value,omitempty"`     // the value that failed (truncated)
	Origin    string  `json:"origin,omitempty"`    // where that value came from, if carbd saw it arrive
	Level     string  `json:"level,omitempty"`     // the sensitivity join of the effect
	Clearance string  `json:"clearance,omitempty"` // the destination's clearance
	Party     string  `json:"party,omitempty"`     // the destination party
	Token     string  `json:"token,omitempty"`     // a sensitive token found (truncated)
	TokenFrom string  `json:"token_origin,omitempty"`
	Score     float64 `json:"score,omitempty"`     // a CRC score or the ledger score
	Threshold float64 `json:"threshold,omitempty"` // the threshold it was compared with
}

// Revert records a gated field the CRC layer reverted to a trusted value.
type Revert struct {
	Field string  `json:"field"`
	Role  Role    `json:"role"`
	From  string  `json:"from"`
	To    string  `json:"to"`
	Score float64 `json:"score"`
}

// Decision is the engine's decision on one outgoing effect.
type Decision struct {
	Seq     uint64  `json:"seq"`
	Verdict Verdict `json:"verdict"`
	Layer   Layer   `json:"layer"`
	Kind    Kind    `json:"kind"`
	// Scope is the speculative scope holding the effect (Verdict Defer),
	// 0 when the effect is not held.
	Scope uint64 `json:"scope,omitempty"`
	// Policy is what the policy alone said (release or defer) before
	// scopes, thresholds and the oracle.
	Policy Verdict `json:"policy_verdict,omitempty"`
	Reason Reason  `json:"reason"`
	// Also are the further reasons the policy had to defer the effect
	// (the first is Reason): an untrusted target that also carries data
	// above its destination's clearance lists both, with the evidence.
	Also          []Reason `json:"also,omitempty"`
	Justification string   `json:"justification"`
	Reverts       []Revert `json:"reverts,omitempty"`
	// Fields are the effect's fields as released: with reverts applied.
	Fields []Field `json:"-"`
	// Scores are the per-field scores when Options.Score is set: one per
	// field with a value, in the effect's field order, computed against
	// the contexts before this effect.
	Scores []FieldScore `json:"scores,omitempty"`
	// Gate is the ledger gate's score of this proposal (Table 1 on its
	// dependency-selected evidence) when the graph is kept
	// (Options.Ledger or a calibrated ledger); 0 when it was not scored
	// (no graph, or the episode was already stopped).
	Gate  float64 `json:"gate,omitempty"`
	Event *Event  `json:"-"`
}

// FieldScore is the score of one field of an effect (package score:
// sim to the untrusted context minus sim to the trusted prompt, in
// [0, 1]), with what the provenance check said about it at that point.
type FieldScore struct {
	Field string  `json:"field"`
	Role  Role    `json:"role"`
	Score float64 `json:"score"`
	// Gated: the operation gates the field's role (target, credential,
	// command by default), so the CRC layer compares it with its role's
	// threshold unless it is derivable.
	Gated bool `json:"gated"`
	// Derivable: the value is derivable from T at that point: provenance
	// lets it through whatever its score.
	Derivable bool `json:"derivable"`
}

// Resolution is the outcome of resolving a speculative scope: the final
// verdict of every effect it held.
type Resolution struct {
	Scope   uint64     `json:"scope"`
	Trigger string     `json:"trigger"`
	Effects []Decision `json:"effects"`
	// Committed is true when every held effect was released.
	Committed bool `json:"committed"`
	// Notice is the abort notice for the agent when something was
	// withheld, empty otherwise.
	Notice string    `json:"notice,omitempty"`
	Time   time.Time `json:"time"`
}

// Refused returns the effects of the resolution that were refused.
func (r *Resolution) Refused() []Decision {
	var out []Decision
	for _, d := range r.Effects {
		if d.Verdict == Refuse {
			out = append(out, d)
		}
	}
	return out
}

// Result is what Propose returns: the decision on the proposed effect, and
// any scope it forced to resolve first.
type Result struct {
	Decision    Decision
	Resolutions []Resolution
}

// Summary renders an event in one line for logs, audits and the oracle.
func (e *Event) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Ch, e.Dir)
	if e.Op != "" {
		fmt.Fprintf(&b, " %s", e.Op)
	}
	fmt.Fprintf(&b, " %s", clip(e.Obj, 120))
	for _, f := range e.Fields {
		fmt.Fprintf(&b, " %s[%s]=%q", f.Name, f.Role, clip(f.Value, 60))
	}
	if e.Opaque {
		b.WriteString(" (opaque)")
	}
	return b.String()
}

// clip shortens s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && s[i]&0xc0 == 0x80 {
		i--
	}
	return s[:i] + "…"
}

// AbortNotice is the message the agent receives when held effects are
// refused (Kairos §III-D): which effects were withheld, that the rest of
// the task continues, and that only effects the task explicitly requires
// may be re-issued.
func AbortNotice(refused []Decision) string {
	if len(refused) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("carbd withheld the following effects; they did not happen:\n")
	for _, d := range refused {
		s := "effect"
		if d.Event != nil {
			s = d.Event.Summary()
		}
		fmt.Fprintf(&b, "- #%d %s: %s\n", d.Seq, s, d.Justification)
	}
	b.WriteString("The rest of your task continues: proceed with it. Re-issue a withheld effect only if the user's task explicitly requires it.")
	return b.String()
}
