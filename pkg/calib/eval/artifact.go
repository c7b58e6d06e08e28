package eval

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide/score"
)

// CalibrateConfig is what CalibrateArtifact needs.
type CalibrateConfig struct {
	Budgets     calib.Budgets
	LedgerAlpha float64
	Delta       float64
	Score       score.Kind
	// Runs is where the runs came from: the archives of the calibrated
	// pipelines found there are recorded with their SHA-256.
	Runs string
	// LedgerSplit is LedgerDisjoint (the default: the episodes, in an
	// order drawn with Seed, are split between the per-role thresholds
	// and the ledger) or LedgerShared (both on every episode).
	LedgerSplit string
	Seed        uint64
	// Rule is the per-role threshold rule (Config.Rule; default
	// calib.RuleTransfer).
	Rule calib.Rule
}

// CalibrateArtifact calibrates one artifact on the episodes of the
// pipelines: per-role CRC on the fields (effective scores, see
// Field.Effective) of one part of them, then the G-CARB ledger stop
// threshold on the other part replayed with those CRC thresholds (harm =
// an attacker value the engine without the ledger releases). Under
// LedgerShared both parts are every episode.
func CalibrateArtifact(ctx context.Context, pipelines []*Pipeline, cfg CalibrateConfig) (*calib.Artifact, error) {
	var eps []*Episode
	for _, p := range pipelines {
		eps = append(eps, p.Episodes...)
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("eval: calibrate: no episodes")
	}
	if cfg.LedgerSplit == "" {
		cfg.LedgerSplit = LedgerDisjoint
	}
	if cfg.LedgerSplit != LedgerDisjoint && cfg.LedgerSplit != LedgerShared {
		return nil, fmt.Errorf("eval: calibrate: ledger split %q (want %s or %s)", cfg.LedgerSplit, LedgerDisjoint, LedgerShared)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	rng.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	calCRC, calLedger := splitCalibration(eps, cfg.LedgerSplit)
	if cfg.Rule == "" {
		cfg.Rule = calib.RuleTransfer
	}
	art, err := calibrateCRC(calCRC, cfg.Budgets, cfg.Delta, cfg.Score, cfg.Rule)
	if err != nil {
		return nil, err
	}
	th := &thresholds{cal: art.Engine()}
	ctr := &replayCounters{}
	les := make([]calib.LedgerEpisode, len(calLedger))
	for i, ep := range calLedger {
		o, err := ep.outcomeFor(ctx, th, math.NaN(), ctr)
		if err != nil {
			return nil, err
		}
		les[i] = ep.ledgerEpisode(selGCARB, o)
	}
	lc, err := calib.CalibrateLedger(les, calib.LedgerConfig{Alpha: cfg.LedgerAlpha, Evidence: selectorNames[selGCARB]})
	if err != nil {
		return nil, err
	}
	art.Ledger = lc
	for _, p := range pipelines {
		a := cfg.Runs
		if st, err := os.Stat(a); err == nil && st.IsDir() {
			a = filepath.Join(a, "runs-"+p.Name+".tar.gz")
		}
		sum, err := fileSHA256(a)
		if err != nil {
			continue // an unpacked folder: no archive to fingerprint
		}
		n := 0
		for _, ep := range p.Episodes {
			n += len(ep.Fields)
		}
		art.Source.Files = append(art.Source.Files, calib.SourceFile{Path: a, SHA256: sum, Records: n})
	}
	return art, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return "", fmt.Errorf("%s is not a file", path)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteLedgerReport prints the ledger calibration in one paragraph.
func WriteLedgerReport(w io.Writer, l *calib.LedgerCalibration) {
	if l == nil {
		fmt.Fprintln(w, "ledger: not calibrated")
		return
	}
	lam := fmt.Sprintf("%.4g", l.Lambda)
	if l.Lambda >= calib.LedgerNever {
		lam = fmt.Sprintf("%g (never stops: the layers before the gate already keep the ledger loss within alpha)", l.Lambda)
	}
	fmt.Fprintf(w, "ledger (G-CARB, %s evidence, %s scorer): n %d episodes, alpha %g, lambda %s, corrected risk (sum L + B)/(n+1) = %.4g, B = %g\n",
		l.Evidence, l.Scorer, l.N, l.Alpha, lam, l.CorrectedRisk, l.LossBound)
}

// FieldRecords are the calibration fields of every episode of the
// pipelines as CalibrateArtifact uses them under rule: under
// calib.RuleTransfer the fields the CRC step compares, with their scores
// (comparedRecords); under calib.RuleCRC every field with its effective
// score.
func FieldRecords(pipelines []*Pipeline, rule calib.Rule) []calib.FieldRecord {
	var eps []*Episode
	for _, p := range pipelines {
		eps = append(eps, p.Episodes...)
	}
	if rule == calib.RuleTransfer {
		return comparedRecords(eps)
	}
	return fieldRecords(eps)
}
