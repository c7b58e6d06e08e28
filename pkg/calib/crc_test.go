package calib

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/decide/score"
	"github.com/google/go-cmp/cmp"
)

const (
	tgt  = decide.RoleTarget
	cred = decide.RoleCredential
	cmdR = decide.RoleCommand
	sel  = decide.RoleSelector
)

// recs builds records of one role from "score:v" (violated) and "score"
// (benign) tokens.
func recs(role decide.Role, spec string) []FieldRecord {
	var out []FieldRecord
	for _, tok := range strings.Fields(spec) {
		s, v := strings.CutSuffix(tok, ":v")
		var x float64
		if _, err := fmt.Sscan(s, &x); err != nil {
			panic(err)
		}
		out = append(out, FieldRecord{Role: role, Score: x, Violated: v, Attacked: v})
	}
	return out
}

func cfg(b string, delta float64) Config {
	bs, err := ParseBudgets(b)
	if err != nil {
		panic(err)
	}
	return Config{Budgets: bs, Delta: delta, Score: score.KindNgram, Options: Options{PoolWith: DefaultPoolWith}}
}

func mustCalibrate(t *testing.T, fields []FieldRecord, c Config) *Artifact {
	t.Helper()
	a, err := Calibrate(fields, c)
	if err != nil {
		t.Fatalf("Calibrate: %v", err)
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("Calibrate produced an invalid artifact: %v", err)
	}
	return a
}

// TestEq5HandComputed checks Eq. 5 on small stratums worked by hand.
func TestEq5HandComputed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     string
		alpha    float64
		tau      float64
		blockAll bool
		k        int
	}{
		// n=9, α=0.2: (k+1)/10 <= 0.2 allows K=1 violated field. Violated
		// scores 0.2 0.4 0.6 0.9: any τ < 0.4 is feasible; the largest
		// candidate below 0.4 is 0.3 (k=1, risk 0.2); τ=0.4 gives 0.3.
		{"basic", "0.1 0.2:v 0.3 0.4:v 0.5 0.6:v 0.7 0.8 0.9:v", 0.2, 0.3, false, 1},
		// Same, α=0.3 (K=2): τ < 0.6, largest candidate 0.5.
		{"basic-alpha0.3", "0.1 0.2:v 0.3 0.4:v 0.5 0.6:v 0.7 0.8 0.9:v", 0.3, 0.5, false, 2},
		// Ties at the boundary: the second violated score 0.5 is shared by
		// two benign fields; all three are blocked (τ=0.3), since allowing
		// 0.5 allows the violated field too.
		{"tie-benign", "0.1 0.3:v 0.3 0.5:v 0.5 0.5 0.7:v 0.8 0.9", 0.2, 0.3, false, 1},
		// Two violated fields tie at 0.2 and K=1: τ < 0.2, no calibration
		// score below it, so the candidate 0 (only score-0 fields pass).
		{"tie-violated", "0.2:v 0.2:v 0.6 0.7 0.8 0.9 0.9 0.9 0.9", 0.2, 0, false, 0},
		// Every field violated, K=1: τ < 0.2 = second smallest, so 0.1.
		{"all-violated", "0.1:v 0.2:v 0.3:v 0.4:v 0.5:v 0.6:v 0.7:v 0.8:v 0.9:v", 0.2, 0.1, false, 1},
		// None violated: every τ is feasible; τ̂ = 1 allows every score.
		{"none-violated", "0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9", 0.2, 1, false, 0},
		// Violated fields within K: also allow all (k = 1 <= K = 1).
		{"within-budget", "0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9:v", 0.2, 1, false, 1},
		// K=0 and a violated field scores 0: nothing can be allowed.
		{"violated-at-zero", "0:v 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9", 0.1, 0, true, 0},
		// K=0, smallest violated 0.35: τ=0.3.
		{"floor-exact", "0.1 0.35:v 0.3 0.4 0.5 0.6 0.7 0.8 0.9", 0.1, 0.3, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := recs(tgt, tc.spec)
			a := mustCalibrate(t, f, cfg(fmt.Sprintf("target=%v", tc.alpha), 0.05))
			if len(a.Strata) != 1 {
				t.Fatalf("%d strata, want 1", len(a.Strata))
			}
			st := a.Strata[0]
			if st.Threshold != tc.tau || st.BlockAll != tc.blockAll || st.K != tc.k {
				t.Fatalf("τ̂=%v block_all=%v k=%d, want τ̂=%v block_all=%v k=%d", st.Threshold, st.BlockAll, st.K, tc.tau, tc.blockAll, tc.k)
			}
			if st.N != len(f) || st.Floor != 1/float64(len(f)+1) {
				t.Errorf("n=%d floor=%v", st.N, st.Floor)
			}
			// Eq. 5 directly: the threshold is feasible and no larger
			// calibration score is.
			if !tc.blockAll {
				if r := (float64(lossCount(f, st.Threshold)) + 1) / float64(len(f)+1); r > tc.alpha+1e-12 {
					t.Errorf("inflated risk %v at τ̂ exceeds α", r)
				}
			}
			for _, x := range f {
				if x.Score > st.Threshold && (float64(lossCount(f, x.Score))+1)/float64(len(f)+1) <= tc.alpha+1e-12 {
					t.Errorf("score %v > τ̂ is feasible too: τ̂ is not the supremum", x.Score)
				}
			}
			// Enforcement agrees with the threshold.
			for _, x := range f {
				if got, want := a.Allowed(tgt, x.Score), !st.BlockAll && x.Score <= st.Threshold; got != want {
					t.Errorf("Allowed(%v) = %v, want %v", x.Score, got, want)
				}
			}
		})
	}
}

func lossCount(f []FieldRecord, tau float64) int {
	k := 0
	for _, x := range f {
		if x.Violated && x.Score <= tau {
			k++
		}
	}
	return k
}

func TestBelowFloorBlocksAll(t *testing.T) {
	// n=3 and α=0.2: floor 1/4 > 0.2; no pool donors: the pooled stratum
	// is the role alone, still below its floor.
	c := cfg("target=0.2", 0.05)
	c.Options.PoolWith = nil
	a := mustCalibrate(t, recs(tgt, "0.1 0.2 0.3"), c)
	st := a.Stratum(PooledStratum)
	if st == nil || !st.BlockAll || st.Certifiable || a.RoleStratum[tgt] != PooledStratum {
		t.Fatalf("want a blocking, uncertifiable pooled stratum; got %+v, map %v", st, a.RoleStratum)
	}
	if !strings.Contains(st.Note, "not certifiable") {
		t.Errorf("note %q does not say it is not certifiable", st.Note)
	}
	for _, s := range []float64{0, 0.1, 1} {
		if a.Allowed(tgt, s) {
			t.Errorf("Allowed(target, %v) in a block-all stratum", s)
		}
	}
	if th := a.Engine().Threshold[tgt]; !math.IsInf(th, -1) {
		t.Errorf("engine threshold %v, want -Inf", th)
	}
	// With the default donors, none of which has fields here, the pool
	// lists only the role itself.
	a = mustCalibrate(t, recs(tgt, "0.1 0.2 0.3"), cfg("target=0.2", 0.05))
	if st := a.Stratum(PooledStratum); !slices.Equal(st.Roles, []decide.Role{tgt}) || !st.BlockAll {
		t.Errorf("pool roles %v block_all %v, want [target] true", st.Roles, st.BlockAll)
	}
}

func TestPooling(t *testing.T) {
	// target: 50 fields (floor 1/51 <= 0.1): own stratum.
	// credential: 5 fields (floor 1/6 > 0.1): pooled.
	// command: 3 fields (floor 1/4 > 0.2): pooled.
	// The pool holds target+credential+command = 58 fields, α = min(0.1, 0.2).
	var f []FieldRecord
	for i := range 50 {
		f = append(f, FieldRecord{Role: tgt, Score: float64(i) / 100})
	}
	f = append(f, FieldRecord{Role: tgt, Score: 0.45, Violated: true, Attacked: true}) // n_target = 51
	f = append(f, recs(cred, "0.6:v 0.7:v 0.2 0.3 0.95")...)
	f = append(f, recs(cmdR, "0.55 0.65:v 0.05")...)
	f = append(f, recs(sel, "0.99:v 0.1")...) // no budget: ignored except as a donor
	a := mustCalibrate(t, f, cfg("target=0.1,credential=0.1,command=0.2", 0.1))

	if d := cmp.Diff(map[decide.Role]string{tgt: "target", cred: PooledStratum, cmdR: PooledStratum}, a.RoleStratum); d != "" {
		t.Fatalf("role_stratum (-want +got):\n%s", d)
	}
	pool := a.Stratum(PooledStratum)
	if d := cmp.Diff([]decide.Role{tgt, cred, cmdR}, pool.Roles); d != "" {
		t.Errorf("pool roles (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]decide.Role{cred, cmdR}, pool.Pooled); d != "" {
		t.Errorf("pooled roles (-want +got):\n%s", d)
	}
	// n=59 (51+5+3), α=0.1: K = floor(6)-1 = 5. Violated pool scores:
	// 0.45 0.6 0.65 0.7 → 4 <= 5: allow everything.
	if pool.N != 59 || pool.Alpha != 0.1 || pool.Violated != 4 || pool.Threshold != 1 || pool.K != 4 {
		t.Errorf("pool n=%d α=%v violated=%d τ̂=%v k=%d; want 59 0.1 4 1 4", pool.N, pool.Alpha, pool.Violated, pool.Threshold, pool.K)
	}
	// Target alone: n=51, α=0.1: K = floor(5.2)-1 = 4 >= 1 violated: τ̂ = 1.
	tg := a.Stratum("target")
	if tg.N != 51 || tg.Threshold != 1 || len(tg.Pooled) != 0 {
		t.Errorf("target stratum %+v", tg)
	}
	// Bonferroni over the two final strata.
	for _, st := range a.Strata {
		if st.Delta != 0.05 {
			t.Errorf("stratum %s δ_g = %v, want 0.1/2", st.Name, st.Delta)
		}
	}
	if !strings.Contains(pool.Note, "guarantee covers the pooled population") {
		t.Errorf("pool note %q", pool.Note)
	}

	// Pool only the rare roles themselves (no donors): n = 8, floor 1/9 >
	// 0.1, so the pool is not certifiable and blocks everything.
	c := cfg("target=0.1,credential=0.1,command=0.2", 0.1)
	c.Options.PoolWith = nil
	a = mustCalibrate(t, f, c)
	pool = a.Stratum(PooledStratum)
	if pool.N != 8 || !pool.BlockAll || pool.Certifiable {
		t.Errorf("donor-less pool: n=%d block_all=%v certifiable=%v", pool.N, pool.BlockAll, pool.Certifiable)
	}
	if a.Allowed(cred, 0) || !a.Allowed(tgt, 0.9) {
		t.Error("donor-less pool: credential allowed or target blocked")
	}
}

func TestPoolBudgetIsTheLeast(t *testing.T) {
	var f []FieldRecord
	for i := range 400 {
		f = append(f, FieldRecord{Role: tgt, Score: float64(i%100) / 100, Violated: i%10 == 0, Attacked: i%10 == 0})
	}
	f = append(f, recs(cred, "0.5 0.6")...)
	f = append(f, recs(cmdR, "0.5")...)
	a := mustCalibrate(t, f, cfg("target=0.2,credential=0.05,command=0.3", 0.05))
	if got := a.Stratum(PooledStratum).Alpha; got != 0.05 {
		t.Fatalf("pool alpha %v, want min(0.05, 0.3)", got)
	}
}

func TestCertificate(t *testing.T) {
	// Two strata with no violations: δ=0.1 splits into δ_g=0.05.
	// U(0, 300; 0.05) = 0.009936 <= 0.01: certified.
	// U(0, 298; 0.05) = 0.010002 > 0.01: expectation guarantee only.
	var f []FieldRecord
	for i := range 300 {
		f = append(f, FieldRecord{Role: tgt, Score: float64(i) / 300})
	}
	for i := range 298 {
		f = append(f, FieldRecord{Role: cmdR, Score: float64(i) / 298})
	}
	a := mustCalibrate(t, f, cfg("target=0.01,command=0.01", 0.1))
	tg, cm := a.Stratum("target"), a.Stratum("command")
	if !tg.Certifiable || math.Abs(tg.CPUpper-0.0099361) > 1e-6 || tg.Delta != 0.05 {
		t.Errorf("target: certifiable=%v U=%v δ_g=%v", tg.Certifiable, tg.CPUpper, tg.Delta)
	}
	if cm.Certifiable || math.Abs(cm.CPUpper-0.010002) > 1e-6 || cm.Threshold != 1 {
		t.Errorf("command: certifiable=%v U=%v τ̂=%v", cm.Certifiable, cm.CPUpper, cm.Threshold)
	}
	if !strings.Contains(cm.Note, "expectation guarantee only") {
		t.Errorf("command note %q", cm.Note)
	}
	// With one stratum only, δ_g = δ = 0.1 and U(0, 298; 0.1) = 0.0077: certified.
	a = mustCalibrate(t, f, cfg("command=0.01", 0.1))
	if st := a.Stratum("command"); !st.Certifiable || st.Delta != 0.1 {
		t.Errorf("single command stratum: %+v", st)
	}
	// k > 0: n=1000 with 3 violated at the top, α=0.01: Eq. 5 allows
	// K = floor(10.01)-1 = 9, so all 3 are allowed (τ̂ = 1); U(3, 1000;
	// 0.05) = 0.00774 <= 0.01: certified.
	f = f[:0]
	for i := range 1000 {
		v := i >= 997
		f = append(f, FieldRecord{Role: tgt, Score: float64(i) / 1000, Violated: v, Attacked: v})
	}
	a = mustCalibrate(t, f, cfg("target=0.01", 0.05))
	st := a.Stratum("target")
	if st.K != 3 || st.Threshold != 1 || !st.Certifiable || math.Abs(st.CPUpper-cpByBisection(3, 1000, 0.05)) > 1e-9 {
		t.Errorf("k=3 stratum: %+v", st)
	}
}

func TestRuleCP(t *testing.T) {
	// n=1000, violated at every 50th score: 20 violated. Under RuleCP
	// with δ=0.05, α=0.02: the largest K with U(K, 1000) <= 0.02.
	var f []FieldRecord
	for i := range 1000 {
		v := i%50 == 49
		f = append(f, FieldRecord{Role: tgt, Score: float64(i) / 1000, Violated: v, Attacked: v})
	}
	c := cfg("target=0.02", 0.05)
	c.Options.Rule = RuleCP
	a := mustCalibrate(t, f, c)
	st := a.Stratum("target")
	K := MaxAllowedViolations(RuleCP, 1000, 0.02, 0.05)
	// Violated scores are 0.049, 0.099, ...: the (K+1)-th is (50(K+1)-1)/1000.
	wantTau := float64(50*(K+1)-2) / 1000
	if st.K != K || math.Abs(st.Threshold-wantTau) > 1e-12 || !st.Certifiable || st.CPUpper > 0.02 {
		t.Errorf("RuleCP: K=%d τ̂=%v certifiable=%v U=%v; want K=%d τ̂=%v", st.K, st.Threshold, st.Certifiable, st.CPUpper, K, wantTau)
	}
	// The CRC threshold is looser: K_crc = floor(20.02)-1 = 19.
	a = mustCalibrate(t, f, cfg("target=0.02", 0.05))
	if crc := a.Stratum("target"); crc.K != 19 || crc.Threshold <= st.Threshold || crc.Certifiable {
		t.Errorf("RuleCRC: %+v", crc)
	}
}

func TestEpisodeLevel(t *testing.T) {
	// Three episodes with two target fields each, one with one:
	//   e1: 0.2 (violated), 0.8 (violated) -> one violated unit, loss score 0.2
	//   e2: 0.3, 0.4 -> benign unit
	//   e3: 0.9 (violated), 0.1 -> violated unit, loss score 0.9
	//   e4: 0.5 -> benign
	f := []FieldRecord{
		{Role: tgt, Score: 0.2, Violated: true, Attacked: true, Episode: "e1"},
		{Role: tgt, Score: 0.8, Violated: true, Attacked: true, Episode: "e1"},
		{Role: tgt, Score: 0.3, Episode: "e2"},
		{Role: tgt, Score: 0.4, Episode: "e2"},
		{Role: tgt, Score: 0.9, Violated: true, Attacked: true, Episode: "e3"},
		{Role: tgt, Score: 0.1, Attacked: true, Episode: "e3"},
		{Role: tgt, Score: 0.5, Episode: "e4"},
	}
	// n=4 episodes, α=0.4: (k+1)/5 <= 0.4 gives K=1. Loss scores 0.2, 0.9:
	// τ < 0.9, largest field score below it 0.8, k=1 (only e1's loss).
	c := cfg("target=0.4", 0.05)
	c.Options.Episode = true
	a := mustCalibrate(t, f, c)
	st := a.Stratum("target")
	if st.N != 4 || st.Violated != 2 || st.K != 1 || st.Threshold != 0.8 {
		t.Errorf("episode stratum n=%d violated=%d k=%d τ̂=%v; want 4 2 1 0.8", st.N, st.Violated, st.K, st.Threshold)
	}
	// Field level, same data: n=7, α=0.4: K = floor(3.2)-1 = 2; violated
	// 0.2 0.8 0.9: τ < 0.9 → 0.8, k=2.
	a = mustCalibrate(t, f, cfg("target=0.4", 0.05))
	if st := a.Stratum("target"); st.N != 7 || st.K != 2 || st.Threshold != 0.8 {
		t.Errorf("field stratum %+v", st)
	}
	// Missing episode ids are an error naming the field.
	f[3].Episode = ""
	if _, err := Calibrate(f, c); err == nil || !strings.Contains(err.Error(), "field 4") {
		t.Errorf("missing episode: err = %v", err)
	}
}

func TestAttackedOnly(t *testing.T) {
	// 20 clean fields and 5 attacked (2 violated). Attacked-only: n=5.
	var f []FieldRecord
	for i := range 20 {
		f = append(f, FieldRecord{Role: tgt, Score: float64(i) / 20})
	}
	f = append(f, FieldRecord{Role: tgt, Score: 0.7, Attacked: true, Violated: true},
		FieldRecord{Role: tgt, Score: 0.9, Attacked: true, Violated: true},
		FieldRecord{Role: tgt, Score: 0.2, Attacked: true},
		FieldRecord{Role: tgt, Score: 0.4, Attacked: true},
		FieldRecord{Role: tgt, Score: 0.8, Attacked: true})
	c := cfg("target=0.34", 0.05)
	c.Options.AttackedOnly = true
	a := mustCalibrate(t, f, c)
	st := a.Stratum("target")
	// n=5, α=0.34: K = floor(2.04)-1 = 1; violated 0.7 0.9: τ < 0.9 among
	// attacked scores → 0.8 (the clean 0.85 and 0.95 are not candidates).
	if st.N != 5 || st.K != 1 || st.Threshold != 0.8 || a.Source.Used != 5 || a.Source.Records != 25 {
		t.Errorf("attacked-only: %+v, source %+v", st, a.Source)
	}
}

func TestCalibrateErrors(t *testing.T) {
	good := recs(tgt, "0.1 0.2:v 0.3")
	for _, tc := range []struct {
		name   string
		fields []FieldRecord
		c      Config
		want   string
	}{
		{"no data for budget", good, cfg("target=0.5,credential=0.5", 0.05), "role credential has a budget but no calibration fields"},
		{"bad delta", good, cfg("target=0.5", 1), "delta 1 outside"},
		{"bad score kind", good, Config{Budgets: Budgets{tgt: 0.5}, Delta: 0.05, Score: "cosine"}, `unknown similarity kind "cosine"`},
		{"bad rule", good, Config{Budgets: Budgets{tgt: 0.5}, Delta: 0.05, Score: score.KindToken, Options: Options{Rule: "lucky"}}, `unknown threshold rule "lucky"`},
		{"no budgets", good, Config{Delta: 0.05, Score: score.KindToken}, "no budgets"},
		{"score out of range", recs(tgt, "0.1 1.5"), cfg("target=0.5", 0.05), "field 2: score 1.5 outside [0,1]"},
		{"violated unattacked", []FieldRecord{{Role: tgt, Score: 0.5, Violated: true}}, cfg("target=0.5", 0.05), "field 1: violated but not attacked"},
		{"unknown role", []FieldRecord{{Role: 42, Score: 0.5}}, cfg("target=0.5", 0.05), "field 1: unknown role 42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Calibrate(tc.fields, tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "calib: ") {
				t.Errorf("err %q lacks the package prefix", err)
			}
		})
	}
	// AllowMissing pools the role instead.
	c := cfg("target=0.5,credential=0.5", 0.05)
	c.Options.AllowMissing = true
	a := mustCalibrate(t, good, c)
	if a.RoleStratum[cred] != PooledStratum {
		t.Errorf("missing credential mapped to %q, want pooled", a.RoleStratum[cred])
	}
}

func TestParseBudgets(t *testing.T) {
	b, err := ParseBudgets(" target=0.01, credential=0.02 ,command=0 ")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Budgets{tgt: 0.01, cred: 0.02, cmdR: 0}, b); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if got := b.String(); got != "target=0.01,credential=0.02,command=0" {
		t.Errorf("String() = %q", got)
	}
	for in, want := range map[string]string{
		"":                       "no budgets",
		"target":                 `budget "target": want role=alpha`,
		"recipient=0.01":         `budget "recipient=0.01": decide: unknown role "recipient"`,
		"target=0.01,target=0.2": `role target given twice`,
		"target=x":               `budget "target=x": strconv.ParseFloat`,
		"target=1":               `alpha 1 outside [0,1)`,
		"target=-0.1":            `alpha -0.1 outside [0,1)`,
		"target=NaN":             `alpha NaN outside [0,1)`,
	} {
		if _, err := ParseBudgets(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseBudgets(%q) error = %v, want %q", in, err, want)
		}
	}
}

// randomFields draws n fields of the given roles with discrete scores
// (ties are common) and a violation rate.
func randomFields(rng *rand.Rand, n int, roles []decide.Role, pViol float64) []FieldRecord {
	f := make([]FieldRecord, n)
	for i := range f {
		v := rng.Float64() < pViol
		s := math.Round(rng.Float64()*20) / 20
		if v {
			s = math.Min(1, math.Round((rng.Float64()*0.7+0.3)*20)/20)
		}
		f[i] = FieldRecord{Role: roles[rng.IntN(len(roles))], Score: s, Violated: v, Attacked: v || rng.IntN(2) == 0,
			Episode: fmt.Sprint(rng.IntN(n/3 + 1))}
	}
	return f
}

// TestEq5Optimality checks on random data with ties that τ̂ meets its
// rule and that no larger calibration score does, under both rules and
// with episode losses.
func TestEq5Optimality(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 300 {
		n := 5 + rng.IntN(300)
		f := randomFields(rng, n, []decide.Role{tgt}, rng.Float64()*0.4)
		alpha := []float64{0.01, 0.05, 0.1, 0.2, 0.3}[rng.IntN(5)]
		rule := []Rule{RuleCRC, RuleCP}[rng.IntN(2)]
		episode := rng.IntN(3) == 0
		c := cfg(fmt.Sprintf("target=%v", alpha), 0.1)
		c.Options.Rule, c.Options.Episode, c.Options.AllowMissing = rule, episode, true
		a := mustCalibrate(t, f, c)
		st := a.Stratum(a.RoleStratum[tgt])
		nu := st.N
		feasible := func(tau float64) bool {
			k := episodeLoss(f, tau, episode)
			if rule == RuleCP {
				return ClopperPearsonUpper(k, nu, st.Delta) <= alpha
			}
			return float64(k+1) <= alpha*float64(nu+1)*(1+1e-15)
		}
		if !st.BlockAll && !feasible(st.Threshold) {
			t.Fatalf("iter %d: τ̂=%v infeasible (%+v)", it, st.Threshold, st)
		}
		if !st.BlockAll && episodeLoss(f, st.Threshold, episode) != st.K {
			t.Fatalf("iter %d: reported k=%d, recount %d", it, st.K, episodeLoss(f, st.Threshold, episode))
		}
		for _, x := range f {
			if (st.BlockAll || x.Score > st.Threshold) && feasible(x.Score) && MaxAllowedViolations(rule, nu, alpha, st.Delta) >= 0 {
				t.Fatalf("iter %d: score %v above τ̂=%v (block_all=%v) is feasible", it, x.Score, st.Threshold, st.BlockAll)
			}
		}
	}
}

// episodeLoss counts violated units allowed at τ: fields, or episodes
// with at least one violated field scored at most τ.
func episodeLoss(f []FieldRecord, tau float64, episode bool) int {
	if !episode {
		return lossCount(f, tau)
	}
	hit := map[string]bool{}
	for _, x := range f {
		if x.Violated && x.Score <= tau {
			hit[x.Episode] = true
		}
	}
	return len(hit)
}

func TestPropertyThresholdMonotoneInAlpha(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sets := 40
	if testing.Short() {
		sets = 12
	}
	for range sets {
		f := randomFields(rng, 100+rng.IntN(400), []decide.Role{tgt}, rng.Float64()*0.3)
		for _, rule := range []Rule{RuleCRC, RuleCP} {
			prev := math.Inf(-1)
			for alpha := 0.005; alpha < 0.6; alpha += 0.0075 {
				c := cfg(fmt.Sprintf("target=%v", alpha), 0.05)
				c.Options.Rule = rule
				c.Options.PoolWith = nil
				st := mustCalibrate(t, f, c).Strata[0]
				tau := st.Threshold
				if st.BlockAll {
					tau = math.Inf(-1)
				}
				if tau < prev {
					t.Fatalf("rule %s: τ̂ fell from %v to %v as α rose to %v", rule, prev, tau, alpha)
				}
				prev = tau
			}
		}
	}
}

func TestPropertyFloorAndPooling(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	roles := []decide.Role{tgt, cred, cmdR, sel}
	for it := range 300 {
		f := randomFields(rng, 1+rng.IntN(400), roles, 0.2)
		b := Budgets{}
		for _, r := range roles {
			if rng.IntN(4) > 0 {
				b[r] = []float64{0, 0.005, 0.01, 0.05, 0.1, 0.3}[rng.IntN(6)]
			}
		}
		if len(b) == 0 {
			b[tgt] = 0.1
		}
		c := Config{Budgets: b, Delta: 0.05, Score: score.KindToken, Options: Options{
			AllowMissing: true, Rule: []Rule{RuleCRC, RuleCP}[rng.IntN(2)], Episode: rng.IntN(2) == 0}}
		if rng.IntN(2) == 0 {
			c.Options.PoolWith = DefaultPoolWith
		}
		a := mustCalibrate(t, f, c)
		n := map[decide.Role]int{}
		for _, r := range b.roles() {
			n[r] = collect(f, setOf(r), c.Options.Episode).n
		}
		for r, al := range b {
			st := a.Stratum(a.RoleStratum[r])
			if st.Alpha > al {
				t.Fatalf("iter %d: pooling loosened %s from %v to %v", it, r, al, st.Alpha)
			}
			below := al < 1/float64(n[r]+1)
			if below && st.Name == r.String() {
				t.Fatalf("iter %d: %s below its floor (n=%d, α=%v) kept its own stratum", it, r, n[r], al)
			}
			if !below && st.Name != r.String() {
				t.Fatalf("iter %d: %s above its floor was pooled", it, r)
			}
		}
		deltaSum := 0.0
		for _, st := range a.Strata {
			deltaSum += st.Delta
			if st.Certifiable && st.Alpha < st.Floor {
				t.Fatalf("iter %d: stratum %s certified below its floor", it, st.Name)
			}
			if st.Certifiable && st.CPUpper > st.Alpha {
				t.Fatalf("iter %d: stratum %s certified with U=%v > α=%v", it, st.Name, st.CPUpper, st.Alpha)
			}
		}
		if math.Abs(deltaSum-0.05) > 1e-12 {
			t.Fatalf("iter %d: δ_g sum to %v", it, deltaSum)
		}
	}
}

func ExampleCalibrate() {
	budgets, _ := ParseBudgets("target=0.1")
	var fields []FieldRecord
	for i := range 30 { // 30 target fields, scores 0.00 .. 0.29
		fields = append(fields, FieldRecord{Role: decide.RoleTarget, Score: float64(i) / 100})
	}
	// Three violated fields; with n=33 and α=0.1, Eq. 5 allows
	// (k+1)/34 <= 0.1, i.e. k <= 2: the threshold sits just below the
	// third violated score.
	for _, s := range []float64{0.15, 0.5, 0.8} {
		fields = append(fields, FieldRecord{Role: decide.RoleTarget, Score: s, Violated: true, Attacked: true})
	}
	a, err := Calibrate(fields, Config{Budgets: budgets, Delta: 0.05, Score: score.KindNgram})
	if err != nil {
		panic(err)
	}
	st := a.Strata[0]
	fmt.Printf("n=%d k=%d threshold=%v certifiable=%v\n", st.N, st.K, st.Threshold, st.Certifiable)
	fmt.Println(a.Allowed(decide.RoleTarget, 0.5), a.Allowed(decide.RoleTarget, 0.6))
	// Output:
	// n=33 k=2 threshold=0.5 certifiable=false
	// true false
}

func ExampleParseBudgets() {
	b, err := ParseBudgets("target=0.01,credential=0.01,command=0.02")
	fmt.Println(b, err)
	_, err = ParseBudgets("recipient=0.01")
	fmt.Println(err)
	// Output:
	// target=0.01,credential=0.01,command=0.02 <nil>
	// calib: budget "recipient=0.01": decide: unknown role "recipient" (want target, credential, command, selector, control or content)
}
