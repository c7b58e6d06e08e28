package match

import (
	"math/rand/v2"
	"strings"
	"testing"
)

var normCases = []string{
	"", "a", "A", " ", "Hello, World", "  DE89 3704\t0044\n0532 0130 00  ",
	"ALREADY lower", "already-normal", "Straße", "İSTANBUL", "KELVIN K", "ȺȾ",
	"ΣΑΣ ς", "日本 語", "\u00a0nbsp\u2028ls\u3000ideo\u0085nel", "\xff\xfe bad \xe2\x82 utf8 \xc0\xaf",
	"\ufffd", "tab\there\vvt\fff\rcr", "\x00\x01\x1f\x7f controls",
	strings.Repeat("Mixed Case Words With Spaces ", 40), strings.Repeat("x", 1000) + " Y",
}

func checkNorm(t *testing.T, s string) {
	t.Helper()
	want := normRef(s)
	if got := Norm(s); got != want {
		t.Fatalf("Norm(%q) = %q, want %q", s, got, want)
	}
	if got := IsNorm(s); got != (want == s) {
		t.Fatalf("IsNorm(%q) = %v, want %v", s, got, want == s)
	}
	if Norm(want) != want {
		t.Fatalf("Norm is not idempotent on %q", s)
	}
	// The block normaliser at every fill limit agrees with Norm.
	for _, limit := range []int{1, 7, 16, 33} {
		buf := make([]byte, limit+fillSlack)
		var b strings.Builder
		for i := 0; i < len(s); {
			var n int
			n, i = normFill(buf, 0, limit, s, i)
			b.Write(buf[:n])
		}
		if b.String() != want {
			t.Fatalf("normFill(limit %d) on %q = %q, want %q", limit, s, b.String(), want)
		}
	}
}

// withPureGo runs f with the vector kernel off (where there is one), so
// both paths of the normaliser are tested on every machine that has it.
func withPureGo(t *testing.T, f func(t *testing.T)) {
	t.Run("vector="+map[bool]string{true: "on", false: "off"}[useSSSE3], f)
	if useSSSE3 {
		useSSSE3 = false
		defer func() { useSSSE3 = true }()
		t.Run("vector=off", f)
	}
}

func TestNormMatchesReference(t *testing.T) {
	withPureGo(t, func(t *testing.T) {
		for _, s := range normCases {
			checkNorm(t, s)
		}
		rng := rand.New(rand.NewPCG(11, 12))
		for range 3000 {
			checkNorm(t, randText(rng, "aBcD19 -./@xyzXYZ", rng.IntN(90)))
		}
	})
}

func TestNormReturnsNormalInputItself(t *testing.T) {
	s := strings.Repeat("already.normal-value_42/", 20)
	if a := testing.AllocsPerRun(100, func() { _ = Norm(s) }); a != 0 {
		t.Fatalf("Norm allocated %.0f times on a normal string", a)
	}
	if a := testing.AllocsPerRun(100, func() { _ = Norm("Not Normal") }); a != 1 {
		t.Fatalf("Norm allocated %.0f times on a short string, want 1", a)
	}
}

func TestCompress(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range 10000 {
		b := []byte(randText(rng, "ab ", 8) + "xxxxxxxx")[:8]
		for i := range b {
			b[i] &= 0x7f
		}
		w := load64(string(b), 0)
		_, _, ws := classify(w)
		var want []byte
		for i, c := range b {
			if ws>>(8*i+7)&1 == 0 {
				want = append(want, c)
			}
		}
		got := compress(w, ws)
		for i, c := range want {
			if byte(got>>(8*i)) != c {
				t.Fatalf("compress(%q) = %x, want bytes %q", b, got, want)
			}
		}
	}
}
