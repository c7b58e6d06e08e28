package main

// suites lists the benchmarks of the report, their goals (from the issues)
// and the same-run baselines they are compared with.
var suites = []suite{
	{
		Title: "Decision engine (pkg/decide)",
		Pkg:   "./pkg/decide/",
		Bench: ".",
		Goals: []goal{
			{Name: "BenchmarkDecidePolicyOnly", Metric: "decisions/s", Text: "policy-only decisions ≥ 1M/s on one core", OK: func(v float64) bool { return v >= 1e6 }},
		},
	},
}
