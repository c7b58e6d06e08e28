// Package decide is carbd's decision engine: pure Go, no root, no kernel.
//
// It turns what crosses the sandbox boundary into release / refuse / defer
// decisions, following Kairos §III: every event (channel, direction,
// object, content, operation, fields with roles) is either an incoming
// event, which feeds provenance (the trusted values T_i and the sensitive
// tokens S_i), or an outgoing effect, which is decided against the policy's
// three questions (an explicit refuse rule; gated values derivable from
// T_{i-1}; sensitive data within the destination's clearance), then by the
// calibrated per-role thresholds and the ledger gate, and deferred effects
// are held in a speculative scope that an oracle resolves.
//
// # Requirements
//
// None: the package imports no kernel-facing code (a test in
// internal/deptest enforces it), so it builds and tests on any OS.
//
// # Testing
//
// Table-driven unit tests use the papers' worked examples; property tests
// check the oracle's bounded authority, that outgoing events never add to
// T, that aborted scopes leave no label behind; the policy and trace
// parsers are fuzzed with a kept corpus.
package decide
