package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// With a policy that defers file writes to the operator, a write the
// operator approved is not asked about again at its commit point when
// the file's image proves the staged content is exactly what the
// approved writes produced (coveringOracle); a file changed after the
// approval in a way its records do not show (a shared mapping, a write
// the tracer did not capture whole) is asked about again.

// approvePolicy defers every write whose content is not derivable from
// the task to the oracle (the operator), and refuses digestSecret in
// report.md.
const approvePolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - {name: no-key-in-report, paths: ["report.md"], values: ["` + digestSecret + `"]}
operations:
  - {ops: ["file:write"], kind: stageable, gate: [content]}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// approveAgent writes report.md as MODE says (split: SECRET, in two
// writes that each hold half of it).
const approveAgent = `
import mmap, os
fd = os.open("report.md", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
if MODE == "big":
    os.write(fd, REPORT + b"x" * (1 << 20))
elif MODE == "split":
    os.write(fd, SECRET[:10])
    os.write(fd, SECRET[10:])
else:
    os.write(fd, REPORT)
if MODE == "mmap":
    m = mmap.mmap(fd, len(REPORT), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[:] = REPORT.upper()
    m.close()
os.close(fd)
`

// TestOperatorAskedOnceProved: report.md written in one captured write:
// the operator is asked once (the write), not again at its commit point,
// and report.md is committed.
func TestOperatorAskedOnceProved(t *testing.T) {
	asks, work, out := runApprove(t, "plain")
	if asks != 1 {
		t.Errorf("the operator was asked %d times about report.md, want once\n%s", asks, out)
	}
	if !strings.Contains(out, "covered by the approval of #") {
		t.Errorf("the decision log does not say which approval covered report.md's commit\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(work, "report.md")); err != nil || string(b) != imageReport {
		t.Errorf("report.md in W is %q (%v), want it committed", b, err)
	}
}

// TestOperatorAskedAgainMapped: report.md written, then changed through
// a shared mapping (no record): asked again at its commit point, on the
// content the mapping left.
func TestOperatorAskedAgainMapped(t *testing.T) {
	asks, work, out := runApprove(t, "mmap")
	if asks != 2 {
		t.Errorf("the operator was asked %d times about report.md, want twice\n%s", asks, out)
	}
	if b, err := os.ReadFile(filepath.Join(work, "report.md")); err != nil || string(b) != strings.ToUpper(imageReport) {
		t.Errorf("report.md in W is %q (%v), want the mapped content committed", b, err)
	}
}

// TestOperatorAskedAgainUncaptured: report.md written in one write past
// the tracer's capture (the operator saw its first bytes): asked again
// at its commit point.
func TestOperatorAskedAgainUncaptured(t *testing.T) {
	asks, _, out := runApprove(t, "big")
	if asks != 2 {
		t.Errorf("the operator was asked %d times about report.md, want twice\n%s", asks, out)
	}
}

// TestOperatorApprovalNeverCoversRefusal: report.md written in two
// captured writes, each half of the value a refusal rule forbids as
// report.md's content, each approved by the operator: the whole file,
// proved by its image, is refused at its commit point by the rule (no
// approval covers a refusal), and nothing reaches W.
func TestOperatorApprovalNeverCoversRefusal(t *testing.T) {
	_, work, out := runApprove(t, "split")
	if _, err := os.Stat(filepath.Join(work, "report.md")); err == nil {
		t.Errorf("report.md, holding the forbidden value, was committed\n%s", out)
	}
	if !strings.Contains(out, "no-key-in-report") {
		t.Errorf("the rule did not refuse report.md\n%s", out)
	}
}

// runApprove runs approveAgent in mode while a client of the operator
// socket approves every question; it returns how many questions about
// report.md were asked, W and the run's output followed by its decision
// log.
func runApprove(t *testing.T, mode string) (int, string, string) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "python3")
	work := workdir(t)
	testutil.Run(t, "chown", "-R", fmt.Sprint(sandboxUID), work)
	pol, err := decide.ParsePolicy("approve.yaml", []byte(approvePolicy))
	if err != nil {
		t.Fatal(err)
	}
	op := decide.NewOperator(2 * time.Minute)
	var out syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	state := t.TempDir()
	id := testutil.UniqueName("o")
	script := fmt.Sprintf("MODE = %q\nREPORT = %q.encode()\nSECRET = %q.encode()\n", mode, imageReport, digestSecret) + approveAgent
	cfg := Config{ID: id, StateDir: state, Policy: pol, PolicyPath: "approve.yaml",
		Workdir: work, Task: "Write report.md", Argv: []string{"/usr/bin/python3", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Oracle: op, Operator: op, HoldTimeout: 3 * time.Second, Stdin: io.MultiReader(), Stdout: &out, Stderr: &out, AuditPath: filepath.Join(state, "audit.jsonl"),
		Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	// The operator: approves every question over the socket, counting
	// those about report.md.
	c := Client{Path: filepath.Join(state, "sandboxes", id, "operator.sock")}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	asked := map[uint64]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if resp, err := c.Do(Request{Cmd: "held"}, nil); err == nil {
				for _, h := range resp.Held {
					mu.Lock()
					seen := asked[h.ID]
					if h.Pending && !seen && h.Obj == "report.md" {
						asked[h.ID] = true
					}
					mu.Unlock()
					if h.Pending && !seen {
						_, _ = c.Do(Request{Cmd: "approve", ID: h.ID, Justification: "test operator"}, nil)
					}
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	_, err = Run(ctx, cfg)
	close(stop)
	wg.Wait()
	log := out.String()
	runEnded(t, ctx, err, log)
	if strings.Contains(log, "file events were lost or malformed") {
		t.Fatalf("not tested: events were lost\n%s", log)
	}
	audit, err := os.ReadFile(cfg.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return len(asked), work, log + string(audit)
}
