// Package daemon is `carbd run`: it puts one agent in a sandbox with
// every effect mediated, and serves the operator.
//
// It wires, for one sandbox: the sandbox backend (netns by default), the
// network channel (the TC program on the host side of the sandbox's
// interface, carbd's netfilter queue rules, the NFQUEUE verdict loop, a
// DNS resolver carbd controls, masquerading, a capture for the pcapng
// audit), the file channel (the staging overlay of the working directory
// and eBPF tracing of the sandbox's file operations), the decision engine,
// the control channel to the agent and the operator socket (carbd status,
// held, approve, deny, audit).
//
// # Lifecycle
//
// Start-up order keeps every path mediated from the first packet: the
// staging journal is recovered and the overlay mounted before the sandbox
// exists; the TC program and the queue rules are in place before the host
// side of the veth comes up. When the command exits, the open scope
// resolves, released file changes are committed and refused ones
// aborted, and everything is torn down in reverse order. SIGTERM does the
// same after stopping the sandbox. After SIGKILL the pinned TC program
// (its liveness lease lapses) and the rules keep egress dropped, and the
// next start on the same working directory recovers the journal and the
// pinned state.
//
// # Requirements
//
// Linux, root, BPF, netfilter, overlayfs, user namespaces.
package daemon
