package eval

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/carbd/carbd/pkg/calib/agentdojo"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// Problem is a run that could not be evaluated: a member of the data that
// is not a readable run, or a run that could not be prepared. Problems are
// counted and listed in the report; they never abort an evaluation.
type Problem struct {
	Archive string `json:"archive"`
	Member  string `json:"member,omitempty"`
	Episode string `json:"episode,omitempty"`
	Reason  string `json:"reason"`
}

// Pipeline holds the prepared episodes of one agent pipeline.
type Pipeline struct {
	Name     string
	Episodes []*Episode // benign and attacked runs, sorted by ID
	// InjectionAsPrompt counts the injection-task-as-prompt runs, which
	// are neither benign nor attacked data and are left out.
	InjectionAsPrompt int
	// OtherAttacks counts the attacked runs of attacks not selected.
	OtherAttacks int
	// NoVersion counts the runs read (of every kind) without a
	// benchmark_version: they are read as v1.x, whose injection goals
	// may not be those of a newer suite. NoGoal counts the attacked
	// runs whose injection goal has no text in prompts-and-goals.json
	// for their version (their labels use the injected texts only).
	NoVersion, NoGoal int
	Problems          []Problem
}

// LoadConfig says what to load.
type LoadConfig struct {
	Runs      string   // a runs-*.tar.gz, a directory of them, or an unpacked folder
	Policies  string   // directory of the suite policies (<suite>.yaml)
	Pipelines []string // pipelines to keep; empty keeps every one
	// Attacks are the attacks whose attacked runs are kept; empty keeps
	// every attack. Benign runs are always kept.
	Attacks []string
	Score   score.Kind // similarity kind of the per-field scores
	Seed    uint64     // keys the equal-size random selector's draws
	Workers int        // parallel preparations; 0 means GOMAXPROCS
	// Errors says how an attacked run that ended in an error counts in
	// the no-defense figures (Episode.NoDefenseSucceeded); empty means
	// agentdojo.ErrorsAsRecorded, the benchmark's own convention.
	Errors agentdojo.ErrorCounting
	// Ablate switches off refinements of the engine in every replay of
	// the loaded episodes (decide.Options.Ablate), for the ablation
	// study: pipelines loaded with different ablations are evaluated
	// side by side in one process.
	Ablate decide.Ablation
	// Progress, when set, is called after each prepared run with the
	// number done so far and the pipeline.
	Progress func(pipeline string, done int)
	// PolicyFS, when set, holds the suite policies instead of the
	// directory Policies, which then names them in messages.
	PolicyFS fs.FS
}

// Load reads the runs of the selected pipelines and prepares every
// benign and attacked run (Episode): trace, labels, online scores, gate
// scores, policy-only replay. Unreadable members and runs that cannot be
// prepared become Problems. It fails only when nothing can be read at all
// (a missing path or policy directory, a selected pipeline with no run).
func Load(ctx context.Context, cfg LoadConfig) ([]*Pipeline, error) {
	load := agentdojo.LoadSuiteSpecs
	if cfg.PolicyFS != nil {
		load = func(name string) (map[string]*agentdojo.SuiteSpec, error) {
			return agentdojo.LoadSuiteSpecsFS(cfg.PolicyFS, name)
		}
	}
	specs, err := load(cfg.Policies)
	if err != nil {
		return nil, err
	}
	if _, err := score.ParseKind(string(cfg.Score)); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	if cfg.Errors == "" {
		cfg.Errors = agentdojo.ErrorsAsRecorded
	}
	if _, err := agentdojo.ParseErrorCounting(string(cfg.Errors)); err != nil {
		return nil, fmt.Errorf("eval: %w", err)
	}
	sets, err := openSelected(cfg.Runs, cfg.Pipelines)
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, p := range cfg.Pipelines {
		want[p] = true
	}
	attacks := map[string]bool{}
	for _, a := range cfg.Attacks {
		attacks[a] = true
	}
	workers := cfg.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	byName := map[string]*Pipeline{}
	get := func(name string) *Pipeline {
		p := byName[name]
		if p == nil {
			p = &Pipeline{Name: name}
			byName[name] = p
		}
		return p
	}
	type job struct {
		run  *agentdojo.Run
		spec *agentdojo.SuiteSpec
	}
	type result struct {
		ep  *Episode
		run *agentdojo.Run
		err error
	}
	jobs := make(chan job)
	results := make(chan result)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				ep, err := prepare(ctx, j.run, j.spec, cfg.Score, cfg.Seed, cfg.Errors, cfg.Ablate)
				results <- result{ep, j.run, err}
			}
		}()
	}
	go func() {
		defer close(jobs)
		for _, d := range sets {
			for r, err := range d.Runs() {
				if ctx.Err() != nil {
					return
				}
				if err != nil {
					var re *agentdojo.RunError
					pr := Problem{Reason: err.Error()}
					if errors.As(err, &re) {
						pr = Problem{Archive: re.Archive, Member: re.Member, Reason: re.Err.Error()}
					}
					results <- result{err: &problemError{pr}}
					continue
				}
				if len(want) > 0 && !want[r.Pipeline] {
					continue
				}
				if r.Kind == agentdojo.InjectionAsPrompt || (r.Kind == agentdojo.Attacked && len(attacks) > 0 && !attacks[r.Attack]) {
					results <- result{run: r}
					continue
				}
				spec := specs[r.Suite]
				if spec == nil {
					results <- result{run: r, err: fmt.Errorf("no policy for suite %q in %s", r.Suite, cfg.Policies)}
					continue
				}
				jobs <- job{r, spec}
			}
		}
	}()
	go func() {
		// Close results once the producer is done and the workers drained.
		wg.Wait()
		close(results)
	}()
	done := map[string]int{}
	var orphan []Problem // problems with no pipeline (unreadable members)
	for res := range results {
		var pe *problemError
		switch {
		case errors.As(res.err, &pe):
			orphan = append(orphan, pe.p)
			continue
		case res.err != nil:
			p := get(res.run.Pipeline)
			p.Problems = append(p.Problems, Problem{Archive: res.run.Archive, Member: res.run.Member, Episode: res.run.Episode(), Reason: res.err.Error()})
		case res.ep == nil && res.run.Kind == agentdojo.InjectionAsPrompt:
			get(res.run.Pipeline).InjectionAsPrompt++
		case res.ep == nil:
			get(res.run.Pipeline).OtherAttacks++
		default:
			get(res.ep.Pipeline).Episodes = append(get(res.ep.Pipeline).Episodes, res.ep)
		}
		name := res.run.Pipeline
		if res.run.BenchmarkVersion == "" {
			get(name).NoVersion++
		}
		if res.run.Kind == agentdojo.Attacked && res.run.Goal == "" {
			get(name).NoGoal++
		}
		done[name]++
		if cfg.Progress != nil {
			cfg.Progress(name, done[name])
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []*Pipeline
	for _, p := range byName {
		sort.Slice(p.Episodes, func(i, j int) bool { return p.Episodes[i].ID < p.Episodes[j].ID })
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	for _, w := range cfg.Pipelines {
		if byName[w] == nil {
			return nil, fmt.Errorf("eval: pipeline %q: no run in %s", w, cfg.Runs)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("eval: no run in %s", cfg.Runs)
	}
	// Unreadable members belong to no pipeline: list them with every
	// pipeline's problems so that no report hides them.
	for _, p := range out {
		p.Problems = append(p.Problems, orphan...)
	}
	return out, nil
}

type problemError struct{ p Problem }

func (e *problemError) Error() string { return e.p.Reason }

// openSelected opens the datasets to read: when path is a directory of
// runs-<pipeline>.tar.gz archives and pipelines are named, only their
// archives; otherwise path itself.
func openSelected(path string, pipelines []string) ([]*agentdojo.Dataset, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("eval: runs: %w", err)
	}
	if st.IsDir() && len(pipelines) > 0 {
		var sets []*agentdojo.Dataset
		all := true
		for _, p := range pipelines {
			a := filepath.Join(path, "runs-"+p+".tar.gz")
			if _, err := os.Stat(a); err != nil {
				all = false
				break
			}
			d, err := agentdojo.Open(a)
			if err != nil {
				return nil, err
			}
			sets = append(sets, d)
		}
		if all {
			return sets, nil
		}
	}
	d, err := agentdojo.Open(path)
	if err != nil {
		return nil, err
	}
	return []*agentdojo.Dataset{d}, nil
}

// ParseList splits a comma-separated list, dropping blanks and
// rejecting repeats.
func ParseList(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if seen[p] {
			return nil, fmt.Errorf("eval: %q named twice", p)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}
