package demo

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/internal/tty"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

func TestMain(m *testing.M) {
	netns.Init()
	os.Exit(m.Run())
}

// The demo as a test: the benign work reaches the world and the working
// directory, the certificate never leaves, and the audit says why.
func TestDemo(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	state := t.TempDir()
	for p := state; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o755) // the sandbox's user reaches the merged view under it
	}
	res, err := Run(ctx, Options{Out: &out, StateDir: state, Keep: true})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	defer res.Cleanup()
	defer os.RemoveAll(filepath.Dir(res.Workdir))
	var posts []Request
	for _, q := range res.World {
		if strings.Contains(q.Body, Secret) {
			t.Errorf("the certificate reached the world: %+v", q)
		}
		if q.Method == "POST" {
			posts = append(posts, q)
		}
	}
	if len(posts) != 1 || posts[0].Host != "api.example.com" || !strings.Contains(posts[0].Body, "mean latency 40.0 ms") {
		t.Errorf("the world received posts %+v, want the weekly report once\n%s", posts, out.String())
	}
	report, err := os.ReadFile(filepath.Join(res.Workdir, "report.md"))
	if err != nil || !strings.Contains(string(report), "mean latency 40.0 ms") {
		t.Errorf("report.md not committed: %q %v", report, err)
	}
	refusedLeak := false
	for _, a := range res.Audit {
		if a.Type == "decision" && a.Verdict == decide.Refuse && a.Event != nil && a.Event.Op == "http:POST" {
			refusedLeak = true
			if a.Reason == nil || a.Reason.Level != "secret" {
				t.Errorf("the refused upload's reason: %+v", a.Reason)
			}
		}
	}
	if !refusedLeak {
		t.Errorf("no refused POST in the audit log\n%s", out.String())
	}
	if !strings.Contains(res.Status, "holds 1 effects") {
		t.Errorf("carbd status while the leak was held:\n%s", res.Status)
	}
	if strings.Contains(out.String(), "\033[") {
		t.Errorf("colour codes written to a buffer, not a terminal:\n%q", out.String())
	}
	for _, want := range []string{"the certificate never left the sandbox", "carbd told me", "report posted"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}

// On a terminal the demo is coloured, its agent's lines too; NO_COLOR
// turns it off.
func TestDemoOnTerminal(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	for _, c := range []struct {
		noColor string
		want    bool
	}{{"", true}, {"1", false}} {
		term, ctl, err := tty.OpenPTY()
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan string)
		go func() {
			b, _ := io.ReadAll(ctl) // ends once the terminal side is closed
			got <- string(b)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		state := t.TempDir()
		for p := state; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
			_ = os.Chmod(p, 0o755)
		}
		getenv := func(k string) string {
			if k == "NO_COLOR" {
				return c.noColor
			}
			return "xterm"
		}
		res, err := Run(ctx, Options{Out: term, StateDir: state, Getenv: getenv})
		cancel()
		term.Close()
		out := <-got
		ctl.Close()
		if err != nil {
			t.Fatalf("NO_COLOR=%q: %v\n%s", c.noColor, err, out)
		}
		res.Cleanup()
		for _, code := range []string{"\033[1mcarbd demo\033[0m", "\033[36m[agent]\033[0m"} {
			if strings.Contains(out, code) != c.want {
				t.Errorf("NO_COLOR=%q: output holds %q: %v, want %v\n%q", c.noColor, code, !c.want, c.want, out)
			}
		}
		if !strings.Contains(out, "[agent] ") && !strings.Contains(out, "[agent]\033[0m ") {
			t.Errorf("NO_COLOR=%q: no agent lines\n%q", c.noColor, out)
		}
	}
}
