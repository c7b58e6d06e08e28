package match

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	cfac "github.com/cloudflare/ahocorasick"
	pdac "github.com/petar-dambovaliev/aho-corasick"
)

var benchOnce = sync.OnceValues(func() ([]string, string) { return benchData(10000, 1<<20, 3) })

// scanBaseline is a further matcher BenchmarkScan1MiB10kTokens compares
// the Index with when its build tag is given (hyperscan_bench_test.go):
// build compiles the normalised tokens and returns a function that counts
// the distinct tokens in already normalised content, and a cleanup.
type scanBaseline struct {
	name  string
	build func(norm []string) (count func(normalised string) (int, error), done func(), err error)
}

// scanBaselines are registered by tagged files' init functions.
var scanBaselines []scanBaseline

// BenchmarkScan1MiB10kTokens scans 1 MiB of mixed effect content (three
// planted hits) against 10,000 sensitive tokens: with the Index (Scan and
// MaxLevel), a naive strings.Contains loop and the two Aho-Corasick
// libraries, and Hyperscan when built with -tags hyperscan. Every variant
// includes the normalisation of the content; the baselines normalise with
// Norm first (they cannot fuse it).
func BenchmarkScan1MiB10kTokens(b *testing.B) {
	toks, body := benchOnce()
	norm := make([]string, len(toks))
	for i, t := range toks {
		norm[i] = Norm(t)
	}
	var x Index
	x.Add("secrets", 1, toks...)
	// The three planted values hit, and so do tokens inside them (the
	// words of a key); every variant must find the same tokens.
	_, hits := x.Scan(body)
	want := len(hits)
	if want < 3 {
		b.Fatalf("Scan found %d hits, want at least the 3 planted", len(hits))
	}
	b.Run("index/Scan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			x.Scan(body)
		}
	})
	clean := benchBody(1<<20, nil)
	b.Run("index/MaxLevel-nohit", func(b *testing.B) {
		b.SetBytes(int64(len(clean)))
		for b.Loop() {
			x.MaxLevel(clean)
		}
	})
	b.Run("index/Scan-nohit", func(b *testing.B) {
		b.SetBytes(int64(len(clean)))
		for b.Loop() {
			x.Scan(clean)
		}
	})
	b.Run("Norm-only", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			Norm(body)
		}
	})
	b.Run("naive-contains", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			nb := Norm(body)
			n := 0
			for _, t := range norm {
				if strings.Contains(nb, t) {
					n++
				}
			}
			if n != want {
				b.Fatalf("naive found %d, index %d", n, want)
			}
		}
	})
	pdb := pdac.NewAhoCorasickBuilder(pdac.Opts{MatchKind: pdac.StandardMatch, DFA: true})
	pd := pdb.Build(norm)
	b.Run("petar-dambovaliev-aho-corasick", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			it := pd.IterOverlapping(Norm(body))
			found := map[int]bool{}
			for m := it.Next(); m != nil; m = it.Next() {
				found[m.Pattern()] = true
			}
			if len(found) != want {
				b.Fatalf("petar found %d, index %d", len(found), want)
			}
		}
	})
	cf := cfac.NewStringMatcher(norm)
	b.Run("cloudflare-ahocorasick", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if n := len(cf.MatchThreadSafe([]byte(Norm(body)))); n != want {
				b.Fatalf("cloudflare found %d, index %d", n, want)
			}
		}
	})
	for _, bl := range scanBaselines {
		count, done, err := bl.build(norm)
		if err != nil {
			b.Fatalf("%s: %v", bl.name, err)
		}
		b.Run(bl.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				n, err := count(Norm(body))
				if err != nil || n != want {
					b.Fatalf("%s found %d (%v), index %d", bl.name, n, err, want)
				}
			}
		})
		done()
	}
}

// BenchmarkScanSmall scans effects of typical request sizes against the
// same 10,000 tokens: the per-call cost.
func BenchmarkScanSmall(b *testing.B) {
	toks, body := benchOnce()
	var x Index
	x.Add("secrets", 1, toks...)
	for _, size := range []int{200, 1 << 10, 16 << 10} {
		c := body[:size]
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			b.SetBytes(int64(len(c)))
			for b.Loop() {
				x.Scan(c)
			}
		})
	}
}

// BenchmarkAdd10kTokens builds an index of 10,000 tokens one Add at a
// time (as reads arrive), from empty.
func BenchmarkAdd10kTokens(b *testing.B) {
	toks, _ := benchOnce()
	for b.Loop() {
		var x Index
		for i := 0; i < len(toks); i += 8 {
			x.Add("secrets", 1, toks[i:min(i+8, len(toks))]...)
		}
		if x.Len() != len(toks) {
			b.Fatalf("Len %d", x.Len())
		}
	}
}

// BenchmarkIndexTruncate rolls back the last 1,000 of 10,000 tokens and
// adds them again.
func BenchmarkIndexTruncate(b *testing.B) {
	toks, _ := benchOnce()
	var x Index
	x.Add("secrets", 1, toks[:9000]...)
	for b.Loop() {
		x.Add("scope", 1, toks[9000:]...)
		x.Truncate(9000)
	}
}

func BenchmarkValueSetContains(b *testing.B) {
	toks, _ := benchOnce()
	var v ValueSet
	v.Add("task", toks...)
	queries := []string{
		toks[17],                            // as added
		Norm(toks[4242]),                    // already normalised
		"https://api.example.com/v1/notify", // absent
		"  " + strings.ToUpper(toks[99]),    // needs normalising
	}
	for _, q := range queries {
		b.Run(fmt.Sprintf("len%d", len(q)), func(b *testing.B) {
			want := v.Contains(q)
			for b.Loop() {
				if v.Contains(q) != want {
					b.Fatal("changed")
				}
			}
		})
	}
}

func BenchmarkExtract(b *testing.B) {
	_, docs := benchSecrets(200)
	secret := strings.Join(docs, "\n")
	task := "Pay the bill in bill.txt to DE89 3704 0044 0532 0130 00 and e-mail the receipt to alice@example.com; see https://bank.example.com/pay?id=42."
	for _, c := range []struct{ name, s string }{
		{"task", task},
		{"secret-docs", secret},
		{"mixed-64KiB", benchBody(64<<10, nil)},
	} {
		b.Run(c.name, func(b *testing.B) {
			var e Extractor
			var dst []string
			b.SetBytes(int64(len(c.s)))
			for b.Loop() {
				dst = e.Append(dst[:0], c.s)
			}
		})
	}
}
