// Package hsbench is a minimal cgo shim over Hyperscan (Intel's
// multi-pattern matcher, the field's reference), used only by the
// benchmarks of package match to compare carbd's Index with Hyperscan on
// the same workload in the same run.
//
// # Requirements
//
// Built only with the build tag hyperscan, cgo and Debian's
// libhyperscan-dev (5.4; `apt-get install libhyperscan-dev`). Without the
// tag the package is empty, so carbd's binary, `go vet ./...` and
// staticcheck never need the library or a C compiler.
//
// # Testing
//
// `go test -tags hyperscan ./pkg/decide/match/hsbench` checks the shim
// on small inputs; `go test -tags hyperscan -run '^$' -bench
// Scan1MiB10kTokens ./pkg/decide/match` runs the comparison, checking
// that Hyperscan finds the same tokens as the Index.
package hsbench
