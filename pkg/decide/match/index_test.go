package match

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sameHits compares hits ignoring the order of hits that start at the same
// position (both sides are sorted by offset, then token).
func sameHits(t *testing.T, content string, got, want []Hit) {
	t.Helper()
	norm := func(hs []Hit) []Hit {
		if len(hs) == 0 {
			return nil
		}
		hs = slices.Clone(hs)
		sortStable(hs, func(a, b Hit) bool {
			if a.Offset != b.Offset {
				return a.Offset < b.Offset
			}
			return a.Token < b.Token
		})
		return hs
	}
	for i := 1; i < len(got); i++ {
		if got[i].Offset < got[i-1].Offset {
			t.Errorf("hits out of order: %+v before %+v", got[i-1], got[i])
		}
	}
	if d := cmp.Diff(norm(want), norm(got)); d != "" {
		t.Fatalf("Scan(%q) hits differ from the reference (-want +got):\n%s", trunc(content), d)
	}
}

func trunc(s string) string {
	if len(s) > 300 {
		return s[:300] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

func checkScan(t *testing.T, x *Index, ref *refIndex, content string) {
	t.Helper()
	wantMax, want := ref.scan(content)
	gotMax, got := x.Scan(content)
	sameHits(t, content, got, want)
	if gotMax != wantMax {
		t.Fatalf("Scan(%q) max = %d, want %d", trunc(content), gotMax, wantMax)
	}
	lvl, ok := x.MaxLevel(content)
	if ok != (len(want) > 0) || lvl != wantMax {
		t.Fatalf("MaxLevel(%q) = %d, %v; want %d, %v", trunc(content), lvl, ok, wantMax, len(want) > 0)
	}
}

func TestIndexBasics(t *testing.T) {
	var x Index
	if n := x.Add("read_file:bill.txt", 2, "DE89 3704 0044 0532 0130 00", "short", "hunter2!", "  Project Phoenix  "); n != 3 {
		t.Fatalf("Add added %d tokens, want 3", n)
	}
	st := x.Stats()
	if st.Tokens != 3 || st.Short != 1 {
		t.Fatalf("Stats = %+v, want 3 tokens, 1 short", st)
	}
	max, hits := x.Scan("Please wire to de89370400440532013000 — codename PROJECT\tPHOENIX.")
	want := []Hit{
		{Token: "de89370400440532013000", Level: 2, Origin: "read_file:bill.txt", Offset: 15},
		{Token: "projectphoenix", Level: 2, Origin: "read_file:bill.txt", Offset: 51},
	}
	if d := cmp.Diff(want, hits); d != "" || max != 2 {
		t.Fatalf("Scan: max %d, hits (-want +got):\n%s", max, d)
	}
	if _, ok := x.MaxLevel("nothing to see here, hunter2 alone is not it"); ok {
		t.Fatal("MaxLevel found a token in clean text")
	}
	// The same token at a higher level takes over; at a lower one it is a
	// duplicate.
	if n := x.Add("mail:ceo", 5, "project phoenix"); n != 1 {
		t.Fatalf("re-adding at a higher level added %d", n)
	}
	if n := x.Add("mail:intern", 1, "PROJECTPHOENIX"); n != 0 || x.Stats().Duplicates != 1 {
		t.Fatalf("re-adding at a lower level added %d (stats %+v)", n, x.Stats())
	}
	max, hits = x.Scan("projectphoenix")
	if max != 5 || len(hits) != 1 || hits[0].Origin != "mail:ceo" {
		t.Fatalf("after the higher add: max %d hits %+v", max, hits)
	}
	x.Truncate(3)
	max, hits = x.Scan("projectphoenix")
	if max != 2 || len(hits) != 1 || hits[0].Origin != "read_file:bill.txt" {
		t.Fatalf("after Truncate(3): max %d hits %+v", max, hits)
	}
	x.Truncate(0)
	if _, ok := x.MaxLevel("projectphoenix hunter2!"); ok || x.Len() != 0 {
		t.Fatal("Truncate(0) left tokens behind")
	}
}

func TestIndexTruncatePanicsOutOfRange(t *testing.T) {
	var x Index
	x.Add("o", 1, "abcdefghij")
	for _, n := range []int{-1, 2} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "match: truncate index") {
					t.Errorf("Truncate(%d) recovered %v, want a match: panic", n, r)
				}
			}()
			x.Truncate(n)
		}()
	}
}

func TestIndexMinimumLength(t *testing.T) {
	var x Index
	ref := &refIndex{}
	toks := []string{"abcdefg", "abcdefgh", "ABCD EFGH", "a b c d e f g", "ééééé", "éééé", "İİİİ"}
	x.Add("o", 1, toks...)
	ref.add("o", 1, toks...)
	// Too short after Norm: "abcdefg", "a b c d e f g", and "İİİİ" (8
	// bytes, but it lowers to "iiii"). "éééé" (8 bytes) is kept, "ABCD
	// EFGH" is a duplicate of "abcdefgh".
	if x.Len() != 3 || x.Len() != len(ref.recs) || x.Stats().Short != 3 || x.Stats().Duplicates != 1 {
		t.Fatalf("Len %d (ref %d), stats %+v", x.Len(), len(ref.recs), x.Stats())
	}
	for _, c := range []string{"abcdefg", "xabcdefgx", "abcdefgh", "ÉÉÉÉ", "ééé", "ÉÉÉÉÉ", "a\u00a0bcdefg\u2028h"} {
		checkScan(t, &x, ref, c)
	}
}

// TestIndexScanAgreesWithReference is the property test: on random token
// sets and random content (unicode, every kind of whitespace, tokens
// planted with whitespace inside and case changed, blocks of every size)
// Scan and MaxLevel report exactly what the naive reference reports.
func TestIndexScanAgreesWithReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	iters := 400
	if testing.Short() {
		iters = 60
	}
	for it := range iters {
		alphabet := "abcdefgh0123456789.-@/"[:2+rng.IntN(21)]
		var x Index
		ref := &refIndex{}
		var pool []string
		for range 1 + rng.IntN(60) {
			tok := randText(rng, alphabet, 6+rng.IntN(20))
			if rng.IntN(10) == 0 {
				tok = randText(rng, alphabet, 200+rng.IntN(9000)) // crosses blocks
			}
			pool = append(pool, tok)
			lvl := uint8(rng.IntN(4))
			origin := fmt.Sprintf("src%d", rng.IntN(5))
			if a, b := x.Add(origin, lvl, tok), ref.add(origin, lvl, tok); a != b {
				t.Fatalf("iter %d: Add(%q) added %d, reference %d", it, tok, a, b)
			}
		}
		for range 4 {
			var b strings.Builder
			size := []int{10, 300, 3000, 20000, 70000}[rng.IntN(5)]
			for b.Len() < size {
				if rng.IntN(3) == 0 {
					b.WriteString(sprinkle(rng, pool[rng.IntN(len(pool))]))
				} else {
					b.WriteString(randText(rng, alphabet, 1+rng.IntN(40)))
				}
			}
			checkScan(t, &x, ref, b.String())
		}
		// Roll back part of the index and scan again.
		n := rng.IntN(x.Len() + 1)
		x.Truncate(n)
		ref.recs = ref.recs[:n]
		if x.Len() != n {
			t.Fatalf("Len after Truncate(%d) = %d", n, x.Len())
		}
		var b strings.Builder
		for range 20 {
			b.WriteString(sprinkle(rng, pool[rng.IntN(len(pool))]))
			b.WriteString(randText(rng, alphabet, rng.IntN(10)))
		}
		checkScan(t, &x, ref, b.String())
		// Add again on top of the rolled-back index (its filters may
		// still hold the removed tokens' bits).
		for range rng.IntN(10) {
			tok := pool[rng.IntN(len(pool))]
			lvl := uint8(rng.IntN(5))
			if a, b := x.Add("again", lvl, tok), ref.add("again", lvl, tok); a != b {
				t.Fatalf("iter %d: re-Add(%q) added %d, reference %d", it, tok, a, b)
			}
		}
		checkScan(t, &x, ref, b.String())
	}
}

// TestIndexBlockBoundaries plants tokens at every position around the
// scan's block boundaries, with whitespace before, inside and after them.
func TestIndexBlockBoundaries(t *testing.T) {
	toks := []string{"exactly8", "abcdefghijklmnop", "ZZ" + strings.Repeat("y", 30) + "ZZ", "é€日本語テキスト"}
	long := strings.Repeat("0123456789abcdef", 1300) // 20800 bytes, over two blocks
	var x Index
	ref := &refIndex{}
	x.Add("o", 1, toks...)
	ref.add("o", 1, toks...)
	x.Add("p", 3, long)
	ref.add("p", 3, long)
	filler := strings.Repeat("qrstuvw ", blockSize) // no token q-grams
	for _, bound := range []int{tinyBlockSize, smallBlockSize, blockSize, 2 * blockSize} {
		for d := -40; d <= 8; d++ {
			for _, tok := range toks {
				for _, ws := range []string{"", " ", "\u00a0\n"} {
					pre := strings.Repeat("x", bound+d)
					in := tok[:len(tok)/2] + ws + tok[len(tok)/2:]
					checkScan(t, &x, ref, pre+ws+in+ws+filler[:600])
				}
			}
		}
	}
	// Whitespace before the boundary shifts normalised positions.
	for d := 0; d < 12; d++ {
		c := strings.Repeat(" a", blockSize/2+d) + "Exactly8" + strings.Repeat(" b", 100)
		checkScan(t, &x, ref, c)
	}
	// The long token split by whitespace every few bytes, spanning blocks.
	checkScan(t, &x, ref, "pre "+sprinkle(rand.New(rand.NewPCG(3, 4)), long)+" post")
	checkScan(t, &x, ref, "pre "+long[:len(long)-1])
}

func TestIndexGrowthKeepsTokens(t *testing.T) {
	var x Index
	ref := &refIndex{}
	rng := rand.New(rand.NewPCG(5, 6))
	var toks []string
	for i := range 5000 {
		tok := fmt.Sprintf("tok-%06d-%x", i, rng.Uint32())
		toks = append(toks, tok)
		x.Add("o", uint8(i%7), tok)
		ref.add("o", uint8(i%7), tok)
	}
	content := strings.Join([]string{toks[0], toks[1023], toks[4999], "TOK - 000001"}, " and ")
	checkScan(t, &x, ref, content)
	x.Truncate(1024)
	ref.recs = ref.recs[:1024]
	checkScan(t, &x, ref, content)
}

func TestScanFuncStops(t *testing.T) {
	var x Index
	x.Add("o", 1, "firsttoken", "secondtoken", "thirdtoken")
	calls := 0
	x.ScanFunc("firsttoken secondtoken thirdtoken firsttoken", func(h Hit) bool {
		calls++
		return h.Token != "secondtoken"
	})
	if calls != 2 {
		t.Fatalf("ScanFunc called fn %d times after fn returned false on the 2nd, want 2", calls)
	}
}

func TestMaxLevelStopsAtTop(t *testing.T) {
	var x Index
	x.Add("low", 1, "lowlevel-token")
	x.Add("high", 9, "highlevel-token")
	if top, ok := x.Top(); !ok || top != 9 {
		t.Fatalf("Top = %d, %v", top, ok)
	}
	l, ok := x.MaxLevel("lowlevel-token then highlevel-token then lowlevel-token")
	if !ok || l != 9 {
		t.Fatalf("MaxLevel = %d, %v, want 9", l, ok)
	}
	l, ok = x.MaxLevel("only lowlevel-token")
	if !ok || l != 1 {
		t.Fatalf("MaxLevel = %d, %v, want 1", l, ok)
	}
}

func TestScanDoesNotAllocateWithoutHits(t *testing.T) {
	var x Index
	secrets, body := benchData(1000, 1<<16, 0)
	x.Add("s", 1, secrets...)
	if a := testing.AllocsPerRun(20, func() { x.Scan(body) }); a != 0 {
		t.Fatalf("Scan allocated %.1f times per run on a body without hits", a)
	}
}

func TestIndexIgnore(t *testing.T) {
	common := map[string]bool{"password": true, "customer": true}
	x := Index{Ignore: func(tok string) bool { return common[tok] }}
	x.Add("crm", 2, "Customer", "PASSWORD", "hunter2-secret")
	if x.Len() != 1 || x.Stats().Ignored != 2 {
		t.Fatalf("Len %d, stats %+v; want 1 token, 2 ignored", x.Len(), x.Stats())
	}
	if _, hits := x.Scan("the customer changed the password"); len(hits) != 0 {
		t.Fatalf("ignored tokens hit: %+v", hits)
	}
}
