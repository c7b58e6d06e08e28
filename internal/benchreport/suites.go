package main

// suites lists the benchmarks of the report, their goals (from the issues)
// and the same-run baselines they are compared with.
var suites = []suite{
	{
		Title: "Decision engine (pkg/decide)",
		Pkg:   "./pkg/decide/",
		Bench: "DecidePolicyOnly",
		// CPU-bound figures that vary by 1-10 % between runs at 1s
		// (quiet machine, 2026-12-01): a third of the time is enough.
		Benchtime: "300ms",
		Goals: []goal{
			{Name: "BenchmarkDecidePolicyOnly", Metric: "decisions/s", Text: "policy-only decisions ≥ 1M/s on one core", OK: func(v float64) bool { return v >= 1e6 }},
			{Name: "BenchmarkDecidePolicyOnly", Metric: "allocs/op", Text: "no allocation per released decision (amortised)", OK: func(v float64) bool { return v == 0 }},
		},
	},
	{
		Title: "Sensitive scan and provenance sets (pkg/decide/match)",
		Pkg:   "./pkg/decide/match/",
		Bench: "Scan1MiB10kTokens|Add10kTokens|ValueSetContains",
		// 1s runs varied by 1-10 % (3 runs, quiet machine).
		Benchtime: "300ms",
		Tags:      "hyperscan", // Hyperscan's cgo shim (pkg/decide/match/hsbench), when the machine has it
		Needs:     needHyperscan,
		Ratios: []ratio{
			{Label: "carbd's index vs Hyperscan 5.4 (Norm + literal block scan)", Name: "BenchmarkScan1MiB10kTokens/index/Scan", Base: "BenchmarkScan1MiB10kTokens/hyperscan", Metric: "MB/s"},
			{Label: "carbd's index vs a strings.Contains loop", Name: "BenchmarkScan1MiB10kTokens/index/Scan", Base: "BenchmarkScan1MiB10kTokens/naive-contains", Metric: "MB/s"},
			{Label: "carbd's index vs petar-dambovaliev/aho-corasick", Name: "BenchmarkScan1MiB10kTokens/index/Scan", Base: "BenchmarkScan1MiB10kTokens/petar-dambovaliev-aho-corasick", Metric: "MB/s"},
			{Label: "carbd's index vs cloudflare/ahocorasick", Name: "BenchmarkScan1MiB10kTokens/index/Scan", Base: "BenchmarkScan1MiB10kTokens/cloudflare-ahocorasick", Metric: "MB/s"},
		},
		Goals: []goal{
			{Name: "BenchmarkScan1MiB10kTokens/index/Scan", Metric: "MB/s", Text: "sensitive scan of 1 MiB against 10,000 tokens ≥ 1 GB/s", OK: func(v float64) bool { return v >= 1000 }},
			{Name: "BenchmarkAdd10kTokens", Metric: "ns/op", Text: "adding 10,000 tokens < 50 ms", OK: func(v float64) bool { return v < 50e6 }},
		},
	},
	{
		// Issue 11, item 3: the cost of parsing a structured tool result
		// for the policy's field rules, against observing it without.
		Title:     "Field-level trust (pkg/decide)",
		Pkg:       "./pkg/decide/",
		Bench:     "ObserveFieldTrust",
		Benchtime: "300ms",
		Ratios: []ratio{
			{Label: "observing a 20 KiB structured tool result with a field rule vs without (time)", Name: "BenchmarkObserveFieldTrust/fields", Base: "BenchmarkObserveFieldTrust/baseline", Metric: "ns/op"},
		},
	},
	{
		Title: "Conformal calibration (pkg/calib)",
		Pkg:   "./pkg/calib/",
		Bench: "Calibrate1M|Allowed|CalibrateLedger",
		// 1s runs varied by 1-9 % (3 runs, quiet machine).
		Benchtime: "300ms",
		Goals: []goal{
			{Name: "BenchmarkCalibrate1M/field", Metric: "ns/op", Text: "calibrating 1M fields < 1 s", OK: func(v float64) bool { return v < 1e9 }},
			{Name: "BenchmarkCalibrate1M/transfer-episode", Metric: "ns/op", Text: "calibrating 1M fields by the transfer rule (episode units) < 1 s", OK: func(v float64) bool { return v < 1e9 }},
		},
	},
	{
		Title: "AgentDojo evaluation (pkg/calib/eval)",
		Pkg:   "./pkg/calib/eval/",
		Bench: "EvaluatePipeline",
	},
	{
		Title: "TC datapath (pkg/hooks/tcx)",
		Pkg:   "./pkg/hooks/tcx/",
		Bench: ".",
		Root:  true,
		// BenchmarkProgram's kernel loop ran 9-12 M packets a run at 1s,
		// the 3 runs within 2-5 %; BenchmarkReleasedTCPThroughput does
		// not depend on it (its rounds take 20 s).
		Benchtime: "300ms",
		Goals: []goal{
			{Name: "BenchmarkReleasedTCPThroughput", Metric: "carbd-ratio", Text: "released-flow TCP throughput, carbd (guest untracked) vs the routed path without carbd ≥ 0.95", OK: func(v float64) bool { return v >= 0.95 }},
			{Name: "BenchmarkReleasedTCPThroughput", Metric: "nat-ratio", Text: "released-flow TCP throughput, carbd vs the same masqueraded path without carbd (as carbd run routes) ≥ 0.95", OK: func(v float64) bool { return v >= 0.95 }},
		},
	},
	{
		Title: "Verdict loop (pkg/hooks/nfq)",
		Pkg:   "./pkg/hooks/nfq/",
		Bench: "ReleasedTCPThroughput|FirstPacketLatency|DecisionsPerSecond|HeldFlowsMemory",
		Root:  true,
		Goals: []goal{
			{Name: "BenchmarkReleasedTCPThroughput", Metric: "carbd/baseline", Text: "released-flow TCP throughput through the loop, guest untracked, vs routed without carbd ≥ 0.95", OK: func(v float64) bool { return v >= 0.95 }},
			{Name: "BenchmarkReleasedTCPThroughput", Metric: "carbd-nat/nat", Text: "released-flow TCP throughput through the loop, masqueraded, vs the same NAT path without carbd ≥ 0.95", OK: func(v float64) bool { return v >= 0.95 }},
			{Name: "BenchmarkFirstPacketLatency", Metric: "added-p99-µs", Text: "added first-packet latency p99 ≤ 200 µs", OK: func(v float64) bool { return v <= 200 }},
		},
	},
	{
		// Issue 9. mitmdump is Debian's mitmproxy (make setup); without it
		// the mitmdump figures and their goals are "not measured".
		Title: "TLS interception (pkg/hooks/intercept)",
		Pkg:   "./pkg/hooks/intercept/",
		Bench: "Intercept",
		Goals: []goal{
			{Name: "BenchmarkIntercept/h1", Metric: "carbd/mitmdump", Text: "keep-alive HTTPS requests/s, HTTP/1.1, carbd vs mitmdump ≥ 10×", OK: func(v float64) bool { return v >= 10 }},
			{Name: "BenchmarkIntercept/h2", Metric: "carbd/mitmdump", Text: "keep-alive HTTPS requests/s, HTTP/2, carbd vs mitmdump ≥ 10×", OK: func(v float64) bool { return v >= 10 }},
			{Name: "BenchmarkIntercept/h1", Metric: "added-p99-µs", Text: "latency added to an HTTP/1.1 request vs direct TLS, p99 ≤ 1 ms", OK: func(v float64) bool { return v <= 1000 }},
			{Name: "BenchmarkIntercept/h2", Metric: "added-p99-µs", Text: "latency added to an HTTP/2 request vs direct TLS, p99 ≤ 1 ms", OK: func(v float64) bool { return v <= 1000 }},
			{Name: "BenchmarkIntercept/download-h1", Metric: "carbd/direct", Text: "100 MiB download over HTTP/1.1, carbd vs direct TLS ≥ 0.9×", OK: func(v float64) bool { return v >= 0.9 }},
			{Name: "BenchmarkIntercept/download-h2", Metric: "carbd/direct", Text: "100 MiB download over HTTP/2, carbd vs direct TLS ≥ 0.9×", OK: func(v float64) bool { return v >= 0.9 }},
		},
	},
	{
		// Issue 9: the policy's intercept.pass (opaque pass-through) and
		// the ClientHello read before every redirected connection.
		Title: "TLS pass-through and ClientHello peek (pkg/hooks/intercept Front)",
		Pkg:   "./pkg/hooks/intercept/",
		Bench: "^BenchmarkFront$",
		Goals: []goal{
			{Name: "BenchmarkFront/download-pass", Metric: "pass/direct", Text: "download through an opaque pass-through vs direct TLS ≥ 0.9×", OK: func(v float64) bool { return v >= 0.9 }},
			{Name: "BenchmarkFront/handshake", Metric: "front/proxy", Text: "new intercepted connections/s with the ClientHello peek vs without ≥ 0.95×", OK: func(v float64) bool { return v >= 0.95 }},
		},
	},
	{
		// Issue 13: what a download costs per MiB, beside the floor of a
		// bare crypto/tls pair (docs/interception.md, "Issue 13:
		// downloads"): CPU per MiB is steadier than MB/s on a shared host.
		Title: "Download CPU per MiB (pkg/hooks/intercept)",
		Pkg:   "./pkg/hooks/intercept/",
		Bench: "^BenchmarkDownloadCPU$",
		Ratios: []ratio{
			{Label: "CPU per MiB of an HTTP/1.1 download through carbd vs direct (client and world included)", Name: "BenchmarkDownloadCPU/h1/carbd", Base: "BenchmarkDownloadCPU/h1/direct", Metric: "cpu-µs/MiB"},
			{Label: "CPU per MiB of an HTTP/2 download through carbd vs direct (client and world included)", Name: "BenchmarkDownloadCPU/h2/carbd", Base: "BenchmarkDownloadCPU/h2/direct", Metric: "cpu-µs/MiB"},
			{Label: "CPU per MiB of a direct HTTP/1.1 download vs a bare crypto/tls pair (what carbd's decryption and re-encryption cost at least)", Name: "BenchmarkDownloadCPU/h1/direct", Base: "BenchmarkDownloadCPU/tls-pair", Metric: "cpu-µs/MiB"},
		},
	},
	{
		// The VM backends' control channel (issue 9: the env message).
		Title: "Control channel (pkg/ctrl)",
		Pkg:   "./pkg/ctrl/",
		Bench: ".",
		// 1s runs varied by 0.5-30 % (EncodeOutput), 3 runs, quiet machine.
		Benchtime: "300ms",
	},
	{
		Title: "Packet parsing (pkg/hooks/netparse)",
		Pkg:   "./pkg/hooks/netparse/",
		Bench: ".",
		// 37 benchmarks took 219 s at 1s each (the harness's sizing runs
		// double it), their 3 runs within 0.6-7.6 % of each other.
		Benchtime: "200ms",
	},
	{
		Title: "Staging (pkg/staging)",
		Pkg:   "./pkg/staging/",
		Bench: "FileCycle|Commit",
		Root:  true,
		Ratios: []ratio{
			{Label: "4 KB cycle on the staged merged view vs plain overlayfs", Name: "BenchmarkFileCycle/staged", Base: "BenchmarkFileCycle/overlay", Metric: "ns/op"},
			{Label: "4 KB cycle on the staged merged view vs plain ext4", Name: "BenchmarkFileCycle/staged", Base: "BenchmarkFileCycle/ext4", Metric: "ns/op"},
		},
	},
	{
		// Issue 13, scale: 20 sandboxes at once, and 20 started one
		// after another with the earlier ones running (the steady-state
		// reading), here (the 100 take minutes on a 2-core host:
		// docs/scale.md has them, run by hand).
		Title: "Many sandboxes (internal/scalebench)",
		Pkg:   "./internal/scalebench/",
		// One carbd for both scalebench suites (each of their benchmarks
		// built its own: five builds a run).
		CarbdEnv: "CARBD_SCALE_BIN",
		Bench:    "HundredSandboxes/sandboxes=20$|StartWhileRunning",
		Root:     true,
		Goals: []goal{
			{Name: "BenchmarkHundredSandboxes/sandboxes=20", Metric: "start-p50-ms", Text: "start-to-exec latency p50 ≤ 150 ms, sandboxes started at once", OK: func(v float64) bool { return v <= 150 }},
			{Name: "BenchmarkStartWhileRunning/sandboxes=20", Metric: "start-p50-ms", Text: "start-to-exec latency p50 ≤ 150 ms, sandboxes started one after another, the earlier ones running", OK: func(v float64) bool { return v <= 150 }},
			{Name: "BenchmarkStartWhileRunning/sandboxes=20", Metric: "isolation-violations", Text: "no cross-talk when started one after another", OK: func(v float64) bool { return v == 0 }},
			{Name: "BenchmarkHundredSandboxes/sandboxes=20", Metric: "isolation-violations", Text: "no sandbox's packets decided in another's loop, a queue each", OK: func(v float64) bool { return v == 0 }},
			{Name: "BenchmarkHundredSandboxes/sandboxes=20", Metric: "linearity", Text: "memory per idle sandbox linear (N/2→N vs 0→N/2 within 25 %)", OK: func(v float64) bool { return v >= 0.75 && v <= 1.25 }},
		},
	},
	{
		// Issue 13, start-up: one sandbox at a time (10 starts an
		// iteration), the goal's own setting.
		Title: "Start-up of one sandbox (internal/scalebench)",
		Pkg:   "./internal/scalebench/",
		// One carbd for both scalebench suites (each of their benchmarks
		// built its own: five builds a run).
		CarbdEnv: "CARBD_SCALE_BIN",
		Bench:    "StartToExec",
		Root:     true,
		Goals: []goal{
			{Name: "BenchmarkStartToExec", Metric: "start-p50-ms", Text: "start-to-exec latency p50 ≤ 150 ms, one netns sandbox", OK: func(v float64) bool { return v <= 150 }},
		},
	},
	{
		Title: "File tracing (pkg/hooks/fileev)",
		Pkg:   "./pkg/hooks/fileev/",
		// The goals' benchmark and the two that explain it; not the
		// per-host costs (BenchmarkHostSyscall, BenchmarkNewTracer: 2.5
		// min more), run by hand (docs/file-events.md).
		Bench: "FileCycle|ReaderThroughput",
		Root:  true,
		// BenchmarkReaderThroughput spends most of its time filling the
		// ring with the timer stopped, and the harness sizes it to the
		// benchtime: 269 s of 669 at 1s on the loaded machine; its 3 runs
		// within 2-6 % (quiet). FileCycleBPF's 3 runs (bpf-ns/op) within
		// 3-15 %. FileCycle does not depend on it (a run is 8 rounds of
		// 250 cycles per variant, over the benchtime).
		Benchtime: "300ms",
		Goals: []goal{
			{Name: "BenchmarkFileCycle/fsync", Metric: "ratio", Text: "4 KB cycle with tracing ≤ 1.15 × without", OK: func(v float64) bool { return v <= 1.15 }},
			{Name: "BenchmarkFileCycle/nofsync", Metric: "ratio", Text: "4 KB cycle without fsync, with tracing ≤ 1.15 × without", OK: func(v float64) bool { return v <= 1.15 }},
			{Name: "BenchmarkFileCycle/nofsync", Metric: "cpu-ratio", Text: "4 KB cycle without fsync, CPU time (traced process and reader) with tracing ≤ 1.15 × without", OK: func(v float64) bool { return v <= 1.15 }},
		},
	},
}
