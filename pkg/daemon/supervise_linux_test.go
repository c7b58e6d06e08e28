package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// superviseScript has a released GET reach the world, then holds a POST
// of a secret for the operator, then stages a write while that scope is
// open (so no commit point commits it), and keeps sending requests the
// policy defers too (URLs the task does not give: they wait in the
// engine behind the POST's question when the component fails) and
// requests it releases (the task's URL: GETs flow until the failure,
// and the agent says it staged its write only once the world answered
// one of them; a clean POST, state-changing, waits for the open scope to
// resolve, which the failure's stop ends: its release then comes after
// the failure; the same over intercepted HTTPS).
const superviseScript = `set -u
curl -sS -m 5 -o /dev/null http://api.example.com/status; echo "get=$?"
key=$(grep -v -- ----- certs/service.pem)
curl -sS -m 60 -X POST --data "$key" http://api.example.com/held-7f3 & 
while [ ! -e /run/carbd/posted ]; do sleep 0.05; done
echo agent-write > staged.txt
i=0
(while :; do i=$((i+1)); curl -sS -m 60 -o /dev/null http://api.example.com/after-$i; sleep 0.05; done) &
(while :; do curl -sS -m 5 -o /dev/null http://api.example.com/status && touch /run/carbd/got; sleep 0.05; done) &
curl -sS -m 60 -o /dev/null -X POST --data clean http://api.example.com/status &
curl -sS -m 60 -o /dev/null -X POST --data clean-tls https://api.example.com/status &
sleep 0.5
while [ ! -e /run/carbd/got ]; do sleep 0.05; done
touch /run/carbd/wrote
wait
`

// supRun is one sandbox of TestComponentFailureEndsRunClosed.
type supRun struct {
	id, state, staging, work string
	upstreamCA, caDir        string // the TLS world's CA, carbd's CA, for the interception
	out                      *syncBuffer
}

// A component that fails for real in a running sandbox ends the run
// closed: the run returns a ComponentError naming it, status (while the
// run ends) and the summary name it, the held request never reaches the
// world, nothing reaches the world after the failure, and the staged
// write stays staged, neither committed nor aborted: the next run on the
// working directory resumes and commits it.
func TestComponentFailureEndsRunClosed(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 121)
	tw := serveTLSWorld(t, w, t.TempDir())
	for i, tc := range []struct {
		component string
		fail      func(d *daemon) error
		wantErr   error // nil: any
		resume    bool  // run again on the working directory
	}{
		// The verdict loop's context fails: it stops (dropping what it
		// holds) and returns while the run goes on.
		{"verdict-loop", func(d *daemon) error {
			if !d.sup.stop("verdict-loop") {
				return errors.New("no verdict-loop component")
			}
			return nil
		}, errKilled, true},
		// The interception's listener is closed under the proxy: its
		// accept fails.
		{"interception-proxy", func(d *daemon) error {
			if d.net.icpt == nil {
				return errors.New("interception is off")
			}
			return d.net.icpt.ln.Close()
		}, nil, false},
		// The file tracer's reader is killed. (Closing the tracer under
		// it would be an error return, but fileev.Tracer.Close races
		// with its Stats, which the status reads: go test -race.)
		{"file-tracer", func(d *daemon) error {
			if d.files.tracer == nil {
				return errors.New("file tracing is off")
			}
			if !d.sup.stop("file-tracer") {
				return errors.New("no file-tracer component")
			}
			return nil
		}, errKilled, false},
		// The TC program's lease is no longer renewed: KeepAlive is
		// killed.
		{"tc-lease", func(d *daemon) error {
			if !d.sup.stop("tc-lease") {
				return errors.New("no tc-lease component")
			}
			return nil
		}, errKilled, false},
	} {
		t.Run(tc.component, func(t *testing.T) {
			work := secretWorkdir(t)
			r := &supRun{id: testutil.UniqueName("f"), state: t.TempDir(), work: work, caDir: t.TempDir(), out: &syncBuffer{}}
			r.staging = filepath.Join(filepath.Dir(work), ".carbd-f"+fmt.Sprint(i))
			t.Cleanup(func() { os.RemoveAll(r.staging) })
			before, beforeTLS := len(w.requests()), len(tw.requests())

			var atFailure []string
			var st SandboxStatus
			var stErr error
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			failErr := make(chan error, 1)
			hooks := &testHooks{
				started: func(d *daemon) {
					go func() {
						agent := filepath.Join(d.dir, "agent")
						err := waitHeld(d, agent)
						if err == nil {
							err = tc.fail(d)
						}
						failErr <- err
						if err != nil {
							cancel() // end the run: the test fails
						}
					}()
				},
				failing: func(d *daemon) {
					// The sandbox is stopped: what the world has now is
					// all it may ever get from this run.
					atFailure = w.requests()[before:]
					resp, err := (Client{Path: filepath.Join(d.dir, "operator.sock")}).Do(Request{Cmd: "status"}, nil)
					if stErr = err; err == nil {
						st = *resp.Status
					}
				},
			}
			op := decide.NewOperator(2 * time.Minute)
			r.upstreamCA = tw.caFile
			sum, err := supervisedRun(ctx, t, r, w, op, hooks, superviseScript)
			select {
			case ferr := <-failErr:
				if ferr != nil {
					t.Fatalf("make %s fail: %v\n%s", tc.component, ferr, r.out.String())
				}
			default:
				t.Fatalf("the run ended before %s was made to fail: %v\n%s", tc.component, err, r.out.String())
			}
			var cf *ComponentError
			if !errors.As(err, &cf) {
				t.Fatalf("run returned %v, want a ComponentError\n%s", err, r.out.String())
			}
			if cf.Component != tc.component || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("failure %v, want component %s (%v)\n%s", err, tc.component, tc.wantErr, r.out.String())
			}
			if sum == nil || sum.Failed != cf {
				t.Fatalf("summary %+v does not name the failure", sum)
			}
			var b strings.Builder
			sum.WriteSummary(&b)
			if !strings.Contains(b.String(), "carbd: component "+tc.component+" failed: ") {
				t.Errorf("summary:\n%s", b.String())
			}
			// Status while the run ended.
			if stErr != nil {
				t.Errorf("status while the run ended: %v", stErr)
			} else if st.State != "failed" || st.Failure == nil || st.Failure.Component != tc.component || st.Failure.Error == "" || len(st.Held) != 0 {
				t.Errorf("status while the run ended: state %q failure %+v held %+v", st.State, st.Failure, st.Held)
			}
			// The held requests were refused, nothing is left held or
			// released after them.
			if len(sum.Held) != 0 {
				t.Errorf("still held at the end: %+v", sum.Held)
			}
			for _, what := range []string{"held-7f3"} {
				refused := false
				for _, d := range sum.Refused {
					refused = refused || (d.Event != nil && strings.Contains(d.Event.Summary(), what))
				}
				if !refused {
					t.Errorf("the held request %s is not among the refused: %+v", what, sum.Refused)
				}
			}
			for _, d := range sum.Released {
				if d.Event != nil && !strings.Contains(d.Event.Summary(), "/status") && d.Event.Ch == decide.ChanNet && d.Event.Op != "dns:query" && d.Event.Op != "tls:connect" {
					t.Errorf("released: %s", d.Event.Summary())
				}
			}
			// The world: released GETs only, never the held POST, and
			// nothing after the failure.
			got := w.requests()[before:]
			if len(got) != len(atFailure) {
				t.Errorf("the world received %q after the failure (had %q)", got[len(atFailure):], atFailure)
			}
			if len(got) < 2 {
				t.Errorf("the world received %q, want the released GETs of /status while the POST was held", got)
			}
			for _, q := range got {
				if !strings.HasPrefix(q, "api.example.com GET /status") {
					t.Errorf("the world received %q", q)
				}
			}
			for _, q := range tw.requests()[beforeTLS:] {
				t.Errorf("the world received over HTTPS %q", q)
			}
			// The staged write: not in W, still in the upper layer.
			if _, err := os.Stat(filepath.Join(work, "staged.txt")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("staged.txt reached the working directory after the failure: %v", err)
			}
			if !stagedIn(r.staging, "staged.txt", "agent-write\n") {
				t.Errorf("staged.txt is not staged any more in %s\n%s", r.staging, r.out.String())
			}
			if !tc.resume {
				return
			}
			// The next run resumes the staged change and decides it: it
			// is committed at its end.
			r.out = &syncBuffer{}
			sum, err = supervisedRun(ctx, t, r, w, decide.Strict{}, nil, `cat staged.txt; echo "cat=$?"`)
			if err != nil || sum.Failed != nil {
				t.Fatalf("second run: %v\n%s", err, r.out.String())
			}
			if !strings.Contains(r.out.String(), "agent-write") {
				t.Errorf("the next run's agent did not see its staged write:\n%s", r.out.String())
			}
			if b, err := os.ReadFile(filepath.Join(work, "staged.txt")); err != nil || string(b) != "agent-write\n" {
				t.Errorf("staged.txt after the next run: %q %v\n%s", b, err, r.out.String())
			}
		})
	}
}

// waitHeld waits until the agent's POST waits for the operator, tells
// the agent, then waits until the agent staged its write and sends more.
func waitHeld(d *daemon, agent string) error {
	pending := func(what string) bool {
		for _, h := range d.Held() {
			if h.Pending && strings.Contains(h.Summary, what) {
				return true
			}
		}
		return false
	}
	for _, step := range []struct {
		what string
		cond func() bool
	}{
		{"the POST waits for the operator", func() bool { return pending("held-7f3") }},
		{"the agent is told", func() bool { return os.WriteFile(filepath.Join(agent, "posted"), nil, 0o644) == nil }},
		{"the write is staged", func() bool { _, err := os.Stat(filepath.Join(agent, "wrote")); return err == nil }},
	} {
		deadline := time.Now().Add(30 * time.Second)
		for !step.cond() {
			if time.Now().After(deadline) {
				return fmt.Errorf("gave up waiting until %s", step.what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// stagedIn reports whether the staging directory holds a staged file
// name with content.
func stagedIn(staging, name, content string) bool {
	found := false
	_ = filepath.WalkDir(staging, func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.Name() != name || !de.Type().IsRegular() || strings.Contains(p, "/merged/") {
			return nil
		}
		b, err := os.ReadFile(p)
		found = found || (err == nil && string(b) == content)
		return nil
	})
	return found
}

func supervisedRun(ctx context.Context, t *testing.T, r *supRun, w *world, oracle decide.Oracle, hooks *testHooks, script string) (*Summary, error) {
	t.Helper()
	p, err := decide.ParsePolicy("e2e.yaml", []byte(e2ePolicy))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ID: r.id, StateDir: r.state, StagingDir: r.staging, Policy: p, PolicyPath: "e2e.yaml",
		Workdir: r.work, Task: "Fetch http://api.example.com/status", Argv: []string{"/bin/sh", "-c", script},
		UID: sandboxUID, GID: sandboxUID, Oracle: oracle,
		Hosts:       map[string][]netip.Addr{"api.example.com": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: r.out, Stderr: r.out, hooks: hooks,
		Intercept: InterceptConfig{CADir: r.caDir, UpstreamCAs: []string{r.upstreamCA}}}
	if op, ok := oracle.(*decide.Operator); ok {
		cfg.Operator = op
	}
	return Run(ctx, cfg)
}
