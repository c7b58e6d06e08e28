package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

func newTestSupervisor(t *testing.T) (*supervisor, *[]*ComponentError) {
	t.Helper()
	var mu sync.Mutex
	var calls []*ComponentError
	s := newSupervisor(slog.New(slog.NewTextHandler(io.Discard, nil)), func(cf *ComponentError) {
		mu.Lock()
		calls = append(calls, cf)
		mu.Unlock()
	})
	return s, &calls
}

// The first failure, an error or a return while the run goes on, ends
// the run; a return after the component's teardown or the run's end
// does not.
func TestSupervisor(t *testing.T) {
	boom := errors.New("netlink socket closed")
	for _, tc := range []struct {
		name    string
		run     func(s *supervisor, ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup)
		want    string // the failing component; "" none
		wantErr error
	}{
		{"error", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "verdict-loop", func(context.Context) error { return boom })
		}, "verdict-loop", boom},
		{"returns while the run goes on", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "tc-lease", func(context.Context) error { return nil })
		}, "tc-lease", errReturned},
		{"its own context ends (killed)", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "response-watcher", func(ctx context.Context) error { <-ctx.Done(); return nil })
			s.stop("response-watcher")
		}, "response-watcher", errKilled},
		{"teardown", func(s *supervisor, ctx context.Context, cancel context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "file-tracer", func(ctx context.Context) error { <-ctx.Done(); return errors.New("fileev: closed") })
			cancel()
		}, "", nil},
		{"never started", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "verdict-loop", func(context.Context) error { return fmt.Errorf("nfq: open queue 7: %w", errNotStarted) })
		}, "", nil},
		{"after the run ended", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.end()
			s.Go(wg, ctx, "metrics-server", func(context.Context) error { return boom })
		}, "", nil},
		{"the first failure only", func(s *supervisor, ctx context.Context, _ context.CancelFunc, wg *sync.WaitGroup) {
			s.Go(wg, ctx, "interception-proxy", func(context.Context) error { return boom })
			wg.Wait()
			s.Go(wg, ctx, "metrics-textfile", func(context.Context) error { return errors.New("disk full") })
		}, "interception-proxy", boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, calls := newTestSupervisor(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			tc.run(s, ctx, cancel, &wg)
			wg.Wait()
			cf := s.Err()
			if tc.want == "" {
				if cf != nil || len(*calls) != 0 {
					t.Fatalf("failure %v, onFail calls %d; want none", cf, len(*calls))
				}
				select {
				case <-s.Failed():
					t.Fatal("Failed is closed")
				default:
				}
				return
			}
			if cf == nil {
				t.Fatal("no failure")
			}
			if cf.Component != tc.want || !errors.Is(cf, tc.wantErr) {
				t.Errorf("failure %v, want component %s with %v", cf, tc.want, tc.wantErr)
			}
			if !strings.HasPrefix(cf.Error(), "component "+tc.want+" failed: ") {
				t.Errorf("error text %q", cf.Error())
			}
			if len(*calls) != 1 || (*calls)[0] != cf {
				t.Errorf("onFail called %d times", len(*calls))
			}
			select {
			case <-s.Failed():
			default:
				t.Error("Failed is not closed")
			}
		})
	}
}

// After a failure a resolution releases nothing, and the summary names
// the component first.
func TestFailedResolutionAndSummary(t *testing.T) {
	cf := &ComponentError{Component: "verdict-loop", Err: errors.New("nfq: queue 7: receive: use of closed network connection")}
	r := &decide.Resolution{Scope: 3, Committed: true, Effects: []decide.Decision{
		{Seq: 1, Verdict: decide.Release}, {Seq: 2, Verdict: decide.Refuse, Reason: decide.Reason{Code: "uncleared"}}}}
	fr := failedResolution(r, cf)
	if fr.Committed || fr.Effects[0].Verdict != decide.Refuse || fr.Effects[0].Reason.Code != codeComponentFailed || fr.Effects[1].Reason.Code != "uncleared" {
		t.Errorf("failed resolution: %+v", fr)
	}
	if r.Effects[0].Verdict != decide.Release {
		t.Error("failedResolution changed its argument")
	}
	var b strings.Builder
	(&Summary{ID: "x", ExitCode: 137, Failed: cf, Refused: fr.Effects}).WriteSummary(&b)
	out := b.String()
	if !strings.HasPrefix(out, "\ncarbd: component verdict-loop failed: nfq: queue 7") || !strings.Contains(out, "held effects refused, staged changes kept staged") {
		t.Errorf("summary:\n%s", out)
	}
}

// carbd status names the failed component while the run ends.
func TestStatusTextFailure(t *testing.T) {
	now := time.Date(2026, 12, 1, 16, 0, 0, 0, time.UTC)
	st := SandboxStatus{ID: "w1", Backend: "netns", State: "failed", Started: now.Add(-time.Minute),
		Failure: &FailureStatus{Component: "tc-lease", Error: "tcx: write config: bad file descriptor", At: now.Add(-1500 * time.Millisecond)}}
	var b strings.Builder
	WriteText(&b, []SandboxStatus{st}, now)
	out := b.String()
	for _, want := range []string{"sandbox w1  netns  pid 0  FAILED", "  FAILED   component tc-lease: tcx: write config: bad file descriptor (1.5s ago): the run ends closed"} {
		if !strings.Contains(out, want) {
			t.Errorf("status text lacks %q:\n%s", want, out)
		}
	}
	st.State, st.Failure = "running", nil
	b.Reset()
	WriteText(&b, []SandboxStatus{st}, now)
	if strings.Contains(b.String(), "FAILED") {
		t.Errorf("a running sandbox's status says FAILED:\n%s", b.String())
	}
}
