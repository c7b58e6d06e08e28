package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	agentdojopolicies "github.com/carbd/carbd/examples/agentdojo"
	"github.com/carbd/carbd/internal/tty"
	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/calib/agentdojo"
	"github.com/carbd/carbd/pkg/calib/eval"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

func init() {
	register(&command{name: "eval", summary: "evaluate the engine on recorded agent runs (eval agentdojo)",
		forms: []form{{"agentdojo", "calibrate and test on splits of recorded AgentDojo runs: attack success, utility, effects released, per-role budgets, against baselines"}}, run: runEval})
}

const evalAgentDojoSynopsis = "--runs DIR [--policies DIR] [--pipelines p1,p2] [--attacks important_instructions] [--alpha target=0.01,credential=0.01,command=0.01] [--ledger-alpha 0.05] [--ledger-split disjoint|shared] [--rule transfer|crc] [--delta 0.05] [--score ngram] [--ablate r1,r2] [--splits 200] [--lopo] [--lopo-splits 20] [--seed N] [--errored agentdojo|failed] [--json] [--json-out FILE] [--plot FILE.png] [-o FILE] [--quiet]"

func runEval(ctx context.Context, e *env, args []string) error {
	if args[0] != "agentdojo" {
		return fmt.Errorf("%w: unknown form %q (want agentdojo)", errUsage, args[0])
	}
	return runEvalAgentDojo(ctx, e, args[1:])
}

// agentdojoFlags are the flags `carbd eval agentdojo` and `carbd calib
// agentdojo` share.
type agentdojoFlags struct {
	runs, policies, pipelines, attacks, alpha, kind string
	ledgerSplit, ablate, rule                       string
	ledgerAlpha, delta                              float64
	workers                                         int
	quiet                                           bool
	errors                                          agentdojo.ErrorCounting // set by eval only
}

func (f *agentdojoFlags) register(fs interface {
	StringVar(*string, string, string, string)
	Float64Var(*float64, string, float64, string)
	IntVar(*int, string, int, string)
	BoolVar(*bool, string, bool, string)
}) {
	fs.StringVar(&f.runs, "runs", "", "AgentDojo runs: a runs-*.tar.gz, a directory of them (the data directory), or an unpacked folder (required)")
	fs.StringVar(&f.policies, "policies", "", "directory of the suite policies (<suite>.yaml): the operator's policy, trace roles and kinds (default: the example policies built into carbd, "+agentdojopolicies.Name+")")
	fs.StringVar(&f.pipelines, "pipelines", "", "comma-separated pipelines to use (default: every pipeline found)")
	fs.StringVar(&f.attacks, "attacks", "important_instructions", "comma-separated attacks whose attacked runs are used; \"all\" for every attack")
	fs.StringVar(&f.alpha, "alpha", "target=0.01,credential=0.01,command=0.01", "per-role CRC budgets role=alpha,...")
	fs.Float64Var(&f.ledgerAlpha, "ledger-alpha", 0.05, "budget on the expected G-CARB ledger loss")
	fs.StringVar(&f.ledgerSplit, "ledger-split", eval.LedgerDisjoint, "which calibration episodes calibrate the ledger: disjoint (from those that fit the per-role thresholds: half each) or shared (the same ones; not exchangeable, for comparison)")
	fs.StringVar(&f.rule, "rule", string(calib.RuleTransfer), "per-role threshold rule: transfer (each role's attacker-release rate certified on the calibration episodes of every pipeline together; a role without that evidence stays strict) or crc (Eq. 5 with pooling, per pipeline: the earlier protocol)")
	fs.Float64Var(&f.delta, "delta", 0.05, "total failure probability of the per-role Clopper-Pearson certificate")
	fs.StringVar(&f.kind, "score", string(score.KindNgram), "per-field similarity kind: token, ngram or max")
	fs.StringVar(&f.ablate, "ablate", "", "refinements of the engine to switch off, for the ablation study: comma-separated of "+strings.Join(decide.AblationNames, ", "))
	fs.IntVar(&f.workers, "workers", 0, "parallel workers (default: GOMAXPROCS)")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line on stderr (there is none when stderr is not a terminal)")
}

// showProgress says whether to draw progress lines: only for a person
// watching a terminal.
func (f *agentdojoFlags) showProgress(e *env) bool {
	return !f.quiet && tty.IsTerminal(e.stderr)
}

// policiesName names the suite policies in reports.
func (f *agentdojoFlags) policiesName() string {
	if f.policies == "" {
		return agentdojopolicies.Name + " (built in)"
	}
	return f.policies
}

// load validates the shared flags and loads the pipelines.
func (f *agentdojoFlags) load(ctx context.Context, e *env, seed uint64) ([]*eval.Pipeline, calib.Budgets, score.Kind, error) {
	if f.runs == "" {
		return nil, nil, "", fmt.Errorf("%w: --runs is required", errUsage)
	}
	budgets, err := calib.ParseBudgets(f.alpha)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: --alpha: %v", errUsage, err)
	}
	kind, err := score.ParseKind(f.kind)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: --score: %v", errUsage, err)
	}
	if !(f.ledgerAlpha > 0 && f.ledgerAlpha < 1) {
		return nil, nil, "", fmt.Errorf("%w: --ledger-alpha %v outside (0,1)", errUsage, f.ledgerAlpha)
	}
	if !(f.delta > 0 && f.delta < 1) {
		return nil, nil, "", fmt.Errorf("%w: --delta %v outside (0,1)", errUsage, f.delta)
	}
	if f.ledgerSplit != eval.LedgerDisjoint && f.ledgerSplit != eval.LedgerShared {
		return nil, nil, "", fmt.Errorf("%w: --ledger-split %q (want %s or %s)", errUsage, f.ledgerSplit, eval.LedgerDisjoint, eval.LedgerShared)
	}
	if r, err := calib.ParseRule(f.rule); err != nil || (r != calib.RuleTransfer && r != calib.RuleCRC) {
		return nil, nil, "", fmt.Errorf("%w: --rule %q (want %s or %s)", errUsage, f.rule, calib.RuleTransfer, calib.RuleCRC)
	}
	ablate, err := decide.ParseAblation(f.ablate)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: --ablate: %v", errUsage, err)
	}
	if f.workers < 0 {
		return nil, nil, "", fmt.Errorf("%w: --workers %d", errUsage, f.workers)
	}
	pipes, err := eval.ParseList(f.pipelines)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: --pipelines: %v", errUsage, err)
	}
	attacks, err := eval.ParseList(f.attacks)
	if err != nil {
		return nil, nil, "", fmt.Errorf("%w: --attacks: %v", errUsage, err)
	}
	if len(attacks) == 1 && attacks[0] == "all" {
		attacks = nil
	}
	prog := newProgress(e.stderr, f.showProgress(e))
	lc := eval.LoadConfig{Runs: f.runs, Policies: f.policies, Pipelines: pipes, Attacks: attacks,
		Score: kind, Seed: seed, Workers: f.workers, Errors: f.errors, Ablate: ablate,
		Progress: prog.update}
	if f.policies == "" {
		lc.Policies, lc.PolicyFS = agentdojopolicies.Name, agentdojopolicies.FS
	}
	ps, err := eval.Load(ctx, lc)
	prog.finish()
	if err != nil {
		return nil, nil, "", err
	}
	for _, p := range ps {
		if p.NoVersion > 0 {
			e.log.Warn("runs without benchmark_version are read as v1.x", "pipeline", p.Name, "runs", p.NoVersion,
				"attacked_runs_without_goal_text", p.NoGoal)
		}
	}
	return ps, budgets, kind, nil
}

func (f *agentdojoFlags) attackList() []string {
	a, _ := eval.ParseList(f.attacks)
	if len(a) == 1 && a[0] == "all" {
		return nil
	}
	return a
}

// runEvalAgentDojo replays every run through the engine over random
// calibration/test splits and reports carbd against the baselines
// (docs/evaluation.md).
func runEvalAgentDojo(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "eval agentdojo", evalAgentDojoSynopsis)
	var f agentdojoFlags
	f.register(fs)
	splits := fs.Int("splits", 200, "random calibration/test splits (by episode)")
	lopo := fs.Bool("lopo", false, "also evaluate leave-one-pipeline-out: calibrate on every other pipeline, test on the left-out one (needs 2 or more pipelines)")
	lopoSplits := fs.Int("lopo-splits", eval.DefaultLOPOSplits, "leave-one-pipeline-out splits per pipeline (random divisions of the calibration episodes)")
	seed := fs.Uint64("seed", 1, "seed of the splits (and of the equal-size random evidence)")
	asJSON := fs.Bool("json", false, "print the report as JSON (docs/evaluation.md) instead of tables")
	plotPath := fs.String("plot", "", "write the risk-utility frontier as a PNG `file` (computes the frontier)")
	frontier := fs.Bool("frontier", false, "compute the risk-utility frontier (implied by --plot)")
	frontierSplits := fs.Int("frontier-splits", 50, "splits per budget of the frontier")
	errored := fs.String("errored", string(agentdojo.ErrorsAsRecorded), "how an attacked run that ended in an error counts: agentdojo (its security flag as recorded, as AgentDojo's benchmark counts it) or failed (a failed attack)")
	out := fs.String("o", "", "write the report to `file` instead of stdout")
	jsonOut := fs.String("json-out", "", "also write the JSON report to `file`")
	lossesOut := fs.String("losses", "", "also write every withheld or modified effect of a benign run with utility true (split 0's calibration; one tab-separated line per effect: run, step, tool, field, value, where the value came from) to `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *splits < 1 {
		return fmt.Errorf("%w: --splits %d", errUsage, *splits)
	}
	if *lopoSplits < 1 {
		return fmt.Errorf("%w: --lopo-splits %d", errUsage, *lopoSplits)
	}
	if *frontierSplits < 1 {
		return fmt.Errorf("%w: --frontier-splits %d", errUsage, *frontierSplits)
	}
	errs, err := agentdojo.ParseErrorCounting(*errored)
	if err != nil {
		return fmt.Errorf("%w: --errored: %v", errUsage, err)
	}
	f.errors = errs
	start := time.Now()
	ps, budgets, kind, err := f.load(ctx, e, *seed)
	if err != nil {
		return err
	}
	if *lopo && len(ps) < 2 {
		return fmt.Errorf("%w: --lopo needs 2 or more pipelines, got %d", errUsage, len(ps))
	}
	cfg := eval.Config{Budgets: budgets, LedgerAlpha: f.ledgerAlpha, LedgerSplit: f.ledgerSplit, Delta: f.delta, Score: kind, Splits: *splits,
		Seed: *seed, Workers: f.workers, FrontierSplits: *frontierSplits, LOPO: *lopo, LOPOSplits: *lopoSplits, Rule: calib.Rule(f.rule)}
	if *plotPath != "" || *frontier {
		cfg.Frontier = eval.DefaultFrontier
	}
	var meter *eval.Meter
	if f.showProgress(e) {
		meter = eval.NewMeter(e.stderr, eval.PlannedSplits(cfg, len(ps)), eval.MeterOptions{Rewrite: true, Every: 500 * time.Millisecond})
		cfg.Progress = meter.Update
	}
	rep, err := eval.Evaluate(ctx, ps, cfg)
	if meter != nil {
		meter.Finish()
	}
	if err != nil {
		return err
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.Config.Runs, rep.Config.Policies, rep.Config.Attacks = f.runs, f.policiesName(), f.attackList()
	rep.Config.ErroredRuns = string(errs)
	rep.Config.Ablate = f.ablate
	for _, p := range ps {
		rep.Config.Pipelines = append(rep.Config.Pipelines, p.Name)
	}
	w := e.stdout
	if *out != "" {
		file, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer file.Close()
		w = file
	}
	if *asJSON {
		err = rep.WriteJSON(w)
	} else {
		err = rep.WriteText(w)
	}
	if err != nil {
		return err
	}
	if *jsonOut != "" {
		if err := writeCalibAtomic(*jsonOut, rep.WriteJSON); err != nil {
			return err
		}
	}
	if *lossesOut != "" {
		if err := writeCalibAtomic(*lossesOut, rep.WriteLosses); err != nil {
			return err
		}
	}
	if *plotPath != "" {
		if err := writeCalibAtomic(*plotPath, rep.WritePlot); err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "wrote %s\n", *plotPath)
	}
	return nil
}

// progress draws the loading's progress on a terminal: one line,
// rewritten in place at most every 200 ms, ended by finish.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	on   bool
	last time.Time
	runs int
}

func newProgress(w io.Writer, on bool) *progress { return &progress{w: w, on: on} }

// update records that a pipeline has done runs prepared (eval.LoadConfig.Progress).
func (p *progress) update(pipeline string, done int) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs++
	if time.Since(p.last) >= 200*time.Millisecond {
		fmt.Fprintf(p.w, "\rloading: %d runs prepared (%s: %d)\033[K", p.runs, pipeline, done)
		p.last = time.Now()
	}
}

func (p *progress) finish() {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runs > 0 {
		fmt.Fprintf(p.w, "\rloading: %d runs prepared\033[K\n", p.runs)
	}
}
