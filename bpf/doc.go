// Package bpf holds carbd's eBPF C sources and the Go bindings bpf2go
// generates from them (see bpf2go.go at the repository root). The
// generated .go and .o files are committed, so building needs no clang;
// `make generate` rebuilds them with clang-14 and CI checks they are
// current.
package bpf
