package main

import (
	"context"
	"fmt"
	"io"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/calib/eval"
)

const calibAgentDojoSynopsis = "--runs DIR [--policies DIR] [--pipelines p1,p2] [--attacks important_instructions] [--alpha target=0.01,...] [--ledger-alpha 0.05] [--ledger-split disjoint|shared] [--rule transfer|crc] [--ablate r1,r2] [--delta 0.05] [--score ngram] [--fields-out FILE.jsonl] [--quiet] -o calib.json"

func init() {
	registerCalibForm(&calibForm{name: "agentdojo", synopsis: calibAgentDojoSynopsis,
		summary: "calibrate per-role CRC and the G-CARB ledger on AgentDojo runs into one artifact", run: runCalibAgentDojo})
}

// runCalibAgentDojo calibrates on every benign and attacked run of the
// selected pipelines: per-role CRC on the fields (scores as the engine
// computes them online), then λ̂ on the episodes replayed with those
// thresholds; one artifact (docs/evaluation.md, docs/calibration.md).
func runCalibAgentDojo(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "calib agentdojo", calibAgentDojoSynopsis)
	var f agentdojoFlags
	f.register(fs)
	out := fs.String("o", "", "artifact `file` to write (required)")
	fieldsOut := fs.String("fields-out", "", "also write the calibration fields as a field `file` (JSON lines) for carbd calib --fields: under --rule transfer the fields the CRC step compares, under crc every field with its effective score")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("%w: -o is required", errUsage)
	}
	ps, budgets, kind, err := f.load(ctx, e, 1)
	if err != nil {
		return err
	}
	for _, p := range ps {
		fmt.Fprintf(e.stdout, "%s: %d episodes", p.Name, len(p.Episodes))
		if p.InjectionAsPrompt > 0 || p.OtherAttacks > 0 {
			fmt.Fprintf(e.stdout, " (left out: %d injection-as-prompt, %d of other attacks)", p.InjectionAsPrompt, p.OtherAttacks)
		}
		fmt.Fprintf(e.stdout, "; %d problems\n", len(p.Problems))
		for _, pb := range p.Problems {
			fmt.Fprintf(e.stdout, "  %s %s %s: %s\n", pb.Archive, pb.Member, pb.Episode, pb.Reason)
		}
	}
	a, err := eval.CalibrateArtifact(ctx, ps, eval.CalibrateConfig{Budgets: budgets, LedgerAlpha: f.ledgerAlpha, Delta: f.delta, Score: kind, Runs: f.runs,
		LedgerSplit: f.ledgerSplit, Seed: 1, Rule: calib.Rule(f.rule)})
	if err != nil {
		return err
	}
	if err := a.WriteReport(e.stdout); err != nil {
		return err
	}
	eval.WriteLedgerReport(e.stdout, a.Ledger)
	if *fieldsOut != "" {
		recs := eval.FieldRecords(ps, calib.Rule(f.rule))
		if err := writeCalibAtomic(*fieldsOut, func(w io.Writer) error { return calib.WriteFields(w, recs) }); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "wrote %s (%d fields)\n", *fieldsOut, len(recs))
	}
	if err := writeCalibAtomic(*out, a.WriteArtifact); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "wrote %s\n", *out)
	return nil
}
