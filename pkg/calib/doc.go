// Package calib calibrates carbd's statistical layers offline: per-role
// conformal risk control on the fields of effects (role-stratified CRC,
// Equation 5, Algorithm 1, Theorem 2) and the G-CARB ledger stop
// threshold, and evaluates the engine by replaying recorded traces.
//
// # Requirements
//
// None: pure Go, no kernel imports (internal/deptest enforces it).
package calib
