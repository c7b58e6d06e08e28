package daemon

import (
	"bytes"
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
)

// A read whose bytes could not be read back (the file was replaced or
// removed first: git replacing its index under a mapping) is attributed
// to its path. Only when that path's label is not public are its unknown
// bytes taken to be any of the sensitive content (every sensitive file
// then counts as read, and opaque effects carry the top level for the
// rest of the run); a public file's are not. The soak saw git's index do
// this in ordinary runs.
func TestContentLostOfPublicFile(t *testing.T) {
	testutil.RequireTool(t, "base64")
	for _, tc := range []struct {
		name, lost, script string
		assumed            bool
	}{
		{"public", "notes.txt", `cat notes.txt >/dev/null`, false},
		{"sensitive", "certs/service.pem", `cat certs/service.pem >/dev/null`, true},
		// Public by the policy, secret by what the run wrote to it.
		{"labelled", "derived.txt", `base64 certs/service.pem > derived.txt && cat derived.txt >/dev/null`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work := secretWorkdir(t)
			p, err := decide.ParsePolicy("e2e.yaml", []byte(e2ePolicy))
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			var lost atomic.Int32
			var dm atomic.Pointer[daemon]
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := Config{ID: testutil.UniqueName("e"), StateDir: t.TempDir(), Policy: p, PolicyPath: "e2e.yaml",
				Workdir: work, Task: "Read the file", Argv: []string{"/bin/sh", "-c", tc.script}, UID: sandboxUID, GID: sandboxUID,
				Hosts: map[string][]netip.Addr{}, HoldTimeout: 3 * time.Second, Stdout: &out, Stderr: &out}
			cfg.hooks = &testHooks{started: func(d *daemon) { dm.Store(d) }, fileRecord: func(r *fileev.Record) {
				if r.Kind == fileev.KindSyscall && r.Op == fileev.OpRead && r.Ret > 0 && r.Path == tc.lost {
					r.ContentErr = "test: replaced since the operation"
					lost.Add(1)
				}
			}}
			sum, err := Run(ctx, cfg)
			runEnded(t, ctx, err, out.String())
			if sum.ExitCode != 0 {
				t.Fatalf("the agent exited %d\n%s", sum.ExitCode, out.String())
			}
			if lost.Load() == 0 {
				t.Fatalf("no read of %s was traced\n%s", tc.lost, out.String())
			}
			fc := dm.Load().files
			fc.mu.Lock()
			unattributed, assumed := fc.unattributed, fc.assumed
			fc.mu.Unlock()
			if assumed != tc.assumed || (unattributed > 0) != tc.assumed {
				t.Errorf("%d reads of %s without content: %d unattributed, every sensitive file assumed read %v; want assumed %v\n%s",
					lost.Load(), tc.lost, unattributed, assumed, tc.assumed, out.String())
			}
		})
	}
}
