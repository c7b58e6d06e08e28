//go:build linux

package bpf

import "github.com/cilium/ebpf"

// LoadTc returns the collection spec of tc.c: the program carbd_ingress
// and its maps flows, verdicts, config and counters. pkg/hooks/tcx is its
// only user; it mirrors the C types of bpf/include/carbd/tc.h.
func LoadTc() (*ebpf.CollectionSpec, error) { return loadTc() }
