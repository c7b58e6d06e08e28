package calib

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
)

// Rule selects how a stratum's threshold is chosen.
type Rule string

const (
	// RuleCRC is Eq. 5: the largest threshold whose inflated empirical
	// risk (k+1)/(n+1) is at most α; it guarantees E[L] <= α under
	// exchangeability. The Clopper–Pearson certificate is then checked
	// at that threshold and reported.
	RuleCRC Rule = "crc"
	// RuleCP is Eq. 6: the largest threshold whose Clopper–Pearson upper
	// bound at 1−δ_g is at most α, so that every stratum that keeps any
	// threshold is certified with high probability (Theorem 2).
	RuleCP Rule = "cp"
	// RuleTransfer certifies each role's attacker-release rate, the
	// fraction of its violated units a threshold allows, with the
	// Clopper–Pearson bound at 1−δ_g, and keeps the largest threshold
	// whose bound is at most α. The rate does not depend on how often
	// violations occur, so the bound V(r) <= α holds for a model fooled
	// at any rate (docs/calibration.md, "Transfer by construction"). A
	// role whose violated units are too few for a certificate gets no
	// threshold: the strict rule (every untrusted field is blocked).
	// Roles are never pooled under this rule: a role's threshold rests
	// on its own evidence only.
	RuleTransfer Rule = "transfer"
)

// ParseRule parses "crc", "cp" or "transfer".
func ParseRule(s string) (Rule, error) {
	switch Rule(s) {
	case RuleCRC, RuleCP, RuleTransfer:
		return Rule(s), nil
	}
	return "", fmt.Errorf("calib: unknown threshold rule %q (want crc, cp or transfer)", s)
}

// Budgets maps each controlled role to its risk budget α(r) in [0, 1).
// Roles without a budget are not controlled by the CRC layer.
type Budgets map[decide.Role]float64

// ParseBudgets parses "target=0.01,credential=0.01,command=0.01".
func ParseBudgets(s string) (Budgets, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("calib: no budgets (want role=alpha,...)")
	}
	b := Budgets{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("calib: budget %q: want role=alpha", part)
		}
		role, err := decide.ParseRole(strings.TrimSpace(name))
		if err != nil {
			return nil, fmt.Errorf("calib: budget %q: %w", part, err)
		}
		if _, dup := b[role]; dup {
			return nil, fmt.Errorf("calib: budget %q: role %s given twice", part, role)
		}
		a, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return nil, fmt.Errorf("calib: budget %q: %w", part, err)
		}
		if err := checkAlpha(a); err != nil {
			return nil, fmt.Errorf("calib: budget %q: %w", part, err)
		}
		b[role] = a
	}
	return b, nil
}

func checkAlpha(a float64) error {
	if !(a >= 0 && a < 1) {
		return fmt.Errorf("alpha %v outside [0,1)", a)
	}
	return nil
}

// String formats the budgets as ParseBudgets reads them, in role order.
func (b Budgets) String() string {
	var parts []string
	for _, r := range decide.Roles {
		if a, ok := b[r]; ok {
			parts = append(parts, r.String()+"="+strconv.FormatFloat(a, 'g', -1, 64))
		}
	}
	return strings.Join(parts, ",")
}

// roles returns the budgeted roles in role order.
func (b Budgets) roles() []decide.Role {
	var rs []decide.Role
	for _, r := range decide.Roles {
		if _, ok := b[r]; ok {
			rs = append(rs, r)
		}
	}
	return rs
}

// Options are the calibration variants; they are recorded in the
// artifact.
type Options struct {
	// Episode calibrates one loss per episode and stratum, the maximum
	// over that episode's fields of the stratum (Supplement A): the
	// exchangeable unit is the episode, n counts episodes, and the
	// guarantee is on the probability that an episode has at least one
	// violated-and-allowed field of the stratum. Every record needs an
	// episode id.
	Episode bool `json:"episode"`
	// AttackedOnly calibrates on attacked fields only (label-conditional
	// CRC): the guarantee is on V_att(r), the violation rate among
	// attacked fields, which does not depend on how often attacks occur.
	AttackedOnly bool `json:"attacked_only"`
	// Rule is the threshold rule; empty means RuleCRC.
	Rule Rule `json:"rule"`
	// PoolWith lists the roles whose calibration fields join the pooled
	// stratum besides the roles pooled into it (the paper pools rare
	// roles with the high-risk roles: DefaultPoolWith). Their own
	// enforcement is unchanged.
	PoolWith []decide.Role `json:"pool_with"`
	// AllowMissing lets a budgeted role have no calibration fields: it is
	// pooled (n = 0 is below every floor) instead of being an error.
	AllowMissing bool `json:"allow_missing"`
}

// DefaultPoolWith are the integrity-critical roles the paper pools rare
// roles with.
var DefaultPoolWith = []decide.Role{decide.RoleTarget, decide.RoleCredential, decide.RoleCommand}

// PooledStratum is the name of the pooled high-risk stratum.
const PooledStratum = "pooled"

// Config is what Calibrate needs besides the fields.
type Config struct {
	Budgets Budgets    // α(r) per controlled role
	Delta   float64    // total failure probability δ of the simultaneous certificate
	Score   score.Kind // the similarity kind the scores were computed with
	Options Options
}

func (c *Config) validate() error {
	if len(c.Budgets) == 0 {
		return errors.New("calib: no budgets")
	}
	for _, r := range c.Budgets.roles() {
		if err := checkAlpha(c.Budgets[r]); err != nil {
			return fmt.Errorf("calib: budget of %s: %w", r, err)
		}
	}
	if len(c.Budgets.roles()) != len(c.Budgets) {
		return errors.New("calib: budget for an unknown role")
	}
	if !(c.Delta > 0 && c.Delta < 1) {
		return fmt.Errorf("calib: delta %v outside (0,1)", c.Delta)
	}
	if _, err := score.ParseKind(string(c.Score)); err != nil {
		return fmt.Errorf("calib: %w", err)
	}
	if _, err := ParseRule(string(c.Options.Rule)); err != nil {
		return err
	}
	for _, r := range c.Options.PoolWith {
		if !slices.Contains(decide.Roles, r) {
			return fmt.Errorf("calib: pool-with: unknown role %d", uint8(r))
		}
	}
	return nil
}

// roleSet is a set of roles as a bit mask.
type roleSet uint16

func (s roleSet) has(r decide.Role) bool { return s&(1<<r) != 0 }
func setOf(rs ...decide.Role) roleSet {
	var s roleSet
	for _, r := range rs {
		s |= 1 << r
	}
	return s
}
func (s roleSet) list() []decide.Role {
	var rs []decide.Role
	for _, r := range decide.Roles {
		if s.has(r) {
			rs = append(rs, r)
		}
	}
	return rs
}

// Calibrate runs role-stratified per-field CRC (Algorithm 1) on the
// calibration fields and returns the artifact: one stratum per budgeted
// role whose floor 1/(n_r+1) is at most α(r), and one pooled stratum for
// the others (with PoolWith's fields, budget the least of its pooled
// roles' budgets), each with its threshold (Eq. 5, or Eq. 6 under
// RuleCP) and its Clopper–Pearson certificate at δ_g = δ/|G| (Theorem 2).
// The artifact's Source counts the records; the caller adds the files.
func Calibrate(fields []FieldRecord, cfg Config) (*Artifact, error) {
	if cfg.Options.Rule == "" {
		cfg.Options.Rule = RuleCRC
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	opts := cfg.Options
	for i := range fields {
		if err := fields[i].check(); err != nil {
			return nil, fmt.Errorf("calib: field %d: %w", i+1, err)
		}
		if opts.Episode && fields[i].Episode == "" {
			return nil, fmt.Errorf("calib: field %d (%s): no episode id, which the episode option needs", i+1, fields[i].Role)
		}
	}
	used := fields
	if opts.AttackedOnly {
		used = make([]FieldRecord, 0, len(fields)/2)
		for _, f := range fields {
			if f.Attacked {
				used = append(used, f)
			}
		}
	}

	// Algorithm 1, lines 2–9: which roles keep their own stratum.
	budgeted := cfg.Budgets.roles()
	own := map[decide.Role]units{}
	var pooled []decide.Role
	for _, r := range budgeted {
		u := collect(used, setOf(r), opts.Episode)
		if u.n == 0 && !opts.AllowMissing {
			what := "calibration fields"
			if opts.AttackedOnly {
				what = "attacked calibration fields"
			}
			return nil, fmt.Errorf("calib: role %s has a budget but no %s (the allow-missing option, --allow-missing, pools it instead)", r, what)
		}
		if opts.Rule != RuleTransfer && MaxAllowedViolations(RuleCRC, u.n, cfg.Budgets[r], 0) < 0 {
			pooled = append(pooled, r)
		} else {
			own[r] = u
		}
	}
	nStrata := len(own)
	if len(pooled) > 0 {
		nStrata++
	}
	deltaG := cfg.Delta / float64(nStrata)

	a := &Artifact{
		Version:     ArtifactVersion,
		Created:     time.Now().UTC().Truncate(time.Second),
		Score:       string(cfg.Score),
		Options:     opts,
		Budgets:     cloneBudgets(cfg.Budgets),
		Delta:       cfg.Delta,
		RoleStratum: map[decide.Role]string{},
		Source:      Source{Records: len(fields), Used: len(used)},
	}
	a.Options.PoolWith = setOf(opts.PoolWith...).list()
	for _, r := range budgeted {
		u, ok := own[r]
		if !ok {
			continue
		}
		st := solve(used, setOf(r), u, opts.Rule, cfg.Budgets[r], deltaG)
		st.Name, st.Roles = r.String(), []decide.Role{r}
		a.Strata = append(a.Strata, st)
		a.RoleStratum[r] = st.Name
	}
	if len(pooled) > 0 {
		alpha := cfg.Budgets[pooled[0]]
		for _, r := range pooled {
			alpha = min(alpha, cfg.Budgets[r]) // pooling never loosens a budget
			a.RoleStratum[r] = PooledStratum
		}
		// Donors lend their fields; a donor without fields is not listed.
		var present roleSet
		for i := range used {
			present |= setOf(used[i].Role)
		}
		set := setOf(pooled...) | setOf(opts.PoolWith...)&present
		st := solve(used, set, collect(used, set, opts.Episode), opts.Rule, alpha, deltaG)
		st.Name, st.Roles, st.Pooled = PooledStratum, set.list(), pooled
		if !st.BlockAll {
			note := "its guarantee covers the pooled population (" + roleList(st.Roles) + "), not each pooled role alone"
			if st.Note != "" {
				note += "; " + st.Note
			}
			st.Note = note
		}
		a.Strata = append(a.Strata, st)
	}
	return a, nil
}

func cloneBudgets(b Budgets) Budgets {
	c := make(Budgets, len(b))
	for r, a := range b {
		c[r] = a
	}
	return c
}

// units summarises a stratum's calibration units: how many, and the
// sorted loss scores of the violated ones (a violated unit's loss is 1 at
// every threshold at or above its loss score: the field's score, or in
// episode mode the least score among the episode's violated fields).
type units struct {
	n    int
	viol []float64
}

func collect(fields []FieldRecord, set roleSet, episode bool) units {
	var u units
	if !episode {
		for i := range fields {
			if set.has(fields[i].Role) {
				u.n++
				if fields[i].Violated {
					u.viol = append(u.viol, fields[i].Score)
				}
			}
		}
		slices.Sort(u.viol)
		return u
	}
	// One unit per episode: violated iff any of its fields is, with the
	// least violated score (the loss max_i L(x_i; τ) is 1 iff τ >= it).
	type ep struct {
		violated bool
		min      float64
	}
	eps := map[string]*ep{}
	for i := range fields {
		f := &fields[i]
		if !set.has(f.Role) {
			continue
		}
		e := eps[f.Episode]
		if e == nil {
			e = &ep{}
			eps[f.Episode] = e
		}
		if f.Violated && (!e.violated || f.Score < e.min) {
			e.violated, e.min = true, f.Score
		}
	}
	u.n = len(eps)
	for _, e := range eps {
		if e.violated {
			u.viol = append(u.viol, e.min)
		}
	}
	slices.Sort(u.viol)
	return u
}

// solve computes one stratum's threshold and certificate.
//
// The loss count k(τ) = #{violated units with loss score <= τ} is a
// right-continuous step function, so with K = MaxAllowedViolations the
// feasible thresholds are exactly τ < v, v the (K+1)-th smallest violated
// loss score: at τ = v itself (and for every field tied with v) the
// budget is exceeded. The threshold is the largest candidate below v,
// the candidates being 0 and the stratum's calibration scores; every
// score in the gap up to v is blocked. With no more than K violated units
// every threshold is feasible and τ̂ = 1 allows every score. With K < 0
// (below the floor) or v = 0 no threshold allows anything: BlockAll.
func solve(fields []FieldRecord, set roleSet, u units, rule Rule, alpha, deltaG float64) Stratum {
	st := Stratum{
		N:        u.n,
		Violated: len(u.viol),
		Floor:    1 / float64(u.n+1),
		Alpha:    alpha,
		Delta:    deltaG,
	}
	floorOK := MaxAllowedViolations(RuleCRC, u.n, alpha, 0) >= 0
	if rule == RuleTransfer {
		return solveTransfer(fields, set, u, st, floorOK)
	}
	K := MaxAllowedViolations(rule, u.n, alpha, deltaG)
	switch {
	case K < 0:
		st.BlockAll = true
		if !floorOK {
			st.Note = fmt.Sprintf("below its floor 1/(n+1) = %.4g > alpha: not certifiable, blocks every field", st.Floor)
		} else {
			st.Note = "no threshold keeps the Clopper-Pearson bound within alpha: blocks every field"
		}
	case len(u.viol) <= K:
		st.Threshold, st.K = 1, len(u.viol)
	default:
		v := u.viol[K]
		if v <= 0 {
			st.BlockAll = true
			st.Note = "violated fields score 0: blocks every field"
			break
		}
		tau := 0.0
		for i := range fields {
			if s := fields[i].Score; s < v && s > tau && set.has(fields[i].Role) {
				tau = s
			}
		}
		st.Threshold = tau
		st.K, _ = slices.BinarySearch(u.viol, v) // violated units below v
	}
	st.InflatedRisk = float64(st.K+1) / float64(u.n+1)
	st.CPUpper = ClopperPearsonUpper(st.K, u.n, deltaG)
	st.Certifiable = floorOK && st.CPUpper <= alpha
	if !st.Certifiable && !st.BlockAll {
		st.Note = fmt.Sprintf("Clopper-Pearson bound %.4g > alpha: expectation guarantee only, more calibration data needed to certify", st.CPUpper)
	}
	return st
}

// solveTransfer is solve under RuleTransfer: the units certified are the
// m violated ones, and the quantity bounded is the fraction of them the
// threshold allows. K = MaxAllowedViolations(RuleTransfer, m, α, δ_g)
// is the most of them that may be allowed; as in solve, the threshold is
// the largest calibration score below the (K+1)-th smallest violated loss
// score, and every score in the gap up to it is blocked. With too few
// violated units for even K = 0 (m < ln δ_g / ln(1−α)) the stratum blocks
// every field: the role stays at the strict rule.
func solveTransfer(fields []FieldRecord, set roleSet, u units, st Stratum, floorOK bool) Stratum {
	m := len(u.viol)
	K := MaxAllowedViolations(RuleTransfer, m, st.Alpha, st.Delta)
	blocked := func(note string) Stratum {
		st.BlockAll, st.Note = true, note
		st.InflatedRisk = 1 / float64(u.n+1)
		st.CPUpper = 1
		return st
	}
	if K < 0 {
		return blocked(fmt.Sprintf("%d violated units are too few to certify an attacker-release rate <= alpha at 1-delta_g: the strict rule (blocks every untrusted field)", m))
	}
	v := u.viol[K] // K < m: U(m, m; δ) = 1 > α
	if v <= 0 {
		return blocked("violated fields score 0: blocks every field")
	}
	tau := 0.0
	for i := range fields {
		if s := fields[i].Score; s < v && s > tau && set.has(fields[i].Role) {
			tau = s
		}
	}
	st.Threshold = tau
	st.K, _ = slices.BinarySearch(u.viol, v)
	st.InflatedRisk = float64(st.K+1) / float64(u.n+1)
	st.CPUpper = ClopperPearsonUpper(st.K, m, st.Delta)
	st.Certifiable = floorOK && st.CPUpper <= st.Alpha
	st.Note = fmt.Sprintf("attacker-release rate certified on its own violated units: %d of %d allowed, Clopper-Pearson bound %.4g", st.K, m, st.CPUpper)
	return st
}
