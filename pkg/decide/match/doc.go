// Package match is carbd's provenance matching (Kairos §III-C/D): it
// decides, by comparing values, whether a value of an effect stems from a
// trusted source and whether an effect carries data read from a
// sensitive source.
//
//   - Norm is Kairos' normalisation: lowercase, whitespace removed.
//   - Extract pulls candidate values out of free text (URLs and hosts,
//     e-mail addresses, IBANs, grouped and plain numbers, paths, quoted
//     strings, chunks, words, and short content whole).
//   - ValueSet is T_i, the trusted values: D(x, T) is equality after Norm.
//     Every value keeps the origin it was first added from.
//   - Index is S_i, the sensitive tokens with their levels and origins:
//     Scan reports every token that occurs anywhere in an effect after
//     Norm, and MaxLevel the join of their levels.
//
// Both sets grow as the agent reads and roll back with Truncate when a
// speculative scope is aborted, so an aborted scope leaves no value
// behind. docs/provenance.md gives every rule with its reason, the
// minimum lengths and their false-positive/false-negative trade-off, the
// index design and its measured speed.
//
// # Requirements
//
// None: the package is pure Go and imports only the standard library. On
// amd64 the normaliser has an SSSE3 kernel for ASCII text (norm_amd64.s,
// used when the CPU has SSSE3); everywhere else, and for non-ASCII text,
// a portable word-at-a-time loop does the same work.
//
// # Concurrency
//
// A ValueSet or an Index needs exclusive access for Add and Truncate;
// any number of lookups (Contains, Origin, Scan, ScanFunc, MaxLevel) may
// run concurrently when no mutation does. An Extractor is for one
// goroutine; Extract and Norm are safe everywhere.
//
// # Testing
//
// Property tests check Norm against the obvious rune-by-rune definition
// (with the vector kernel on and off), and Scan, ScanFunc and MaxLevel
// against a naive reference (normalise the content, strings.Index for
// every token) on random unicode text with whitespace inside tokens,
// tokens across block boundaries, tokens of exactly the minimum length,
// and truncated indexes. FuzzNorm, FuzzScan and FuzzExtract keep their
// corpus in testdata/fuzz. Benchmarks compare the index with a naive
// strings.Contains loop and two Aho-Corasick libraries on the same data,
// and with Hyperscan when built with -tags hyperscan (package hsbench, a
// cgo shim over libhyperscan-dev that nothing else imports).
package match
