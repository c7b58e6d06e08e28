package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// calibForm is one form of `carbd calib`. The flag-only form
// (`carbd calib --fields FILE ...`) lives here; other forms
// (`carbd calib agentdojo ...`) register themselves from their own files:
//
//	func init() {
//		registerCalibForm(&calibForm{name: "agentdojo", synopsis: "...", summary: "...", run: runCalibAgentDojo})
//	}
//
// `carbd calib NAME ARGS...` runs the form NAME with ARGS.
type calibForm struct {
	name     string
	synopsis string
	summary  string
	run      func(ctx context.Context, e *env, args []string) error
}

var calibForms = map[string]*calibForm{}

func registerCalibForm(f *calibForm) {
	if _, dup := calibForms[f.name]; dup || f.name == "" || strings.HasPrefix(f.name, "-") {
		panic("carbd: calib form registered twice or badly named: " + f.name)
	}
	calibForms[f.name] = f
	if c, ok := commands["calib"]; ok {
		c.forms = append(c.forms, form{f.name, f.summary})
	}
}

// unregisterCalibForm removes a form (tests).
func unregisterCalibForm(name string) {
	delete(calibForms, name)
	c := commands["calib"]
	c.forms = slices.DeleteFunc(c.forms, func(f form) bool { return f.name == name })
}

const calibFieldsSynopsis = "--fields FILE.jsonl --alpha target=0.01,credential=0.01,command=0.01 [--delta 0.05] [--episode] [--attacked-only] [--rule crc|cp] [--score ngram] -o calib.json"

func init() {
	register(&command{name: "calib", summary: "calibrate per-role CRC thresholds into an artifact", formsOptional: true, run: runCalib})
}

func runCalib(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if f, ok := calibForms[args[0]]; ok {
			return f.run(ctx, e, args[1:])
		}
		return fmt.Errorf("%w: unknown form %q (calib --fields ..., or calib agentdojo)", errUsage, args[0])
	}
	return runCalibFields(ctx, e, args)
}

// calibFilesFlag is a repeatable string flag.
type calibFilesFlag []string

func (m *calibFilesFlag) String() string     { return strings.Join(*m, ",") }
func (m *calibFilesFlag) Set(v string) error { *m = append(*m, v); return nil }

// runCalibFields calibrates from field files: it reads them, runs
// role-stratified CRC, prints the per-stratum report and writes the
// artifact (see docs/calibration.md).
func runCalibFields(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib", calibFieldsSynopsis+"\n       carbd calib FORM ... (carbd calib FORM --help; forms: "+commands["calib"].formNames()+")")
	var files calibFilesFlag
	fs.Var(&files, "fields", "calibration field `file` (JSON lines: role, score, violated, attacked, episode); repeatable")
	alpha := fs.String("alpha", "", "per-role risk `budgets`, e.g. target=0.01,credential=0.01,command=0.01 (required)")
	delta := fs.Float64("delta", 0.05, "total failure probability of the simultaneous certificate, split evenly over the strata")
	episode := fs.Bool("episode", false, "one loss per episode and stratum (the max over its fields): certifies per-episode rates")
	attacked := fs.Bool("attacked-only", false, "calibrate on attacked fields only: certifies the attack-conditional rate V_att")
	rule := fs.String("rule", string(calib.RuleCRC), "threshold rule: crc (Eq. 5, expectation), cp (Eq. 6, Clopper-Pearson high probability) or transfer (certified attacker-release rate per role, no pooling; docs/calibration.md)")
	kind := fs.String("score", string(score.KindNgram), "similarity `kind` the scores were computed with: token, ngram or max")
	poolWith := fs.String("pool-with", "target,credential,command", "`roles` whose fields join the pooled stratum of rare roles (empty: none)")
	allowMissing := fs.Bool("allow-missing", false, "pool a budgeted role that has no calibration fields instead of failing")
	requireCert := fs.Bool("require-certified", false, "fail, writing nothing, unless every stratum that keeps a threshold is certified (a stratum held at the strict rule needs no certificate)")
	out := fs.String("o", "", "artifact `file` to write (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if len(files) == 0 || *alpha == "" || *out == "" {
		return fmt.Errorf("%w: --fields, --alpha and -o are required", errUsage)
	}
	budgets, err := calib.ParseBudgets(*alpha)
	if err != nil {
		return fmt.Errorf("%w: --alpha: %v", errUsage, err)
	}
	if !(*delta > 0 && *delta < 1) {
		return fmt.Errorf("%w: --delta %v outside (0,1)", errUsage, *delta)
	}
	if err := distinctFiles("--fields", files); err != nil {
		return err
	}
	r, err := calib.ParseRule(*rule)
	if err != nil {
		return fmt.Errorf("%w: --rule: %v", errUsage, err)
	}
	k, err := score.ParseKind(*kind)
	if err != nil {
		return fmt.Errorf("%w: --score: %v", errUsage, err)
	}
	var pool []decide.Role
	for _, s := range strings.Split(*poolWith, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		role, err := decide.ParseRole(s)
		if err != nil {
			return fmt.Errorf("%w: --pool-with: %v", errUsage, err)
		}
		pool = append(pool, role)
	}

	var fields []calib.FieldRecord
	var sources []calib.SourceFile
	for _, path := range files {
		recs, src, err := calib.ReadFieldsFile(path)
		if err != nil {
			return err
		}
		for j := range sources {
			if sources[j].SHA256 == src.SHA256 {
				return fmt.Errorf("%w: --fields: %s has the same content as %s: its fields would be counted twice", errUsage, path, files[j])
			}
		}
		fields = append(fields, recs...)
		sources = append(sources, src)
	}
	a, err := calib.Calibrate(fields, calib.Config{
		Budgets: budgets,
		Delta:   *delta,
		Score:   k,
		Options: calib.Options{Episode: *episode, AttackedOnly: *attacked, Rule: r, PoolWith: pool, AllowMissing: *allowMissing},
	})
	if err != nil {
		return err
	}
	a.Source.Files = sources
	if err := a.WriteReport(e.stdout); err != nil {
		return err
	}
	if *requireCert {
		var not []string
		for _, st := range a.Strata {
			// A stratum that blocks every untrusted field (the strict
			// rule: too little data, or transfer without enough
			// violated units) releases nothing of its role on a
			// score: its budget holds by construction.
			if !st.Certifiable && !st.BlockAll {
				not = append(not, st.Name)
			}
		}
		if len(not) > 0 {
			return fmt.Errorf("not certifiable: %s (nothing written)", strings.Join(not, ", "))
		}
	}
	if err := writeCalibAtomic(*out, a.WriteArtifact); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s\n", *out)
	return nil
}

// distinctFiles refuses a file given twice to a repeatable file flag
// (the same path, or two names of one file): its records would be
// counted twice. Files that cannot be examined are left to the reader,
// which reports them.
func distinctFiles(flag string, paths []string) error {
	infos := make([]os.FileInfo, len(paths))
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		for j := range i {
			if infos[j] != nil && os.SameFile(infos[j], fi) {
				if filepath.Clean(paths[j]) == filepath.Clean(p) {
					return fmt.Errorf("%w: %s: %s is given twice", errUsage, flag, p)
				}
				return fmt.Errorf("%w: %s: %s and %s are the same file", errUsage, flag, paths[j], p)
			}
		}
		infos[i] = fi
	}
	return nil
}

// writeCalibAtomic writes through a temporary file in the same directory
// and renames it over path, so a reader never sees half an artifact.
func writeCalibAtomic(path string, write func(io.Writer) error) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err = write(tmp); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	return nil
}
