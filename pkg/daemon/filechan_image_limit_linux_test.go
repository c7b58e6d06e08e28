package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/staging"
)

// Config.StagedContentLimit bounds what one decision is shown of a
// staged change: a value that cannot be honoured is refused; a file
// larger than the bound stays staged, reported, never committed, and
// the same file under the default bound is committed.

func TestValidateStagedContentLimit(t *testing.T) {
	for _, tc := range []struct {
		n  int
		ok bool
	}{
		{0, true}, {MinStagedContentLimit, true}, {staging.DefaultContentLimit, true}, {MaxStagedContentLimit, true},
		{-1, false}, {MinStagedContentLimit - 1, false}, {MaxStagedContentLimit + 1, false},
	} {
		c := Config{Workdir: t.TempDir(), Policy: &decide.Policy{}, Argv: []string{"true"}, StateDir: t.TempDir(), StagedContentLimit: tc.n}
		err := c.validate()
		bad := err != nil && strings.Contains(err.Error(), "staged content limit")
		if bad == tc.ok {
			t.Errorf("StagedContentLimit %d: %v", tc.n, err)
		}
	}
}

// TestStagedContentLimitKeepsStaged: big.txt (100,000 bytes) written by
// the agent: with the bound at 64 KiB it is not decided, stays staged and
// is reported; with the default bound it is committed.
func TestStagedContentLimitKeepsStaged(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		limit     int
		committed bool
	}{{MinStagedContentLimit, false}, {0, true}} {
		work := workdir(t)
		testutil.Run(t, "chown", "-R", fmt.Sprint(sandboxUID), work)
		pol, err := decide.ParsePolicy("limit.yaml", []byte(e2ePolicy))
		if err != nil {
			t.Fatal(err)
		}
		var out syncBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		sum, err := Run(ctx, Config{ID: testutil.UniqueName("l"), StateDir: t.TempDir(), Policy: pol, PolicyPath: "limit.yaml",
			Workdir: work, Task: "Write big.txt", Argv: []string{"/bin/sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a > big.txt"},
			UID: sandboxUID, GID: sandboxUID, HoldTimeout: 3 * time.Second, StagedContentLimit: tc.limit, Stdout: &out, Stderr: &out})
		runEnded(t, ctx, err, out.String())
		cancel()
		b, rerr := os.ReadFile(filepath.Join(work, "big.txt"))
		got := rerr == nil && bytes.Equal(b, bytes.Repeat([]byte("a"), 100000))
		if got != tc.committed {
			t.Errorf("limit %d: big.txt committed %v, want %v (%d bytes, %v)\n%s", tc.limit, got, tc.committed, len(b), rerr, out.String())
		}
		reported := slices.ContainsFunc(sum.FileRefusals, func(r string) bool {
			return strings.Contains(r, `"big.txt": not decided, kept staged`)
		})
		if reported == tc.committed {
			t.Errorf("limit %d: big.txt reported as kept staged %v, want %v: %q", tc.limit, reported, !tc.committed, sum.FileRefusals)
		}
	}
}
