package calib

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// ArtifactVersion is the version of the artifact format this package
// writes and the only one it reads.
const ArtifactVersion = 1

// MaxArtifactSize bounds what ReadArtifact reads.
const MaxArtifactSize = 16 << 20

// Artifact is a calibration result: per-role CRC thresholds with their
// certificates, and the ledger stop threshold when one was calibrated.
// It is written as versioned JSON (docs/calibration.md). Its methods only
// read it, so one artifact may be used from many goroutines.
type Artifact struct {
	Version int       `json:"version"`
	Created time.Time `json:"created"`
	// Score is the similarity kind (package score) the calibration
	// scores were computed with; the engine must score the same way.
	Score   string    `json:"score"`
	Options Options   `json:"options"`
	Budgets Budgets   `json:"budgets"`
	Delta   float64   `json:"delta"` // total failure probability δ of the simultaneous certificate
	Strata  []Stratum `json:"strata"`
	// RoleStratum maps every budgeted role to its final stratum g(r).
	RoleStratum map[decide.Role]string `json:"role_stratum"`
	Ledger      *LedgerCalibration     `json:"ledger"`
	Source      Source                 `json:"source"`
}

// Stratum is one final calibration stratum g with its threshold and the
// per-stratum report.
type Stratum struct {
	Name string `json:"name"` // a role name, or PooledStratum
	// Roles are the roles whose calibration fields form the stratum.
	Roles []decide.Role `json:"roles"`
	// Pooled are the roles enforced with this stratum's threshold because
	// they were below their own floor (pooled stratum only).
	Pooled   []decide.Role `json:"pooled,omitempty"`
	N        int           `json:"n"`        // calibration units: fields, or episodes with the episode option
	Violated int           `json:"violated"` // violated units
	K        int           `json:"k"`        // violated units allowed at the threshold, k_g(τ̂)
	Floor    float64       `json:"floor"`    // 1/(n+1), the smallest budget Eq. 5 can meet
	Alpha    float64       `json:"alpha"`    // α(g): the least budget of the roles enforced with it
	// Threshold τ̂(g): a field is allowed iff its score <= Threshold and
	// BlockAll is false.
	Threshold float64 `json:"threshold"`
	// BlockAll: no threshold keeps the budget; every field is blocked
	// (Threshold is then 0 and means nothing).
	BlockAll     bool    `json:"block_all"`
	InflatedRisk float64 `json:"inflated_risk"` // (k+1)/(n+1), the left side of Eq. 5 at τ̂
	Delta        float64 `json:"delta"`         // δ_g = δ/|G|
	CPUpper      float64 `json:"cp_upper"`      // U(k, n; δ_g), exact one-sided Clopper–Pearson
	// Certifiable: α(g) >= 1/(n+1) and U(k, n; δ_g) <= α(g), so that
	// with probability 1−δ (jointly over all strata) V(g) <= α(g).
	Certifiable bool   `json:"certifiable"`
	Note        string `json:"note,omitempty"`
}

// LedgerCalibration is the calibrated G-CARB ledger stop threshold,
// filled by the ledger calibration.
type LedgerCalibration struct {
	Lambda        float64 `json:"lambda"`           // λ̂: the episode stops when the gate score reaches it
	Alpha         float64 `json:"alpha"`            // budget on the expected ledger loss
	N             int     `json:"n"`                // calibration episodes
	CorrectedRisk float64 `json:"corrected_risk"`   // (Σ L_i(λ̂) + B)/(n+1), the CRC left side at λ̂
	LossBound     float64 `json:"loss_bound"`       // B: the largest loss an episode's ledger can have
	Evidence      string  `json:"evidence"`         // scorer-evidence selector: g-carb, full-prefix, fixed-window-4, random
	Scorer        string  `json:"scorer,omitempty"` // the frozen scorer (weights) identifier
}

// Source says what data the artifact came from.
type Source struct {
	Files   []SourceFile `json:"files"`
	Records int          `json:"records"` // field records read
	Used    int          `json:"used"`    // records calibrated on (after the attacked-only filter)
}

// SourceFile is one input file.
type SourceFile struct {
	Path    string `json:"path"`
	SHA256  string `json:"sha256"`
	Records int    `json:"records"`
}

// Stratum returns the stratum with the given name, or nil.
func (a *Artifact) Stratum(name string) *Stratum {
	for i := range a.Strata {
		if a.Strata[i].Name == name {
			return &a.Strata[i]
		}
	}
	return nil
}

// Allowed reports whether a field of the role with the given score is
// within its calibrated budget: score <= τ̂(g(role)) and the stratum does
// not block everything. A role the artifact did not calibrate is not
// allowed (fail closed): callers ask only for the roles they gate.
func (a *Artifact) Allowed(role decide.Role, s float64) bool {
	name, ok := a.RoleStratum[role]
	if !ok {
		return false
	}
	st := a.Stratum(name)
	return st != nil && !st.BlockAll && s <= st.Threshold
}

// Engine returns what the decision engine consumes: a threshold and a
// stratum name per calibrated role (−Inf for a blocked stratum) and the
// ledger threshold.
func (a *Artifact) Engine() decide.Calibration {
	c := decide.Calibration{
		Score:     a.Score,
		Threshold: make(map[decide.Role]float64, len(a.RoleStratum)),
		Stratum:   make(map[decide.Role]string, len(a.RoleStratum)),
	}
	for r, name := range a.RoleStratum {
		st := a.Stratum(name)
		if st == nil {
			continue
		}
		t := st.Threshold
		if st.BlockAll {
			t = math.Inf(-1)
		}
		c.Threshold[r], c.Stratum[r] = t, name
	}
	if a.Ledger != nil {
		c.LedgerLambda, c.HasLedger = a.Ledger.Lambda, true
	}
	return c
}

// Validate checks the artifact's invariants: the version, the score kind,
// the options and budgets, every stratum's numbers (thresholds in [0,1],
// counts consistent, floor and certificate consistent), that every
// budgeted role is mapped to an existing stratum whose budget is no
// looser than its own, that the δ_g sum to at most δ, and the ledger.
func (a *Artifact) Validate() error {
	if a.Version != ArtifactVersion {
		return fmt.Errorf("unsupported version %d (want %d)", a.Version, ArtifactVersion)
	}
	if a.Created.IsZero() {
		return errors.New("no creation time")
	}
	if _, err := score.ParseKind(a.Score); err != nil {
		return err
	}
	if _, err := ParseRule(string(a.Options.Rule)); err != nil {
		return err
	}
	if len(a.Budgets) == 0 {
		return errors.New("no budgets")
	}
	for r, al := range a.Budgets {
		if !slices.Contains(decide.Roles, r) {
			return fmt.Errorf("budget for unknown role %d", uint8(r))
		}
		if err := checkAlpha(al); err != nil {
			return fmt.Errorf("budget of %s: %w", r, err)
		}
	}
	if !(a.Delta > 0 && a.Delta < 1) {
		return fmt.Errorf("delta %v outside (0,1)", a.Delta)
	}
	if len(a.Strata) == 0 {
		return errors.New("no strata")
	}
	sumDelta := 0.0
	for i := range a.Strata {
		st := &a.Strata[i]
		if err := st.validate(); err != nil {
			return fmt.Errorf("stratum %d (%q): %w", i+1, st.Name, err)
		}
		if a.Stratum(st.Name) != st {
			return fmt.Errorf("stratum %d: name %q used twice", i+1, st.Name)
		}
		sumDelta += st.Delta
	}
	if sumDelta > a.Delta*(1+1e-12) {
		return fmt.Errorf("the strata's deltas sum to %v, more than delta %v", sumDelta, a.Delta)
	}
	for _, r := range decide.Roles {
		al, budgeted := a.Budgets[r]
		name, mapped := a.RoleStratum[r]
		switch {
		case budgeted && !mapped:
			return fmt.Errorf("role %s has a budget but no stratum", r)
		case mapped && !budgeted:
			return fmt.Errorf("role %s is mapped to stratum %q but has no budget", r, name)
		case !mapped:
			continue
		}
		st := a.Stratum(name)
		if st == nil {
			return fmt.Errorf("role %s is mapped to unknown stratum %q", r, name)
		}
		if st.Alpha > al {
			return fmt.Errorf("role %s (budget %v) is enforced by stratum %q with the looser budget %v", r, al, name, st.Alpha)
		}
		if !slices.Contains(st.Roles, r) && !slices.Contains(st.Pooled, r) {
			return fmt.Errorf("role %s is mapped to stratum %q, which does not list it", r, name)
		}
	}
	if len(a.RoleStratum) != len(a.Budgets) {
		return errors.New("role_stratum maps an unknown role")
	}
	for i := range a.Strata {
		used := false
		for _, name := range a.RoleStratum {
			used = used || name == a.Strata[i].Name
		}
		if !used {
			return fmt.Errorf("stratum %q enforces no role", a.Strata[i].Name)
		}
	}
	if l := a.Ledger; l != nil {
		switch {
		case !finite(l.Lambda):
			return fmt.Errorf("ledger: lambda %v is not finite", l.Lambda)
		case !(l.Alpha > 0 && l.Alpha < 1):
			return fmt.Errorf("ledger: alpha %v outside (0,1)", l.Alpha)
		case l.N < 1:
			return fmt.Errorf("ledger: n %d, want at least 1 episode", l.N)
		case !(l.CorrectedRisk >= 0) || !finite(l.CorrectedRisk):
			return fmt.Errorf("ledger: corrected risk %v invalid", l.CorrectedRisk)
		case !(l.LossBound > 0) || !finite(l.LossBound):
			return fmt.Errorf("ledger: loss bound %v invalid", l.LossBound)
		case l.Evidence == "":
			return errors.New("ledger: no evidence selector")
		}
	}
	s := &a.Source
	if s.Records < 0 || s.Used < 0 || s.Used > s.Records {
		return fmt.Errorf("source: used %d of %d records", s.Used, s.Records)
	}
	for _, f := range s.Files {
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 {
			return fmt.Errorf("source %q: sha256 %q is not 64 hex digits", f.Path, f.SHA256)
		}
		if f.Records < 0 {
			return fmt.Errorf("source %q: %d records", f.Path, f.Records)
		}
	}
	return nil
}

func (st *Stratum) validate() error {
	switch {
	case st.Name == "":
		return errors.New("no name")
	case len(st.Roles) == 0:
		return errors.New("no roles")
	case st.N < 0 || st.Violated < 0 || st.Violated > st.N || st.K < 0 || st.K > st.Violated:
		return fmt.Errorf("counts n=%d violated=%d k=%d inconsistent", st.N, st.Violated, st.K)
	case !(st.Threshold >= 0 && st.Threshold <= 1):
		return fmt.Errorf("threshold %v outside [0,1]", st.Threshold)
	case st.BlockAll && st.Threshold != 0:
		return fmt.Errorf("block_all with threshold %v (want 0)", st.Threshold)
	case checkAlpha(st.Alpha) != nil:
		return checkAlpha(st.Alpha)
	case !(st.Delta > 0 && st.Delta < 1):
		return fmt.Errorf("delta %v outside (0,1)", st.Delta)
	case !(st.CPUpper >= 0 && st.CPUpper <= 1):
		return fmt.Errorf("cp_upper %v outside [0,1]", st.CPUpper)
	case math.Abs(st.Floor-1/float64(st.N+1)) > 1e-12:
		return fmt.Errorf("floor %v, want 1/(n+1) = %v", st.Floor, 1/float64(st.N+1))
	case math.Abs(st.InflatedRisk-float64(st.K+1)/float64(st.N+1)) > 1e-12:
		return fmt.Errorf("inflated_risk %v, want (k+1)/(n+1) = %v", st.InflatedRisk, float64(st.K+1)/float64(st.N+1))
	case st.Certifiable && (st.CPUpper > st.Alpha || MaxAllowedViolations(RuleCRC, st.N, st.Alpha, 0) < 0):
		return fmt.Errorf("certifiable with cp_upper %v, floor %v and alpha %v", st.CPUpper, st.Floor, st.Alpha)
	}
	for _, r := range append(slices.Clone(st.Roles), st.Pooled...) {
		if !slices.Contains(decide.Roles, r) {
			return fmt.Errorf("unknown role %d", uint8(r))
		}
	}
	return nil
}

// WriteArtifact validates the artifact and writes it as indented JSON.
func (a *Artifact) WriteArtifact(w io.Writer) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("calib: artifact: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(a); err != nil {
		return fmt.Errorf("calib: artifact: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// ReadArtifact reads and validates an artifact file.
func ReadArtifact(path string) (*Artifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("calib: %w", err)
	}
	defer f.Close()
	return DecodeArtifact(f, path)
}

// DecodeArtifact reads an artifact strictly: a version other than
// ArtifactVersion, unknown keys, trailing data or a failed Validate are
// errors naming name.
func DecodeArtifact(r io.Reader, name string) (*Artifact, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxArtifactSize+1))
	if err != nil {
		return nil, fmt.Errorf("calib: %s: %w", name, err)
	}
	if len(b) > MaxArtifactSize {
		return nil, fmt.Errorf("calib: %s: larger than %d bytes", name, MaxArtifactSize)
	}
	// The version first, so that a newer artifact is reported as such
	// rather than by its first unknown key.
	var v struct {
		Version *int `json:"version"`
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&v); err != nil {
		return nil, fmt.Errorf("calib: %s: %w", name, err)
	}
	if v.Version == nil {
		return nil, fmt.Errorf("calib: %s: no version", name)
	}
	if *v.Version != ArtifactVersion {
		return nil, fmt.Errorf("calib: %s: unsupported version %d (want %d)", name, *v.Version, ArtifactVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var a Artifact
	if err := dec.Decode(&a); err != nil {
		return nil, fmt.Errorf("calib: %s: %w", name, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("calib: %s: data after the artifact", name)
	}
	if err := a.Validate(); err != nil {
		return nil, fmt.Errorf("calib: %s: %w", name, err)
	}
	return &a, nil
}

// WriteReport prints the per-stratum report as a table.
func (a *Artifact) WriteReport(w io.Writer) error {
	fmt.Fprintf(w, "score %s, rule %s, delta %g over %d strata", a.Score, a.Options.Rule, a.Delta, len(a.Strata))
	if a.Options.Episode {
		fmt.Fprint(w, ", episode-level losses")
	}
	if a.Options.AttackedOnly {
		fmt.Fprint(w, ", attacked fields only (certifies V_att)")
	}
	fmt.Fprintf(w, "; %d of %d records used\n", a.Source.Used, a.Source.Records)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STRATUM\tROLES\tPOOLED\tN\tVIOL\tK\tFLOOR\tALPHA\tTHRESHOLD\tCP-UPPER\tDELTA_G\tCERTIFIED")
	for i := range a.Strata {
		st := &a.Strata[i]
		thr := fmt.Sprintf("%.6g", st.Threshold)
		if st.BlockAll {
			thr = "block-all"
		}
		pooled := roleList(st.Pooled)
		if pooled == "" {
			pooled = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.4g\t%g\t%s\t%.4g\t%.4g\t%v\n", st.Name, roleList(st.Roles), pooled,
			st.N, st.Violated, st.K, st.Floor, st.Alpha, thr, st.CPUpper, st.Delta, st.Certifiable)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i := range a.Strata {
		if st := &a.Strata[i]; st.Note != "" {
			fmt.Fprintf(w, "%s: %s\n", st.Name, st.Note)
		}
	}
	return nil
}

func roleList(rs []decide.Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}
