package main

import (
	"context"
	"fmt"

	"github.com/carbd/carbd/pkg/calib/agentdojo"
)

func init() {
	register(&command{name: "agentdojo", summary: "read AgentDojo run logs (stats: per pipeline and suite counts)",
		forms: []form{{"stats", "per pipeline and suite counts of the runs, and every member skipped with the reason"}}, run: runAgentDojo})
}

func runAgentDojo(ctx context.Context, e *env, args []string) error {
	switch args[0] {
	case "stats":
		return runAgentDojoStats(ctx, e, args[1:])
	}
	return fmt.Errorf("%w: unknown subcommand %q (want stats)", errUsage, args[0])
}

// runAgentDojoStats reads every run and prints the per pipeline and suite
// counts (runs, benign, attacked, injection-as-prompt, attack succeeded,
// errors), the per attack counts with the label columns, and every member
// that was skipped, with the reason. It is the adapter's sanity check: the
// counts must match the data's README.
func runAgentDojoStats(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "agentdojo stats", "--runs PATH [--policies DIR]")
	runs := fs.String("runs", "", "a runs-*.tar.gz archive, a directory of them, or an unpacked folder (required)")
	policies := fs.String("policies", "", "directory of the suite policies (<suite>.yaml), for the roles; optional")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *runs == "" {
		return fmt.Errorf("%w: --runs PATH is required", errUsage)
	}
	d, err := agentdojo.Open(*runs)
	if err != nil {
		return err
	}
	var specs map[string]*agentdojo.SuiteSpec
	if *policies != "" {
		if specs, err = agentdojo.LoadSuiteSpecs(*policies); err != nil {
			return err
		}
	}
	if d.Goals == nil {
		e.log.Warn("no prompts-and-goals.json beside the runs: labels use the injected texts only")
	}
	if d.Envs == nil {
		e.log.Warn("no environments/ beside the runs: labels exclude only values of the user's task")
	}
	st := agentdojo.NewStats()
	for r, err := range d.Runs() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err != nil {
			st.AddError(err)
			continue
		}
		st.Add(r, specs[r.Suite])
	}
	for _, p := range st.Pipelines() {
		if c := st.Sum(agentdojo.StatsKey{Pipeline: p}); c.NoVersion > 0 {
			e.log.Warn("runs without benchmark_version are read as v1.x", "pipeline", p, "runs", c.NoVersion)
		}
	}
	return st.Write(e.stdout)
}
