// Package hooks is carbd's kernel-facing side: it attaches the BPF
// programs on the guest's interface and on the file daemon, installs
// netfilter queue rules, runs the NFQUEUE verdict loop, reads ring
// buffers, turns packets and syscalls into decide.Events and applies the
// engine's verdicts.
//
// # Requirements
//
// Linux, root (CAP_NET_ADMIN, CAP_BPF, CAP_SYS_ADMIN), BTF. Privileged
// tests skip with a reason when not root.
package hooks
