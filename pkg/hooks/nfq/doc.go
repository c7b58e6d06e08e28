// Package nfq is the NFQUEUE verdict loop of carbd's network channel:
// it receives the packets of one sandbox that the fast path
// (pkg/hooks/tcx) could not decide, turns them into effects with
// pkg/hooks/netparse, has a Decider (the engine, through EngineDecider)
// decide each effect once, and gives every packet exactly one verdict.
//
//	guest ─▶ tcx (marks undecided) ─▶ nfrules (NFQUEUE N) ─▶ Loop ─▶ Decider
//	                ▲                                          │
//	                └──── Release(k, seqEnd) / Refuse(k) ──────┘
//
// # Verdicts
//
// A packet is accepted (NF_REPEAT with the pass mark, so the host's own
// rules still apply) when every effect its bytes belong to is released;
// it is dropped when one of them is refused, or on any failure. Packets
// of an effect that is not complete yet (a request split over segments),
// or whose decision is pending or held (Outcome Hold, resolved later by
// Loop.Resolve), stay queued without a verdict, up to per-flow bounds and
// HoldTimeout; then they are refused. TCP control packets without payload
// (SYN, ACK, FIN) carry no effect and are accepted; a released TCP request
// moves the flow's released byte range on the fast path, so its ACKs and
// retransmissions never come back, while the next request does. A
// refused TCP flow is refused on the fast path and its client gets a RST.
// When the loop stops, every packet still held is dropped before the
// queue is unbound; a dead loop's queue drops everything (no bypass, no
// fail-open). docs/verdict-loop.md has the whole design and its figures.
//
// # Requirements
//
// Linux with nfnetlink_queue, root (CAP_NET_ADMIN; CAP_NET_RAW for the
// RSTs), the queue's rules installed (pkg/hooks/nfrules) and, for the
// fast path, the TC program (pkg/hooks/tcx). The core (workers,
// decisions, accounting) is portable Go.
//
// # Tests
//
// Unit tests drive the core with synthetic packets and record its
// verdicts (ordering, holds, timeouts, parts of bodies, panics, random
// interleavings with the one-verdict invariant); they run anywhere.
// The privileged tests build guest, router and world namespaces, attach
// the real TC program and netfilter rules on the router and run the loop
// there against real clients and servers (curl, dig, ping, raw sockets,
// Go's HTTP client): for each egress class a refused effect leaves no
// byte on the world's wire and a released one arrives intact; holds,
// timeouts, kill -9 of a child process running the loop, a flood beyond
// the queue's length, shutdown and worker panics. Benchmarks measure
// throughput, first-packet latency (and, with Config.Timing, where it
// goes, stage by stage), decisions per second, the memory of 10,000
// held flows and the receive buffer a burst needs. The offload
// tests put the guest behind vnet-header taps as Cloud Hypervisor's
// virtio-net does (TSO/USO super-packets with partial checksums, UFO),
// with the queue's GSO flag off and on (docs/network.md, "Tap offloads"). FuzzPeek and
// FuzzParseQueueProc keep their corpus under testdata/fuzz.
package nfq
