package match

import (
	"fmt"
	"strings"
	"testing"
)

// Worst-case cost of the matchers on the decision path: adversarial
// 64 KiB contents (every byte a candidate start, long runs without a
// delimiter, near-misses of every pattern), reported in ns per content
// byte next to ordinary prose (docs/fuzzing.md). A matcher whose cost per
// byte grows with the input on one of these is quadratic: each content
// is measured at 16, 64 and 256 KiB.
func worstContents(n int) map[string]string {
	rep := func(s string) string { return strings.Repeat(s, n/len(s)+1)[:n] }
	return map[string]string{
		"prose":             rep("The weekly report is ready; nothing unusual happened this week. "),
		"digits":            rep("0123456789"),
		"spaced digits":     rep("12 "),
		"plus digits":       rep("+1 2"),
		"dots":              rep("."),
		"scheme separators": rep("a://"),
		"at signs":          rep("a@b"),
		"www":               rep("www."),
		"one token":         rep("x"),
		"iban-like":         rep("DE89 3704 0044 0532 0130 00 "),
		"unicode spaces":    rep("a\u00a0b\u2028"),
		"quotes":            rep("'\"`"),
	}
}

func BenchmarkWorstCaseMatchers(b *testing.B) {
	var x Index
	for i := range 10000 {
		x.Add("o", uint8(i%3), fmt.Sprintf("token-%08d-secret", i))
	}
	fns := []struct {
		name string
		fn   func(string)
	}{
		{"Destinations", func(s string) { _ = Destinations(s) }},
		{"Extract", func(s string) { _ = Extract(s) }},
		{"Norm", func(s string) { _ = Norm(s) }},
		{"Scan", func(s string) { _, _ = x.Scan(s) }},
	}
	for _, size := range []int{16 << 10, 64 << 10, 256 << 10} {
		for name, content := range worstContents(size) {
			for _, f := range fns {
				b.Run(fmt.Sprintf("%s/%s/%dKiB", f.name, strings.ReplaceAll(name, " ", "-"), size>>10), func(b *testing.B) {
					b.SetBytes(int64(len(content)))
					for range b.N {
						f.fn(content)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(content)), "ns/B")
				})
			}
		}
	}
}
