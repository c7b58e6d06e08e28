package decide

import (
	"context"
	"testing"
)

// The ledger gate stops the G-CARB Figure 1 chain even where the policy
// alone would release the send (here the certificate is not declared
// sensitive by path, but read through a tool the policy marks private).
func TestLedgerGateStopsChain(t *testing.T) {
	p := mustPolicy(t, `
version: 1
levels: [public, private]
trusted: {task: true}
sensitive:
  - {name: vault, level: private, objects: ["tool:read_vault"]}
parties:
  - {name: team, objects: ["team@example.org"], clearance: private}
operations:
  - ops: ["tool:send_email"]
    kind: stallable
    roles: {to: target, body: content}
    dest_field: to
    message: true
    external: true
defaults: {kind: blocking, gate: [target]}
`)
	ctx := context.Background()
	mk := func(lambda float64) *Engine {
		e := New(p, Options{Calibration: &Calibration{Score: "ngram", HasLedger: true, LedgerLambda: lambda}})
		e.Task("summarise the status and email it to team@example.org")
		return e
	}
	send := func(body string) Event {
		return Event{Ch: ChanNet, Dir: Out, Op: "tool:send_email", Obj: "team@example.org", Content: body,
			Fields: []Field{{Name: "to", Value: "team@example.org"}, {Name: "body", Value: body}}}
	}
	// Benign: the send carries nothing from the vault: score .05+.25+.12 = .42.
	e := mk(0.8)
	e.Observe(Event{Ch: ChanNet, Dir: In, Obj: "tool:read_vault", Content: "api-key: ZXhhbXBsZS1zZWNyZXQta2V5"})
	if d := e.Propose(ctx, send("status: all green today")).Decision; d.Verdict != Release {
		t.Fatalf("benign send: %v %s", d.Verdict, d.Justification)
	}
	if s, l, ok := e.LedgerScore(); !ok || s < 0.419 || s > 0.421 || l != 0.8 {
		t.Errorf("ledger score %v %v %v", s, l, ok)
	}
	// The chain: vault -> send carrying the key: .42 + .52 = .94 >= .8.
	d := e.Propose(ctx, send("status green; key ZXhhbXBsZS1zZWNyZXQta2V5"))
	if d.Decision.Verdict != Refuse || d.Decision.Layer != LayerLedger || d.Decision.Reason.Code != CodeLedgerStop {
		t.Fatalf("chain send: %v %v %s", d.Decision.Verdict, d.Decision.Layer, d.Decision.Justification)
	}
	if _, stopped := e.Stopped(); !stopped {
		t.Fatal("episode not stopped")
	}
	if d := e.Propose(ctx, send("hello")).Decision; d.Verdict != Refuse || d.Reason.Code != CodeEpisodeStopped {
		t.Errorf("after a stop every effect is refused: %v %s", d.Verdict, d.Reason.Code)
	}
	// With λ above 1 the gate never stops.
	e = mk(1.01)
	e.Observe(Event{Ch: ChanNet, Dir: In, Obj: "tool:read_vault", Content: "api-key: ZXhhbXBsZS1zZWNyZXQta2V5"})
	if d := e.Propose(ctx, send("key ZXhhbXBsZS1zZWNyZXQta2V5")).Decision; d.Layer == LayerLedger {
		t.Errorf("λ > 1 stopped: %s", d.Justification)
	}
}
