package decide

import (
	"encoding/json"
	"io"
	"time"
)

// AuditRecord is one line of the JSON-lines decision log: every decision
// with its time, the effect, the verdict, the deciding layer, the reason
// and a one-line justification. The schema is stable; fields are only
// ever added.
type AuditRecord struct {
	Type          string      `json:"type"` // "decision" or "resolution"
	Time          time.Time   `json:"time"`
	Seq           uint64      `json:"seq,omitempty"`
	Event         *AuditEvent `json:"event,omitempty"`
	Verdict       Verdict     `json:"verdict,omitempty"`
	Layer         Layer       `json:"layer,omitempty"`
	Kind          Kind        `json:"kind,omitempty"`
	Scope         uint64      `json:"scope,omitempty"`
	Resolved      bool        `json:"resolved,omitempty"` // the final verdict of a held effect
	Policy        Verdict     `json:"policy_verdict,omitempty"`
	Reason        *Reason     `json:"reason,omitempty"`
	Also          []Reason    `json:"also,omitempty"`
	Justification string      `json:"justification,omitempty"`
	Reverts       []Revert    `json:"reverts,omitempty"`
	Trigger       string      `json:"trigger,omitempty"`
	Committed     *bool       `json:"committed,omitempty"`
	Notice        string      `json:"notice,omitempty"`
}

// AuditEvent summarises an effect in an audit record.
type AuditEvent struct {
	Ch           Channel   `json:"ch"`
	Dir          Direction `json:"dir"`
	Op           string    `json:"op,omitempty"`
	Obj          string    `json:"obj"`
	Fields       []Field   `json:"fields,omitempty"`
	ContentBytes int       `json:"content_bytes"`
	Opaque       bool      `json:"opaque,omitempty"`
	Dest         *Dest     `json:"dest,omitempty"`
}

const maxAuditValue = 256

type auditor struct {
	enc *json.Encoder
}

func newAuditor(w io.Writer) *auditor {
	if w == nil {
		return &auditor{}
	}
	return &auditor{enc: json.NewEncoder(w)}
}

func (a *auditor) decision(t time.Time, d *Decision, resolvedScope uint64) {
	if a.enc == nil {
		return
	}
	r := AuditRecord{Type: "decision", Time: t, Seq: d.Seq, Verdict: d.Verdict, Layer: d.Layer, Kind: d.Kind,
		Scope: d.Scope, Resolved: resolvedScope != 0, Policy: d.Policy, Justification: d.Justification, Reverts: d.Reverts, Also: d.Also}
	reason := d.Reason
	r.Reason = &reason
	if ev := d.Event; ev != nil {
		ae := &AuditEvent{Ch: ev.Ch, Dir: ev.Dir, Op: ev.Op, Obj: clip(ev.Obj, maxAuditValue), ContentBytes: len(ev.Content), Opaque: ev.Opaque, Dest: ev.Dest}
		for _, f := range d.Fields {
			f.Value = clip(f.Value, maxAuditValue)
			ae.Fields = append(ae.Fields, f)
		}
		r.Event = ae
	}
	_ = a.enc.Encode(&r)
}

func (a *auditor) resolution(res *Resolution) {
	if a.enc == nil {
		return
	}
	c := res.Committed
	_ = a.enc.Encode(&AuditRecord{Type: "resolution", Time: res.Time, Scope: res.Scope, Trigger: res.Trigger, Committed: &c, Notice: res.Notice})
}
