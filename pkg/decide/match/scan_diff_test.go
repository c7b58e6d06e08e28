package match

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestScanRealisticAgreesWithReference runs the benchmark's kind of data
// through the filters: tokens extracted from synthetic secret records,
// mixed prose/JSON/log/base64 content with many of them planted (in their
// original spelling, re-cased and with whitespace inserted), at several
// sizes. Scan must report exactly what the naive reference reports, byte
// for byte: the gram and prefix filters may only ever drop candidates
// that cannot match.
func TestScanRealisticAgreesWithReference(t *testing.T) {
	toks, _ := benchSecrets(3000)
	var x Index
	ref := &refIndex{}
	for i, tok := range toks {
		lvl := uint8(1 + i%3)
		if a, b := x.Add("secrets", lvl, tok), ref.add("secrets", lvl, tok); a != b {
			t.Fatalf("Add(%q) added %d, reference %d", tok, a, b)
		}
	}
	rng := rand.New(rand.NewPCG(5, 13))
	for _, size := range []int{100, 600, 9000, 100 << 10} {
		var plant []string
		for range 1 + size/2000 {
			tok := toks[rng.IntN(len(toks))]
			if rng.IntN(2) == 0 {
				tok = sprinkle(rng, tok)
			}
			plant = append(plant, tok)
		}
		body := benchBody(size, plant)
		if _, want := ref.scan(body); len(want) < len(plant) {
			t.Fatalf("%d bytes: the reference finds %d tokens, fewer than the %d planted", size, len(want), len(plant))
		}
		checkScan(t, &x, ref, body)
		checkScan(t, &x, ref, strings.ToUpper(body))
	}
}

// TestScanShortContentAgreesWithReference covers the small buffers short
// content is scanned in: tokens at every position of content under 64 and
// under 512 bytes, split by whitespace, and content whose lower case is
// longer than itself (Ⱥ: 2 bytes, ⱥ: 3), so that its normal form spans
// several fills of the small buffer.
func TestScanShortContentAgreesWithReference(t *testing.T) {
	toks := []string{"exactly8", "abcdefghijklmnop", "ⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥⱥ", "é€日本語テキスト"}
	var x Index
	ref := &refIndex{}
	for i, tok := range toks {
		x.Add("o", uint8(i), tok)
		ref.add("o", uint8(i), tok)
	}
	for _, size := range []int{tinyBlockSize - 1, smallBlockSize - 1} {
		for _, tok := range toks {
			for _, ws := range []string{"", " ", "\u00a0\n"} {
				in := strings.ToUpper(tok[:len(tok)/2]) + ws + tok[len(tok)/2:]
				for pre := 0; pre+len(in) <= size; pre++ {
					c := strings.Repeat("x", pre) + in
					c += strings.Repeat("q", size-len(c))
					checkScan(t, &x, ref, c)
				}
			}
		}
		expand := strings.Repeat("Ⱥ", size/2)
		checkScan(t, &x, ref, expand)
		checkScan(t, &x, ref, expand[:len(expand)-4]+"exactly8")
	}
}
