package calib

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/go-cmp/cmp"
)

// sampleArtifact is a valid artifact with an own stratum, a pooled one
// that blocks, a source file and a ledger.
func sampleArtifact(t testing.TB) *Artifact {
	var f []FieldRecord
	for i := range 200 {
		v := i%20 == 19
		f = append(f, FieldRecord{Role: decide.RoleTarget, Score: float64(i) / 200, Violated: v, Attacked: v})
	}
	f = append(f, recs(decide.RoleCredential, "0.3 0.9:v")...)
	c := cfg("target=0.05,credential=0.01", 0.05)
	c.Options.PoolWith = nil
	a, err := Calibrate(f, c)
	if err != nil {
		t.Fatal(err)
	}
	a.Source.Files = []SourceFile{{Path: "cal.jsonl", SHA256: strings.Repeat("ab", 32), Records: len(f)}}
	a.Ledger = &LedgerCalibration{Lambda: 0.62, Alpha: 0.1, N: 120, CorrectedRisk: 0.094, LossBound: 1, Evidence: "g-carb", Scorer: "table1-v1"}
	return a
}

func TestArtifactRoundTrip(t *testing.T) {
	a := sampleArtifact(t)
	var buf bytes.Buffer
	if err := a.WriteArtifact(&buf); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "calib.json")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := ReadArtifact(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(a, b); d != "" {
		t.Fatalf("round trip (-wrote +read):\n%s", d)
	}
	// The JSON is what docs/calibration.md describes.
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "created", "score", "options", "budgets", "delta", "strata", "role_stratum", "ledger", "source"} {
		if _, ok := m[k]; !ok {
			t.Errorf("artifact JSON lacks %q", k)
		}
	}
	if got := m["role_stratum"].(map[string]any)["credential"]; got != PooledStratum {
		t.Errorf("role_stratum.credential = %v", got)
	}
}

func TestArtifactEngineAndAllowed(t *testing.T) {
	a := sampleArtifact(t)
	tg := a.Stratum("target")
	// n=200, α=0.05: K = floor(10.05)-1 = 9; violated at 0.095, 0.195, ...,
	// the 10th is 0.995: τ̂ = 0.99.
	if tg.Threshold != 0.99 || tg.K != 9 || tg.BlockAll {
		t.Fatalf("target stratum %+v", tg)
	}
	e := a.Engine()
	want := decide.Calibration{
		Score:        "ngram",
		Threshold:    map[decide.Role]float64{decide.RoleTarget: 0.99, decide.RoleCredential: math.Inf(-1)},
		Stratum:      map[decide.Role]string{decide.RoleTarget: "target", decide.RoleCredential: PooledStratum},
		LedgerLambda: 0.62,
		HasLedger:    true,
	}
	if d := cmp.Diff(want, e); d != "" {
		t.Errorf("Engine() (-want +got):\n%s", d)
	}
	for _, tc := range []struct {
		role decide.Role
		s    float64
		want bool
	}{
		{decide.RoleTarget, 0, true},
		{decide.RoleTarget, 0.99, true},
		{decide.RoleTarget, 0.995, false},
		{decide.RoleTarget, math.NaN(), false},
		{decide.RoleCredential, 0, false}, // pooled below its floor: blocked
		{decide.RoleCommand, 0, false},    // not calibrated: fail closed
	} {
		if got := a.Allowed(tc.role, tc.s); got != tc.want {
			t.Errorf("Allowed(%s, %v) = %v, want %v", tc.role, tc.s, got, tc.want)
		}
		// The engine's view decides the same way.
		th, ok := e.Threshold[tc.role]
		if got := ok && tc.s <= th; got != tc.want {
			t.Errorf("engine view: %s %v -> %v, want %v", tc.role, tc.s, got, tc.want)
		}
	}
	a.Ledger = nil
	if e := a.Engine(); e.HasLedger || e.LedgerLambda != 0 {
		t.Errorf("no ledger: %+v", e)
	}
}

// mutate decodes the sample artifact's JSON into generic maps, applies
// fn and re-encodes it.
func mutate(t *testing.T, fn func(m map[string]any)) []byte {
	var buf bytes.Buffer
	if err := sampleArtifact(t).WriteArtifact(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	fn(m)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func stratum(m map[string]any, i int) map[string]any {
	return m["strata"].([]any)[i].(map[string]any)
}

func TestDecodeArtifactErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(m map[string]any)
		want string
	}{
		{"version", func(m map[string]any) { m["version"] = 2; m["new_key"] = 1 }, "unsupported version 2 (want 1)"},
		{"no version", func(m map[string]any) { delete(m, "version") }, "no version"},
		{"unknown key", func(m map[string]any) { m["thresholds"] = 1 }, `unknown field "thresholds"`},
		{"unknown stratum key", func(m map[string]any) { stratum(m, 0)["tau"] = 1 }, `unknown field "tau"`},
		{"threshold range", func(m map[string]any) { stratum(m, 0)["threshold"] = 1.5 }, `stratum 1 ("target"): threshold 1.5 outside [0,1]`},
		{"negative threshold", func(m map[string]any) { stratum(m, 0)["threshold"] = -0.1 }, `threshold -0.1 outside [0,1]`},
		{"block_all threshold", func(m map[string]any) { stratum(m, 1)["threshold"] = 0.5 }, `block_all with threshold 0.5`},
		{"unmapped role", func(m map[string]any) { delete(m["role_stratum"].(map[string]any), "target") }, "role target has a budget but no stratum"},
		{"unbudgeted role", func(m map[string]any) { m["role_stratum"].(map[string]any)["command"] = "target" }, "role command is mapped to stratum \"target\" but has no budget"},
		{"unknown role key", func(m map[string]any) { m["budgets"].(map[string]any)["recipient"] = 0.1 }, `unknown role "recipient"`},
		{"unknown stratum", func(m map[string]any) { m["role_stratum"].(map[string]any)["target"] = "nope" }, `role target is mapped to unknown stratum "nope"`},
		{"looser pool", func(m map[string]any) { stratum(m, 1)["alpha"] = 0.05 }, "role credential (budget 0.01) is enforced by stratum \"pooled\" with the looser budget 0.05"},
		{"counts", func(m map[string]any) { stratum(m, 0)["k"] = 500 }, "counts n=200 violated=10 k=500 inconsistent"},
		{"floor", func(m map[string]any) { stratum(m, 0)["floor"] = 0.5 }, "floor 0.5, want 1/(n+1)"},
		{"certified wrongly", func(m map[string]any) { stratum(m, 1)["certifiable"] = true }, "certifiable with cp_upper"},
		{"delta sum", func(m map[string]any) { stratum(m, 0)["delta"] = 0.049 }, "deltas sum to"},
		{"duplicate stratum", func(m map[string]any) { stratum(m, 1)["name"] = "target" }, `name "target" used twice`},
		{"score kind", func(m map[string]any) { m["score"] = "cosine" }, `unknown similarity kind "cosine"`},
		{"rule", func(m map[string]any) { m["options"].(map[string]any)["rule"] = "magic" }, `unknown threshold rule "magic"`},
		{"budget range", func(m map[string]any) { m["budgets"].(map[string]any)["target"] = 1.0 }, "budget of target: alpha 1 outside [0,1)"},
		{"no created", func(m map[string]any) { delete(m, "created") }, "no creation time"},
		{"sha", func(m map[string]any) {
			m["source"].(map[string]any)["files"].([]any)[0].(map[string]any)["sha256"] = "xyz"
		}, `source "cal.jsonl": sha256 "xyz" is not 64 hex digits`},
		{"ledger alpha", func(m map[string]any) { m["ledger"].(map[string]any)["alpha"] = 0 }, "ledger: alpha 0 outside (0,1)"},
		{"ledger evidence", func(m map[string]any) { m["ledger"].(map[string]any)["evidence"] = "" }, "ledger: no evidence selector"},
		{"ledger unknown key", func(m map[string]any) { m["ledger"].(map[string]any)["weights"] = []int{1} }, `unknown field "weights"`},
		{"unused stratum", func(m map[string]any) {
			s := stratum(m, 0)
			c := map[string]any{}
			for k, v := range s {
				c[k] = v
			}
			c["name"] = "spare"
			s["delta"] = 0.0125
			stratum(m, 1)["delta"] = 0.0125
			c["delta"] = 0.0125
			m["strata"] = append(m["strata"].([]any), c)
		}, `stratum "spare" enforces no role`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeArtifact(bytes.NewReader(mutate(t, tc.fn)), "calib.json")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "calib: calib.json: ") {
				t.Errorf("err %q does not name the file", err)
			}
		})
	}
	good := mutate(t, func(map[string]any) {})
	if _, err := DecodeArtifact(bytes.NewReader(append(good, []byte(" {}")...)), "calib.json"); err == nil || !strings.Contains(err.Error(), "data after the artifact") {
		t.Errorf("trailing data: err = %v", err)
	}
	if _, err := ReadArtifact(filepath.Join(t.TempDir(), "none.json")); err == nil || !strings.Contains(err.Error(), "none.json") {
		t.Errorf("missing file: err = %v", err)
	}
	// WriteArtifact refuses an invalid artifact.
	a := sampleArtifact(t)
	a.Strata[0].Threshold = math.NaN()
	if err := a.WriteArtifact(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "threshold NaN") {
		t.Errorf("WriteArtifact with NaN threshold: err = %v", err)
	}
}

func TestWriteReport(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleArtifact(t).WriteReport(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"STRATUM", "CP-UPPER", "target ", "pooled ", "block-all", "credential", "not certifiable", "202 of 202 records used"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func FuzzReadArtifact(f *testing.F) {
	var buf bytes.Buffer
	if err := sampleArtifact(f).WriteArtifact(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":2,"x":1}`))
	f.Add([]byte(`{"version":1,"strata":[{"threshold":2}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := DecodeArtifact(bytes.NewReader(in), "fuzz.json")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "calib: fuzz.json: ") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		// Accepted artifacts are valid, give the engine a threshold per
		// budgeted role, and survive a round trip.
		e := a.Engine()
		for r := range a.Budgets {
			th, ok := e.Threshold[r]
			if !ok || !(math.IsInf(th, -1) || th >= 0 && th <= 1) {
				t.Fatalf("role %s: engine threshold %v, %v", r, th, ok)
			}
		}
		var out bytes.Buffer
		if err := a.WriteArtifact(&out); err != nil {
			t.Fatalf("WriteArtifact of an accepted artifact: %v", err)
		}
		b, err := DecodeArtifact(&out, "again")
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		if d := cmp.Diff(a, b); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}

// benchFields draws n fields over three roles, about 5% violated.
func benchFields(n int) []FieldRecord {
	rng := rand.New(rand.NewPCG(7, 8))
	roles := []decide.Role{decide.RoleTarget, decide.RoleCredential, decide.RoleCommand, decide.RoleContent}
	f := make([]FieldRecord, n)
	for i := range f {
		v := rng.IntN(20) == 0
		s := rng.Float64() * 0.7
		if v {
			s = 0.3 + rng.Float64()*0.7
		}
		f[i] = FieldRecord{Role: roles[rng.IntN(len(roles))], Score: s, Violated: v, Attacked: v || rng.IntN(3) == 0,
			Episode: "e" + string(rune('a'+i%26)) + string(rune('a'+(i/26)%26)) + string(rune('a'+(i/676)%26))}
	}
	return f
}

func BenchmarkCalibrate1M(b *testing.B) {
	f := benchFields(1_000_000)
	for _, opt := range []struct {
		name string
		o    Options
	}{
		{"field", Options{PoolWith: DefaultPoolWith}},
		{"field-cp", Options{PoolWith: DefaultPoolWith, Rule: RuleCP}},
		{"episode", Options{PoolWith: DefaultPoolWith, Episode: true}},
		{"transfer-episode", Options{Rule: RuleTransfer, Episode: true}},
	} {
		b.Run(opt.name, func(b *testing.B) {
			c := cfg("target=0.01,credential=0.01,command=0.01", 0.05)
			c.Options = opt.o
			for b.Loop() {
				if _, err := Calibrate(f, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAllowed(b *testing.B) {
	a := sampleArtifact(b)
	e := a.Engine()
	scores := []float64{0.1, 0.5, 0.995, 0.7}
	b.Run("artifact", func(b *testing.B) {
		n := 0
		for i := 0; b.Loop(); i++ {
			if a.Allowed(decide.RoleTarget, scores[i&3]) {
				n++
			}
		}
		if n == 0 {
			b.Fatal("nothing allowed")
		}
	})
	b.Run("engine-map", func(b *testing.B) {
		n := 0
		for i := 0; b.Loop(); i++ {
			if th, ok := e.Threshold[decide.RoleTarget]; ok && scores[i&3] <= th {
				n++
			}
		}
		if n == 0 {
			b.Fatal("nothing allowed")
		}
	})
}

func BenchmarkDecodeFields(b *testing.B) {
	var buf bytes.Buffer
	if err := WriteFields(&buf, benchFields(10_000)); err != nil {
		b.Fatal(err)
	}
	in := buf.Bytes()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		if _, err := DecodeFields(bytes.NewReader(in), "bench"); err != nil {
			b.Fatal(err)
		}
	}
}
