package daemon

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// An intercepted HTTPS request put to the operator is withdrawn when its
// client gives up (curl -m closes its socket while the proxy holds the
// request): the question leaves the operator's list while the sandbox
// still runs, the request is refused as withdrawn and never reaches the
// world.
func TestInterceptWithdrawnQuestion(t *testing.T) {
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 134)
	files := visibleDir(t)
	tw := serveTLSWorld(t, w, files)
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept.yaml", []byte(interceptPolicy))
	if err != nil {
		t.Fatal(err)
	}
	op := decide.NewOperator(time.Minute)
	// The key in the query is uncleared for api: deferred, asked.
	script := `key=$(grep -v -- ----- certs/service.pem)
curl -sS -m 3 -o /dev/null "https://api.example.com/gone-9c1?k=$key"; echo "gone=$?"
while [ ! -e /run/carbd/exit ]; do sleep 0.05; done
`
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, done := runInBackground(ctx, t, Config{ID: testutil.UniqueName("iw"), StateDir: t.TempDir(), Policy: p, PolicyPath: "intercept.yaml",
		Workdir: work, Task: "Fetch https://api.example.com/status", Argv: []string{"/bin/sh", "-c", script},
		UID: sandboxUID, GID: sandboxUID, Oracle: op, Operator: op,
		Hosts:       map[string][]netip.Addr{"api.example.com": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
		Intercept: InterceptConfig{CADir: t.TempDir(), UpstreamCAs: []string{tw.caFile}}}, out)
	var q decide.Pending
	waitWithdraw(t, 30*time.Second, "the question", func() bool {
		for _, x := range op.Pending() {
			if strings.Contains(x.Summary, "gone-9c1") {
				q = x
				return true
			}
		}
		return false
	}, out)
	waitWithdraw(t, 30*time.Second, "the withdrawal", func() bool {
		for _, x := range op.Withdrawals(time.Time{}) {
			if x.ID == q.ID {
				if x.Reason != "the intercepted connection closed" && x.Reason != "the client closed its socket" {
					t.Errorf("withdrawn: %+v", x)
				}
				return true
			}
		}
		return false
	}, out)
	if len(op.Pending()) != 0 {
		t.Errorf("pending after the withdrawal: %+v", op.Pending())
	}
	if err := os.WriteFile(filepath.Join(d.dir, "agent", "exit"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("run: %v\n%s", r.err, out.String())
	}
	var refused bool
	for _, dec := range r.sum.Refused {
		if dec.Seq == q.ID && dec.Reason.Code == decide.CodeOracleWithdrawn {
			refused = true
		}
	}
	if !refused {
		t.Errorf("the request was not refused as withdrawn: %+v\n%s", r.sum.Refused, out.String())
	}
	for _, req := range tw.requests() {
		if strings.Contains(req, "gone-9c1") {
			t.Errorf("the world received %q", req)
		}
	}
}

// runResult is what Run returned.
type runResult struct {
	sum *Summary
	err error
}

// runInBackground runs cfg until ctx ends and returns its daemon once it
// has started; Run's result arrives on the channel. A run that ends
// before it started fails the test with its output.
func runInBackground(ctx context.Context, t *testing.T, cfg Config, out *syncBuffer) (*daemon, <-chan runResult) {
	t.Helper()
	var d *daemon
	started := make(chan struct{})
	done := make(chan runResult, 1)
	cfg.hooks = &testHooks{started: func(x *daemon) { d = x; close(started) }}
	go func() {
		sum, err := Run(ctx, cfg)
		done <- runResult{sum, err}
	}()
	select {
	case <-started:
	case r := <-done:
		t.Fatalf("run ended: %v\n%s", r.err, out.String())
	}
	return d, done
}

func waitWithdraw(t *testing.T, limit time.Duration, what string, cond func() bool, out *syncBuffer) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s\n%s", what, out.String())
		}
		time.Sleep(30 * time.Millisecond)
	}
}
