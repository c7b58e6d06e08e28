//go:build hyperscan && cgo

package match

import "github.com/carbd/carbd/pkg/decide/match/hsbench"

// Hyperscan (libhyperscan-dev) in BenchmarkScan1MiB10kTokens: the same
// normalised tokens as literals, matched byte for byte in Norm(content)
// like the Index matches them, each reported once.
func init() {
	scanBaselines = append(scanBaselines, scanBaseline{name: "hyperscan", build: func(norm []string) (func(string) (int, error), func(), error) {
		db, err := hsbench.Compile(norm)
		if err != nil {
			return nil, nil, err
		}
		return db.Count, db.Close, nil
	}})
}
