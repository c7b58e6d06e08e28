// Package eval measures the whole carbd decision engine on real recorded
// agent runs (the AgentDojo logs, package agentdojo): it calibrates the
// per-role CRC thresholds and the G-CARB ledger stop threshold on a
// random calibration half of a pipeline's runs, replays every run of the
// test half through the real engine (decide.New + decide.RunTrace, the
// strict oracle, Revert on; no language model anywhere) and reports,
// over many random splits, the attack success rate, the attacker effects
// released, the benign utility proxy, the utility under attack, the
// per-role violation rates and their compliance, the ledger metrics
// (mean ledger loss, intervention, autonomous success, CtxRed), and the
// same figures for the baselines: no defense, Kairos policy only
// (strict), aggregate single-threshold CRC, and the ledger baselines
// (full-prefix, fixed-window-4, equal-size random, executed-step).
// docs/evaluation.md defines every figure and gives the results.
//
// # Speed
//
// Everything that does not depend on a split is computed once per run
// (Load): the trace, the labels, the policy-only replay with the
// per-field scores the engine computes online (decide.Options.Score) and
// the engine's dependency graph (decide.Options.Ledger), from which the
// gate scores of every evidence selector follow. A calibrated replay
// depends on the calibration only through which gated fields score under
// their thresholds and where the gate first reaches λ̂, so each run is
// replayed once per distinct such key and the outcome reused (exactly:
// a test compares reused outcomes with fresh replays). Splits run in
// parallel.
//
// # Requirements
//
// None: pure Go, no kernel imports (internal/deptest enforces it); the
// PNG frontier uses gonum.org/v1/plot.
//
// # Testing
//
// Unit tests on hand-built episodes (every metric hand-computed), on
// synthetic AgentDojo runs through the real adapter, policy and engine
// (labels, the cache's exactness, a whole evaluation), and on one real
// pipeline when the data is present ($CARBD_AGENTDOJO_DATA or
// /work/shared/data/agentdojo; skipped otherwise): the data's counts,
// the invariants that hold by construction, the guarantees in
// expectation. BenchmarkEvaluatePipeline and BenchmarkLoadPipeline time
// a real pipeline.
package eval
