// Package carbd holds the code-generation entry points of the repository.
//
// `make generate` (or `go generate .`) rebuilds the eBPF objects and their
// Go bindings in bpf/ with clang-14 through bpf2go, pinned as a tool in
// go.mod.
package carbd

//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror" -go-package bpf -output-dir bpf -tags linux tc bpf/tc.c -- -I bpf/include
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror" -go-package bpf -output-dir bpf -tags linux -target amd64 ftrace bpf/ftrace.c -- -I bpf/include
