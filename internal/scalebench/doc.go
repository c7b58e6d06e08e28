// Package scalebench measures carbd at fleet scale on one host: many
// `carbd run` processes at once, each a namespace sandbox with its own
// verdict loop (issue 13, "a hundred sandboxes per host").
//
// # What it measures
//
// BenchmarkHundredSandboxes starts CARBD_SCALE_N (default 100) `carbd
// run` processes at once in front of one world namespace (an HTTP
// server), each running a small agent loop: three HTTP requests its task
// names and three file writes. It reports
//
//   - start-to-exec latency, p50 and p99: from the start of `carbd run`
//     to the agent's first instruction (a timestamp the agent writes);
//   - decisions per second across all sandboxes during the agent loops
//     (every decision in the sandboxes' decision logs);
//   - memory per idle sandbox, from the difference between N and N/2
//     idle sandboxes (and N/2 and none, to check that it is linear):
//     carbd's proportional set size (PSS), the sandbox's processes (the PSS
//     of its cgroup's members), and the
//     kernel's (slab, page tables, kernel stacks, per-CPU, vmalloc);
//   - memory per held flow: each remaining sandbox holds
//     CARBD_SCALE_HELD (default 3) requests the operator is asked about;
//   - isolation: each sandbox's decision log holds only its own requests
//     (their URLs name the sandbox) and every sandbox has its own bound
//     queue (/proc/net/netfilter/nfnetlink_queue).
//
// The agent idles blocked on a control FIFO (/run/carbd/ctl in the
// sandbox) that the benchmark writes "hold" or "exit" to: an idle agent
// forks nothing (one polling with `sleep 0.1` forked ten traced
// processes a second, and with every sandbox's file tracer running on
// every system call of the host, their cost grew with the square of the
// sandboxes running).
//
// BenchmarkStartWhileRunning is the steady-state reading of the same
// goal: CARBD_SCALE_N sandboxes (default 20) started one after another,
// each once the one before idles, so that start k is measured with k-1
// running; start-to-exec p50 and p90 over all starts, the first, the
// last and the last tenth's p50, the cost of one system call on the host
// before the first start and with all running, and isolation.
// CARBD_SCALE_LOG (a directory) keeps the logs of its first, middle and
// last start (of every start, in BenchmarkHundredSandboxes) with their
// start and exec times, for a profiling build's start-up marks.
//
// BenchmarkStartToExec is the start-up goal's own setting: one sandbox
// at a time, CARBD_START_N starts (default 10) whose agent stamps the
// time and exits; start-to-exec p50 and p90, and start to exit. Given
// CARBD_SCALE_BASE_BIN (another carbd build), it starts that one in turn
// with this one and reports the ratio of their medians (start/base): a
// before/after within one run, on a machine whose load changes.
//
// # Requirements
//
// Root (namespaces, BPF, netfilter), curl, and a Go toolchain to build
// carbd (or CARBD_SCALE_BIN, a carbd binary to measure). Skipped without
// root. Everything it creates (the runs, their links,
// rules, pinned BPF state, cgroups, mounts, the world namespace, the
// state directories) is removed when it ends, failed or not; a carbd
// whose benchmark process dies gets SIGTERM (Pdeathsig) and tears itself
// down.
package scalebench
