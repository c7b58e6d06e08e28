// Package tcx is the kernel fast path of carbd's network channel: it
// loads bpf/tc.c, attaches it on ingress of the host side of a guest's
// interface (the guest's egress), pins it, and gives userspace the maps:
// per-flow verdicts (released with a TCP byte range, refused), the flow
// table, the liveness lease and the counters.
//
// The program marks each packet for netfilter (MarkPass, MarkQueue,
// MarkLinkLocal under MarkMask) or drops it; pkg/hooks/nfrules installs the
// rules that accept, queue or drop by those marks. docs/network.md gives
// the whole data path.
//
// # Lifecycle
//
//	d, err := tcx.Attach(cfg)   // before the guest starts: lease 0, drops all
//	go d.KeepAlive(ctx, 250*time.Millisecond, time.Second)
//	d.Release(key, seqEnd)      // from the verdict loop
//	d.Close()                   // clean stop: detach and unpin
//	d.Leave()                   // or exit as a crash would: stays pinned, enforcing
//	d, err = tcx.Adopt(cfg)     // a restarted carbd takes over the pins
//	d.ReplaceProgram()          // and swaps in its own program atomically
//
// Attach uses a TCX link where the kernel has one (Linux 6.6+) and a
// clsact qdisc with a direct-action cls_bpf filter otherwise; Mode reports
// which.
//
// # Requirements
//
// Linux 5.8+ (the program reads __sk_buff.gso_size; TCX needs 6.6+, else
// the legacy clsact path is used), root (CAP_BPF, CAP_NET_ADMIN,
// CAP_SYS_ADMIN to mount bpffs). The program needs no BTF from the
// kernel. The pins live on a bpf filesystem: /sys/fs/bpf/carbd by
// default, mounted if missing.
//
// # Tests
//
// Privileged tests (root, as in CI) run the program with BPF_PROG_TEST_RUN
// on crafted packets (every parser branch and verdict), and attach it in
// throwaway network namespaces (guest, router, world, see tcxtest) where
// real TCP, UDP and ICMP traffic crosses it, with carbd's netfilter rules
// and a queue listener in the router namespace. Benchmarks measure the
// program's cost per packet and the throughput of a released TCP flow with
// and without it (iperf3). FuzzProgram feeds arbitrary frames to the
// program and checks that nothing undecided ever gets the pass mark.
package tcx
