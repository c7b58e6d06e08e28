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
// # Operator socket
//
// One Unix socket per sandbox (root only, peer credentials checked)
// serves status, held, approve, deny and the pcapng audit export. Status
// never waits for the engine, which is locked while an oracle is asked:
// the held effects come from the daemon's own record of decisions, the
// engine's counters from a view refreshed in the background
// (docs/status.md, docs/operator.md).
//
// # Requirements
//
// Linux, root, BPF, netfilter, overlayfs, user namespaces.
//
// # Testing
//
// Privileged end-to-end tests run real sandboxes in front of a world
// namespace with an HTTP server: daemon_linux_test.go (what reaches the
// world and the working directory), crash_linux_test.go (carbd run as a
// child process killed with SIGKILL while a request is held and in the
// middle of a commit, then restarted on the same working directory; and
// SIGTERM teardown, checking nothing is left on the host). The operator
// CLI is tested with the real binary in cmd/carbd/cli_linux_test.go.
package daemon
