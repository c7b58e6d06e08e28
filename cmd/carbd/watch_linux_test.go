package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// carbd watch shows the operator's questions as they arrive and takes
// the answers from its input: a request fetched twice on its own is one
// question at a time, "Y" answers it for the run (the second fetch is
// released without a question), "n" refuses another; the audit records
// who answered and when.
func TestCLIWatch(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 84)
	work := cliWorkdir(t)
	r := startRun(t, bin, w, work, `
curl -sS -m 30 -o /dev/null -w "first=%{http_code} " http://api.example.com/watch-5e1; echo
curl -sS -m 30 -o /dev/null -w "again=%{http_code} " http://api.example.com/watch-5e1; echo
curl -sS -m 30 http://api.example.com/other-5e1; echo "other=$?"
wait_for exit
`, "--oracle", "operator", "--operator-timeout", "30s")

	cmd := exec.Command(bin, "watch", "--state-dir", r.state, "--sandbox", r.id, "--interval", "100ms")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	prompts := make(chan string, 8)
	go func() {
		br := bufio.NewReader(outPipe)
		var block strings.Builder
		for {
			s, err := br.ReadString(' ')
			block.WriteString(s)
			if strings.HasSuffix(block.String(), "[y/n/Y/N/s/q] ") {
				prompts <- block.String()
				block.Reset()
			}
			if err != nil {
				close(prompts)
				return
			}
		}
	}()
	next := func(want string) {
		t.Helper()
		select {
		case p := <-prompts:
			if !strings.Contains(p, want) {
				t.Fatalf("question %q, want one about %s", p, want)
			}
		case <-time.After(40 * time.Second):
			t.Fatalf("no question about %s:\n%s", want, r.diagnostics())
		}
	}
	next("watch-5e1")
	io.WriteString(in, "Y\n")
	next("other-5e1")
	io.WriteString(in, "n\n")
	waitFor(t, 30*time.Second, "the agent's three fetches", r.out, func() bool { return strings.Contains(r.out.String(), "other=") })
	io.WriteString(in, "q\n")
	agent := r.out.String()
	if !strings.Contains(agent, "first=200") || !strings.Contains(agent, "again=200") || strings.Contains(agent, "other=0") {
		t.Errorf("agent:\n%s", agent)
	}
	r.tell(t, "exit")
	if code := r.waitExit(t); code != 0 {
		t.Fatalf("carbd run exited %d:\n%s", code, r.diagnostics())
	}
	audit, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	var by, remembered int
	for _, line := range strings.Split(strings.TrimSpace(string(audit)), "\n") {
		var rec decide.AuditRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Type != "decision" || rec.Verdict == decide.Defer {
			continue
		}
		if strings.Contains(rec.Justification, "the operator (uid 0) at ") {
			by++
		}
		if strings.Contains(rec.Justification, "remembered: ") {
			remembered++
		}
	}
	if by < 2 || remembered < 1 {
		t.Errorf("audit: %d answers with who and when, %d remembered; want 2 and 1:\n%s", by, remembered, audit)
	}
}
