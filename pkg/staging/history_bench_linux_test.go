package staging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// BenchmarkCommitWithHistory measures one small commit (one labelled
// file) against a committed index of n labelled paths: what a working
// directory's history costs every commit, since a commit rewrites the
// whole index (docs/soak.md: a git repository gains ~15 labelled loose
// objects per agent commit).
func BenchmarkCommitWithHistory(b *testing.B) {
	testutil.RequireRoot(b)
	for _, n := range []int{0, 10_000, 100_000} {
		b.Run(fmt.Sprintf("labels=%d", n), func(b *testing.B) {
			base := b.TempDir()
			w := filepath.Join(base, "w")
			must(b, os.Mkdir(w, 0o755))
			st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
			must(b, err)
			defer st.Close()
			must(b, st.Mount())
			defer st.Unmount()
			idx := make(map[string]indexEntry, n)
			for i := 0; i < n; i++ {
				// The shape of a git object path.
				idx[fmt.Sprintf(".git/objects/%02x/%038x", i%256, i)] = indexEntry{Label: decide.Label{Level: 1}, HasLabel: true}
			}
			st.labels.install(idx, nil)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				p := "f" + strconv.Itoa(i)
				must(b, os.WriteFile(filepath.Join(st.Layout().Merged, p), []byte("x"), 0o644))
				must(b, st.Stage(p, decide.Label{Level: 1}))
				b.StartTimer()
				if res, err := st.Commit(ctx, nil); err != nil || res.Applied != 1 {
					b.Fatalf("commit: %v %+v", err, res)
				}
			}
			b.StopTimer()
			if fi, err := os.Stat(filepath.Join(base, "s", "index")); err == nil {
				b.ReportMetric(float64(fi.Size()), "index-bytes")
			}
		})
	}
}
