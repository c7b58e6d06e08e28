package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/decide"
)

// withdrawn asks this run's socket for the questions withdrawn so far.
func (r *carbdRun) withdrawn(t *testing.T) []decide.Withdrawn {
	t.Helper()
	c, ok := daemon.SocketOf(r.state, r.id)
	if !ok {
		t.Fatalf("no operator socket for %s", r.id)
	}
	resp, err := c.Do(daemon.Request{Cmd: "held"}, nil)
	if err != nil {
		t.Fatalf("held: %v", err)
	}
	return resp.Withdrawn
}

// auditRecords reads this run's decision log.
func (r *carbdRun) auditRecords(t *testing.T) []decide.AuditRecord {
	t.Helper()
	raw, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	var out []decide.AuditRecord
	lines := strings.Split(string(raw), "\n")
	// The run writes as the test reads: the text after the last newline
	// is a record not written whole yet (or nothing).
	for _, line := range lines[:len(lines)-1] {
		var rec decide.AuditRecord
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// finalCode is the reason code of effect seq's final decision.
func finalCode(recs []decide.AuditRecord, seq uint64) string {
	code := ""
	for _, rec := range recs {
		if rec.Type == "decision" && rec.Seq == seq && rec.Verdict != decide.Defer && rec.Reason != nil {
			code = rec.Reason.Code
		}
	}
	return code
}

// A question whose client is gone is withdrawn: the client (curl, which
// gives up after 3 s and closes its socket) leaves, the question
// leaves carbd held, carbd watch says it was withdrawn, the audit
// records the refusal as withdrawn with the time and the reason, the
// world gets nothing, and an answer afterwards fails (exit status 1)
// saying so. A client that resets its connection (SO_LINGER 0) has its
// question withdrawn too. Then a request is held when the agent exits:
// the sandbox ends at once, without an answer, its question withdrawn.
func TestCLIWithdrawnQuestion(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "python3")
	w := newWorld(t, 131)
	work := cliWorkdir(t)
	r := startRun(t, bin, w, work, `
curl -sS -m 3 -o /dev/null http://api.example.com/gone-4b2; echo "gone=$?"
python3 - <<'EOF' &
import os, socket, struct, time
s = socket.create_connection(("api.example.com", 80))
s.sendall(b"GET /reset-4b2 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
while not os.path.exists("/run/carbd/reset"):
    time.sleep(0.05)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
print("reset sent")
EOF
wait_for second
curl -sS -m 50 -o /dev/null http://api.example.com/exit-4b2 &
wait_for exit
`, "--oracle", "operator", "--operator-timeout", "60s")

	// carbd watch shows the question, then its withdrawal. (The reset
	// request is asked only after it: watch shows one question at a
	// time, and would otherwise be showing that one.)
	watchOut := &syncBuffer{}
	watch := startWatch(t, bin, r, watchOut)
	q := r.pending(t, "gone-4b2")
	waitFor(t, 30*time.Second, "curl to give up", r.out, func() bool { return strings.Contains(r.out.String(), "gone=") })
	waitFor(t, 15*time.Second, "the question to be withdrawn", r.out, func() bool {
		for _, h := range r.held(t) {
			if h.ID == q.ID {
				return false
			}
		}
		return true
	})
	ws := r.withdrawn(t)
	if len(ws) != 1 || ws[0].ID != q.ID || ws[0].Reason != "the client closed its socket" || ws[0].At.IsZero() {
		t.Fatalf("withdrawn: %+v", ws)
	}
	waitFor(t, 15*time.Second, "carbd watch to show the withdrawal", watchOut, func() bool {
		return strings.Contains(watchOut.String(), fmt.Sprintf("%s #%d withdrawn at ", r.id, q.ID))
	})
	watch()
	code, out, errOut := r.cli(t, "approve", "--sandbox", r.id, strconv.FormatUint(q.ID, 10))
	if code != 1 || !strings.Contains(errOut, fmt.Sprintf("question %d was withdrawn (its client is gone: the client closed its socket)", q.ID)) {
		t.Errorf("approve after the withdrawal: exit %d: %s%s", code, out, errOut)
	}
	recs := r.auditRecords(t)
	if c := finalCode(recs, q.ID); c != decide.CodeOracleWithdrawn {
		t.Errorf("audit: effect %d decided %q, want %q:\n%s", q.ID, c, decide.CodeOracleWithdrawn, r.diagnostics())
	}
	for _, rec := range recs {
		if rec.Seq == q.ID && rec.Verdict == decide.Refuse && !strings.Contains(rec.Justification, "withdrawn at 20") {
			t.Errorf("the withdrawal's record says no time: %q", rec.Justification)
		}
	}

	// A client that resets its connection (SO_LINGER 0) while its
	// request is held.
	rq := r.pending(t, "reset-4b2")
	r.tell(t, "reset")
	waitFor(t, 15*time.Second, "the reset request's question to be withdrawn", r.out, func() bool {
		for _, w := range r.withdrawn(t) {
			if w.ID == rq.ID {
				return true
			}
		}
		return false
	})
	for _, w := range r.withdrawn(t) {
		if w.ID == rq.ID && w.Reason != "the client's socket is gone" && w.Reason != "the guest reset the connection" {
			t.Errorf("the reset request withdrawn because %q", w.Reason)
		}
	}
	if c := finalCode(r.auditRecords(t), rq.ID); c != decide.CodeOracleWithdrawn {
		t.Errorf("audit: the reset request decided %q, want %q", c, decide.CodeOracleWithdrawn)
	}

	// The agent leaves a request held and exits.
	r.tell(t, "second")
	exitQ := r.pending(t, "exit-4b2")
	start := time.Now()
	r.tell(t, "exit")
	if code := r.waitExit(t); code != 0 {
		t.Fatalf("carbd run exited %d:\n%s", code, r.diagnostics())
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the run waited %v for a question nobody waits for", took)
	}
	if c := finalCode(r.auditRecords(t), exitQ.ID); c != decide.CodeOracleWithdrawn {
		t.Errorf("audit: the request held at exit decided %q, want %q:\n%s", c, decide.CodeOracleWithdrawn, r.diagnostics())
	}
	if got := w.requests(); len(got) != 0 {
		t.Errorf("the world received %q", got)
	}
}

// startWatch runs carbd watch on r's sandbox with its output in out; the
// returned function stops it.
func startWatch(t *testing.T, bin string, r *carbdRun, out *syncBuffer) func() {
	t.Helper()
	cmd := exec.Command(bin, "watch", "--state-dir", r.state, "--sandbox", r.id, "--interval", "100ms")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() { in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() }
	t.Cleanup(stop)
	return stop
}

// Two clients ask one question: one gives up, the question stays for
// the other, whose request the answer releases.
func TestCLIWithdrawKeepsSharedQuestion(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 132)
	work := cliWorkdir(t)
	r := startRun(t, bin, w, work, `
curl -sS -m 50 -o /dev/null -w "long=%{http_code}\n" http://api.example.com/shared-4b2 &
long=$!
wait_for asked
curl -sS -m 3 -o /dev/null http://api.example.com/shared-4b2; echo "short=$?"
wait $long
wait_for exit
`, "--oracle", "operator", "--operator-timeout", "60s")

	q := r.pending(t, "shared-4b2")
	r.tell(t, "asked")
	waitFor(t, 30*time.Second, "the second client to give up", r.out, func() bool { return strings.Contains(r.out.String(), "short=") })
	time.Sleep(time.Second) // its FIN reaches carbd
	held := r.held(t)
	if len(held) != 1 || held[0].ID != q.ID || !held[0].Pending {
		t.Fatalf("held after one client left: %+v\n%s", held, r.diagnostics())
	}
	if ws := r.withdrawn(t); len(ws) != 0 {
		t.Fatalf("withdrawn while a client waits: %+v", ws)
	}
	if code, out, errOut := r.cli(t, "approve", "--sandbox", r.id, strconv.FormatUint(q.ID, 10)); code != 0 {
		t.Fatalf("approve: exit %d: %s%s", code, out, errOut)
	}
	waitFor(t, 30*time.Second, "the waiting client's answer", r.out, func() bool { return strings.Contains(r.out.String(), "long=") })
	if !strings.Contains(r.out.String(), "long=200") || !strings.Contains(r.out.String(), "short=28") {
		t.Errorf("agent:\n%s", r.out.String())
	}
	r.tell(t, "exit")
	if code := r.waitExit(t); code != 0 {
		t.Fatalf("carbd run exited %d:\n%s", code, r.diagnostics())
	}
	recs := r.auditRecords(t)
	var withdrawn, released int
	for _, rec := range recs {
		if rec.Type != "decision" || rec.Reason == nil || rec.Event == nil || !strings.Contains(rec.Event.Obj, "shared-4b2") {
			continue
		}
		switch rec.Reason.Code {
		case decide.CodeOracleWithdrawn:
			withdrawn++
		case decide.CodeOracleRelease:
			released++
		}
	}
	if withdrawn != 1 || released != 1 {
		t.Errorf("audit: %d withdrawn, %d released; want one each:\n%s", withdrawn, released, r.diagnostics())
	}
	if got := w.requests(); len(got) != 1 {
		t.Errorf("the world received %q, want the one request", got)
	}
}

// carbd's own resolver traffic is never asked about: a stub resolver
// that closed its socket before carbd's answer came makes the guest's
// kernel answer with ICMP port unreachable to carbd's resolver; that is
// released without a question (and recorded), not put to the operator.
func TestCLIOwnResolverICMPNotAsked(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "python3")
	w := newWorld(t, 133)
	work := cliWorkdir(t)
	// A DNS query the policy releases at once (the task's host), sent
	// from a socket closed right after: the answer finds a closed port.
	script := `
python3 - <<'EOF'
import socket, struct
ns = open("/etc/resolv.conf").read().split("nameserver")[1].split()[0]
for i in range(3):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    q = struct.pack(">HHHHHH", 0x4b20 + i, 0x0100, 1, 0, 0, 0) + b"\x03api\x07example\x03com\x00" + struct.pack(">HH", 1, 1)
    s.sendto(q, (ns, 53))
    s.close()
print("sent", ns)
EOF
wait_for exit
`
	r := startRun(t, bin, w, work, script, "--oracle", "operator", "--operator-timeout", "60s")
	waitFor(t, 30*time.Second, "the queries", r.out, func() bool { return strings.Contains(r.out.String(), "sent ") })
	var own int
	waitFor(t, 15*time.Second, "the ICMP errors' records", r.out, func() bool {
		own = 0
		for _, rec := range r.auditRecords(t) {
			if rec.Reason != nil && rec.Reason.Code == daemon.CodeOwnICMP && rec.Verdict == decide.Release {
				own++
			}
		}
		return own > 0
	})
	time.Sleep(time.Second)
	for _, h := range r.held(t) {
		t.Errorf("held: %+v", h)
	}
	for _, rec := range r.auditRecords(t) {
		if rec.Event != nil && strings.HasPrefix(rec.Event.Op, "icmp") && (rec.Reason == nil || rec.Reason.Code != daemon.CodeOwnICMP) {
			t.Errorf("an ICMP effect decided by the engine: %+v %s", rec.Reason, rec.Justification)
		}
	}
	r.tell(t, "exit")
	if code := r.waitExit(t); code != 0 {
		t.Fatalf("carbd run exited %d:\n%s", code, r.diagnostics())
	}
}
