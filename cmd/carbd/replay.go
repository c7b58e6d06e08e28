package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/oracle/llm"
)

func init() {
	register(&command{name: "replay", summary: "run a recorded trace through the decision engine", run: runReplay})
}

func runReplay(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "replay", "--policy FILE --trace FILE [--oracle strict|llm] [--calib FILE] [--audit FILE] [--json]")
	policyPath := fs.String("policy", "", "policy `file` (YAML)")
	tracePath := fs.String("trace", "", "trace `file` (JSON lines, docs/trace-format.md); - for stdin")
	oracleName := fs.String("oracle", "strict", "oracle for deferred effects: strict (refuse all) or llm (CARBD_LLM_URL, CARBD_LLM_MODEL, CARBD_LLM_KEY)")
	calibPath := fs.String("calib", "", "calibration artifact `file` (carbd calib) applied at the CRC and ledger steps")
	auditPath := fs.String("audit", "", "write the JSON-lines decision log to `file`")
	asJSON := fs.Bool("json", false, "print one JSON object per outgoing effect and a summary object")
	oracleTimeout := fs.Duration("oracle-timeout", 60*time.Second, "bound on one oracle call; a timeout refuses")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *policyPath == "" || *tracePath == "" {
		return fmt.Errorf("%w: --policy and --trace are required", errUsage)
	}
	p, err := decide.LoadPolicy(*policyPath)
	if err != nil {
		return err
	}
	var tr []decide.Event
	if *tracePath == "-" {
		tr, err = decide.ReadTrace("stdin", os.Stdin)
	} else {
		tr, err = decide.LoadTrace(*tracePath)
	}
	if err != nil {
		return err
	}
	opt := decide.Options{OracleTimeout: *oracleTimeout, Revert: true}
	switch *oracleName {
	case "strict":
		opt.Oracle = decide.Strict{}
	case "llm":
		o, err := llm.FromEnv()
		if err != nil {
			return err
		}
		opt.Oracle = o
	case "operator":
		return fmt.Errorf("%w: the operator oracle needs the daemon (carbd run); replay with strict or llm", errUsage)
	default:
		return fmt.Errorf("%w: unknown oracle %q (want strict or llm)", errUsage, *oracleName)
	}
	if *calibPath != "" {
		c, err := loadCalibration(*calibPath)
		if err != nil {
			return err
		}
		opt.Calibration = c
	}
	if *auditPath != "" {
		f, err := os.Create(*auditPath)
		if err != nil {
			return err
		}
		defer f.Close()
		opt.Audit = f
	}
	r := decide.RunTrace(ctx, decide.New(p, opt), tr)
	if *asJSON {
		return writeReplayJSON(e.stdout, r)
	}
	r.WriteText(e.stdout)
	return nil
}

type replayLine struct {
	Index         int             `json:"index"`
	Seq           uint64          `json:"seq"`
	Effect        string          `json:"effect"`
	Verdict       decide.Verdict  `json:"verdict"`
	Layer         decide.Layer    `json:"layer"`
	Held          bool            `json:"held"`
	Scope         uint64          `json:"scope,omitempty"`
	PolicyVerdict decide.Verdict  `json:"policy_verdict,omitempty"`
	Reason        decide.Reason   `json:"reason"`
	Justification string          `json:"justification"`
	Reverts       []decide.Revert `json:"reverts,omitempty"`
}

type replaySummary struct {
	Summary  bool           `json:"summary"`
	Effects  int            `json:"effects"`
	Released int            `json:"released"`
	Refused  int            `json:"refused"`
	Stats    decide.Stats   `json:"stats"`
	ByLayer  map[string]int `json:"by_layer"`
}

func writeReplayJSON(w io.Writer, r *decide.Replay) error {
	enc := json.NewEncoder(w)
	s := replaySummary{Summary: true, Effects: len(r.Steps), Stats: r.Stats, ByLayer: map[string]int{}}
	for _, st := range r.Steps {
		f := st.Final
		if err := enc.Encode(replayLine{Index: st.Index, Seq: f.Seq, Effect: strings.TrimSpace(st.Event.Summary()), Verdict: f.Verdict, Layer: f.Layer,
			Held: st.Decision.Verdict == decide.Defer, Scope: st.Decision.Scope, PolicyVerdict: f.Policy, Reason: f.Reason,
			Justification: f.Justification, Reverts: f.Reverts}); err != nil {
			return err
		}
		s.ByLayer[string(f.Layer)]++
	}
	s.Released, s.Refused, _, _ = r.Counts()
	return enc.Encode(s)
}

// loadCalibration reads a calibration artifact (carbd calib) for the engine.
func loadCalibration(path string) (*decide.Calibration, error) {
	a, err := calib.ReadArtifact(path)
	if err != nil {
		return nil, err
	}
	c := a.Engine()
	return &c, nil
}
