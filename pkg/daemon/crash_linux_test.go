package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// The crash tests run `carbd run` in a child process (this test binary
// re-executed: TestDaemonChild runs Run under the same signal handling as
// cmd/carbd's main and exits with the sandbox's status), kill it with
// SIGKILL or stop it with SIGTERM, and check what the world received, what
// the working directory holds, and what the host is left with.

const envDaemonChild = "CARBD_DAEMON_CHILD"

// childConfig is what the parent hands the child (JSON in the
// environment).
type childConfig struct {
	ID              string
	StateDir        string
	StagingDir      string
	Workdir         string
	Task            string
	Script          string
	Policy          string
	Oracle          string // strict or operator
	OperatorTimeout time.Duration
	Hosts           map[string][]netip.Addr
}

// TestDaemonChild is the child process of the crash tests: carbd run.
func TestDaemonChild(t *testing.T) {
	raw := os.Getenv(envDaemonChild)
	if raw == "" {
		t.Skip("helper process of the crash tests")
	}
	var c childConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatal(err)
	}
	p, err := decide.ParsePolicy("crash.yaml", []byte(c.Policy))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{ID: c.ID, StateDir: c.StateDir, StagingDir: c.StagingDir, Policy: p, PolicyPath: "crash.yaml",
		Workdir: c.Workdir, Task: c.Task, Argv: []string{"/bin/sh", "-c", c.Script}, UID: sandboxUID, GID: sandboxUID,
		Hosts: c.Hosts, HoldTimeout: 3 * time.Second, Stdout: os.Stdout, Stderr: os.Stderr}
	if c.Oracle == "operator" {
		op := decide.NewOperator(c.OperatorTimeout)
		cfg.Oracle, cfg.Operator = op, op
	}
	// As cmd/carbd's main: SIGTERM and SIGINT end the run cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	sum, err := Run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "carbd run: %v\n", err)
		os.Exit(1)
	}
	sum.WriteSummary(os.Stderr)
	os.Exit(sum.ExitCode)
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// child is a running `carbd run`.
type child struct {
	cfg  childConfig
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	code int // exit status, -1 when killed by a signal
}

// agentPrelude gives the scripts wait_for NAME: wait until the test
// creates NAME in the agent's control directory (/run/carbd inside).
const agentPrelude = `wait_for() { while [ ! -e "/run/carbd/$1" ]; do sleep 0.05; done; }
`

func startChild(t *testing.T, c childConfig) *child {
	t.Helper()
	// The agent starts once carbd serves its socket: a short script
	// could otherwise end the run before the test sees it ready.
	c.Script = agentPrelude + "wait_for started\n" + c.Script
	raw, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{cfg: c, out: &syncBuffer{}, done: make(chan struct{})}
	ch.cmd = exec.Command(os.Args[0], "-test.run=^TestDaemonChild$", "-test.count=1", "-test.timeout=5m")
	ch.cmd.Env = append(os.Environ(), envDaemonChild+"="+string(raw))
	ch.cmd.Stdout, ch.cmd.Stderr = ch.out, ch.out
	if err := ch.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := ch.cmd.Wait()
		ch.code = ch.cmd.ProcessState.ExitCode()
		if err != nil && ch.code == 0 {
			ch.code = -1
		}
		close(ch.done)
	}()
	t.Cleanup(func() {
		select {
		case <-ch.done:
		default:
			_ = ch.cmd.Process.Kill()
			<-ch.done
		}
	})
	waitFor(t, 30*time.Second, "the operator socket of "+c.ID, ch.out, func() bool {
		select {
		case <-ch.done:
			t.Fatalf("carbd run exited with %d before it was ready:\n%s", ch.code, ch.out.String())
		default:
		}
		_, err := ch.client().Do(Request{Cmd: "status"}, nil)
		return err == nil
	})
	ch.tell(t, "started")
	return ch
}

func (ch *child) client() Client {
	return Client{Path: filepath.Join(ch.cfg.StateDir, "sandboxes", ch.cfg.ID, "operator.sock")}
}

// agentFile is a file of the agent's control directory, /run/carbd/name
// inside the sandbox.
func (ch *child) agentFile(name string) string {
	return filepath.Join(ch.cfg.StateDir, "sandboxes", ch.cfg.ID, "agent", name)
}

// tell creates name in the agent's control directory (wait_for returns).
func (ch *child) tell(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(ch.agentFile(name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (ch *child) status(t *testing.T) SandboxStatus {
	t.Helper()
	resp, err := ch.client().Do(Request{Cmd: "status"}, nil)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, ch.out.String())
	}
	return *resp.Status
}

// waitExit waits for the run to end and returns its exit status.
func (ch *child) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case <-ch.done:
		return ch.code
	case <-time.After(60 * time.Second):
		t.Fatalf("carbd run did not exit:\n%s", ch.out.String())
		return 0
	}
}

// kill9 kills the daemon as a crash would.
func (ch *child) kill9(t *testing.T) {
	t.Helper()
	if err := ch.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-ch.done
}

// pendingWith waits until an effect whose summary contains what waits for
// the operator, and returns it.
func (ch *child) pendingWith(t *testing.T, what string) HeldEffect {
	t.Helper()
	var found HeldEffect
	waitFor(t, 30*time.Second, "an effect on "+what+" waiting for the operator", ch.out, func() bool {
		resp, err := ch.client().Do(Request{Cmd: "held"}, nil)
		if err != nil {
			t.Fatalf("held: %v (carbd ended: %v)\n%s", err, ch.ended(), ch.out.String())
		}
		for _, h := range resp.Held {
			if h.Pending && strings.Contains(h.Summary, what) {
				found = h
				return true
			}
		}
		return false
	})
	return found
}

// waitFor polls cond until it holds; the deadline only bounds a hung
// test, it asserts nothing about speed.
func waitFor(t *testing.T, limit time.Duration, what string, out *syncBuffer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			log := ""
			if out != nil {
				log = out.String()
			}
			t.Fatalf("gave up waiting for %s\n%s", what, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// newChildConfig prepares a sandbox's directories: a working directory
// owned by the sandbox's user, a state directory and a staging directory.
func newChildConfig(t *testing.T, policy, task, script string) childConfig {
	t.Helper()
	work := workdir(t)
	state := t.TempDir()
	c := childConfig{ID: testutil.UniqueName("k"), StateDir: state, StagingDir: filepath.Join(filepath.Dir(work), ".carbd-staging"),
		Workdir: work, Task: task, Script: script, Policy: policy, Oracle: "strict"}
	t.Cleanup(func() { removeLeftovers(c.ID, c.StateDir) })
	seedIndex(t, state, c.ID)
	return c
}

// seedIndex has the sandbox remember an index (addresses, queue number)
// derived from its id, away from the low ones other sandboxes on the host
// take first: a killed run frees its index while its interface (and its
// addresses) is still there, until the restart reclaims that index.
func seedIndex(t *testing.T, stateDir, id string) {
	t.Helper()
	h := sha256.Sum256([]byte(id))
	idx := 4096 + (int(h[0])<<8|int(h[1]))%4096
	dir := filepath.Join(stateDir, "sandboxes", id)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "index"), []byte(strconv.Itoa(idx)), 0o600); err != nil {
		t.Fatal(err)
	}
}

// removeLeftovers removes what a killed carbd leaves on the host, so a
// failing test does not leak rules, pins, links or mounts. Each step is
// harmless when there is nothing to remove.
func removeLeftovers(id, stateDir string) {
	hostIf := "cbh-" + id
	_ = unix.Unmount(filepath.Join(stateDir, "sandboxes", id, "merged"), unix.MNT_DETACH)
	_ = tcx.Remove(tcx.Config{SandboxID: id, Ifname: hostIf})
	_ = nfrules.Remove(nfrules.Config{SandboxID: id, Iface: hostIf, QueueNum: netns.QueueBase})
	_ = exec.Command("ip", "link", "del", hostIf).Run()
	_ = exec.Command("nft", "delete", "table", "ip", "carbd-nat-"+id).Run()
	_ = exec.Command("nft", "delete", "table", "ip6", "carbd-nat-"+id).Run()
	removeStaleCgroup("carbd-" + id)
}

// leftovers lists what of a sandbox is still on the host: rules, pinned
// BPF state, links, mounts, its cgroup, its operator socket.
func leftovers(t *testing.T, id, stateDir string) []string {
	t.Helper()
	var left []string
	for _, tool := range []string{"iptables-save", "ip6tables-save"} {
		if out, err := exec.Command(tool).CombinedOutput(); err == nil && strings.Contains(string(out), "CARBD-"+id+"-") {
			left = append(left, tool+" shows carbd's chains")
		}
	}
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err == nil {
		for _, tb := range []string{"carbd-" + id, "carbd-nat-" + id} {
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[2] == tb {
					left = append(left, "nft table "+line)
				}
			}
		}
	}
	if _, err := os.Stat(filepath.Join(tcx.DefaultPinDir, id)); err == nil {
		left = append(left, "pinned BPF state "+filepath.Join(tcx.DefaultPinDir, id))
	}
	if err := exec.Command("ip", "link", "show", "cbh-"+id).Run(); err == nil {
		left = append(left, "link cbh-"+id)
	}
	if mnt, err := fileev.Cgroup2Mount(); err == nil {
		if _, err := os.Stat(filepath.Join(mnt, "carbd-"+id)); err == nil {
			left = append(left, "cgroup carbd-"+id)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, filepath.Join(stateDir, "sandboxes", id)) {
			left = append(left, "mount: "+line)
		}
	}
	if _, err := os.Stat(filepath.Join(stateDir, "sandboxes", id, "operator.sock")); err == nil {
		left = append(left, "operator socket")
	}
	return left
}

// snapshot is a directory tree as data: for each path, its type, mode and
// content digest (or link target).
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		info, err := de.Info()
		if err != nil {
			return err
		}
		switch {
		case de.IsDir():
			m[rel] = fmt.Sprintf("dir %v", info.Mode().Perm())
		case de.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			m[rel] = "symlink " + target
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			m[rel] = fmt.Sprintf("file %v %d %s", info.Mode().Perm(), len(b), hex.EncodeToString(sum[:8]))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// attachNetns keeps the network namespace of pid alive under a name, as a
// guest that outlives its carbd (a VM) would keep its interface.
func attachNetns(t *testing.T, pid int) string {
	t.Helper()
	name := testutil.UniqueName("cko")
	testutil.Run(t, "ip", "netns", "attach", name, strconv.Itoa(pid))
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// tryEgress sends an HTTP request and pings the world from the namespace
// and reports whether either got through.
func tryEgress(t *testing.T, ns string, w *world, path string) (curlOut string, passed bool) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "curl", "-sS", "-m", "2", "-H", "Host: api.example.com",
		"http://"+w.addr.String()+path).CombinedOutput()
	if err == nil {
		return string(out), true
	}
	if err := exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", w.addr.String()).Run(); err == nil {
		return "ping answered", true
	}
	return string(out), false
}

const crashTask = "Fetch http://api.example.com/status and save it to report.txt"

// SIGKILL of the daemon while a request is held for the operator: the
// held request never reaches the world, egress from the (surviving)
// sandbox network stays dropped by the pinned program and the rules, and
// a new carbd on the same working directory cleans the stale state up,
// keeps what was committed and enforces again.
func TestCrashWhileHeld(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "ping")
	w := newWorld(t, 91)
	c := newChildConfig(t, e2ePolicy, crashTask, `
curl -sS -m 5 http://api.example.com/status > report.txt; echo "get=$?"
touch /run/carbd/fetched
wait_for go
curl -sS -m 60 http://api.example.com/held-4e1c7; echo "held=$?"
`)
	c.Oracle, c.OperatorTimeout = "operator", 2*time.Minute
	c.Hosts = map[string][]netip.Addr{"api.example.com": {w.addr}}
	ch := startChild(t, c)

	// The released request's result is committed before the crash.
	waitFor(t, 30*time.Second, "report.txt committed", ch.out, func() bool {
		b, err := os.ReadFile(filepath.Join(c.Workdir, "report.txt"))
		return err == nil && strings.Contains(string(b), "hello from api.example.com")
	})
	committed := snapshot(t, c.Workdir)
	before := ch.status(t)
	ch.tell(t, "go")
	held := ch.pendingWith(t, "held-4e1c7")
	st := ch.status(t)
	if len(st.Held) != 1 || st.Held[0].ID != held.ID || st.Held[0].Kind != "blocking" || !st.Held[0].Pending {
		t.Fatalf("status while the request waits for the operator: held %+v", st.Held)
	}
	ns := attachNetns(t, st.Pid)

	ch.kill9(t)
	if _, err := ch.client().Do(Request{Cmd: "status"}, nil); !errors.Is(err, ErrNotRunning) {
		t.Errorf("the crashed carbd's socket answered %v, want ErrNotRunning", err)
	}

	// The pinned program and the rules stay: they are what keeps egress
	// dropped.
	if _, err := os.Stat(filepath.Join(tcx.DefaultPinDir, c.ID, "prog")); err != nil {
		t.Errorf("the pinned program is gone after the crash: %v", err)
	}
	left := strings.Join(leftovers(t, c.ID, c.StateDir), "\n")
	if !strings.Contains(left, "carbd's chains") && !strings.Contains(left, "nft table") {
		t.Errorf("carbd's queue rules are gone after the crash; left: %s", left)
	}
	// Right after the crash (the lease may still run: undecided traffic
	// goes to a queue nobody listens on) and after the lease lapsed (the
	// program drops everything).
	if out, passed := tryEgress(t, ns, w, "/after-crash-1"); passed {
		t.Errorf("egress passed right after the crash: %s", out)
	}
	waitFor(t, 10*time.Second, "the liveness lease to lapse", nil, func() bool {
		dp, err := tcx.Adopt(tcx.Config{SandboxID: c.ID})
		if err != nil {
			t.Fatalf("adopt the pinned datapath: %v", err)
		}
		defer dp.Leave()
		left, err := dp.LeaseRemaining()
		return err == nil && left <= 0
	})
	if out, passed := tryEgress(t, ns, w, "/after-crash-2"); passed {
		t.Errorf("egress passed after the lease lapsed: %s", out)
	}
	dp, err := tcx.Adopt(tcx.Config{SandboxID: c.ID})
	if err != nil {
		t.Fatal(err)
	}
	cnt, err := dp.Counters()
	dp.Leave()
	if err != nil {
		t.Fatal(err)
	}
	if cnt[tcx.DropNoDaemon].Packets == 0 {
		t.Errorf("the program counted no drop-no-daemon packets after its lease lapsed: %+v", cnt)
	}
	for _, r := range w.requests() {
		if !strings.HasPrefix(r, "api.example.com GET /status") {
			t.Errorf("the world received %q: only the released GET may arrive", r)
		}
	}

	// A new carbd on the same working directory.
	c.Oracle = "strict"
	c.Script = `
grep -q "hello from api.example.com" report.txt && echo "report=kept"
curl -sS -m 5 -o /dev/null http://api.example.com/status; echo "get=$?"
curl -sS -m 5 http://api.example.com/held-4e1c7; echo "held=$?"
echo second > second.txt
`
	ch2 := startChild(t, c)
	st2 := ch2.status(t)
	if st2.Kernel.Tracing != before.Kernel.Tracing || st2.Kernel.TC != before.Kernel.TC || st2.Kernel.Netfilter != before.Kernel.Netfilter {
		t.Errorf("kernel features after the restart %+v, before the crash %+v", st2.Kernel, before.Kernel)
	}
	if code := ch2.waitExit(t); code != 0 {
		t.Fatalf("restarted carbd run exited %d\n%s", code, ch2.out.String())
	}
	out := ch2.out.String()
	for _, want := range []string{"report=kept", "get=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("the agent after the restart did not print %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "held=0") {
		t.Errorf("the refused request succeeded after the restart:\n%s", out)
	}
	gets := 0
	for _, r := range w.requests() {
		if !strings.HasPrefix(r, "api.example.com GET /status") {
			t.Errorf("the world received %q", r)
		}
		gets++
	}
	if gets != 2 {
		t.Errorf("the world received %d GETs of /status, want one per run: %q", gets, w.requests())
	}
	// Nothing committed was lost; the new run's write is committed.
	final := snapshot(t, c.Workdir)
	for p, v := range committed {
		if final[p] != v {
			t.Errorf("%s was committed before the crash as %q, is now %q", p, v, final[p])
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.Workdir, "second.txt")); err != nil || string(b) != "second\n" {
		t.Errorf("second.txt after the restarted run: %q %v", b, err)
	}
	// The restart removed the stale interface the surviving namespace
	// held, and its own teardown left nothing.
	if out, err := exec.Command("ip", "-n", ns, "-o", "link", "show").CombinedOutput(); err != nil || strings.Contains(string(out), "eth0") {
		t.Errorf("the crashed sandbox's interface survived the restart: %s %v", out, err)
	}
	if left := leftovers(t, c.ID, c.StateDir); len(left) > 0 {
		t.Errorf("after the restarted run ended, left on the host:\n%s", strings.Join(left, "\n"))
	}
}

// crashCommitPolicy gates the targets of mkdir only: a directory the task
// does not name opens a scope that waits for the operator, which holds
// every commit point while the agent writes.
const crashCommitPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
parties:
  - {name: api, hosts: ["api.example.com"], clearance: public}
operations:
  - {ops: ["http:GET", "http:HEAD", "dns:query"], kind: blocking}
  - {ops: ["http:*"], kind: stallable}
  - {ops: ["file:mkdir"], kind: stageable, gate: [target]}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// SIGKILL of the daemon in the middle of a commit (between the journal's
// applying and done markers): the restarted carbd recovers the journal, so
// the working directory is exactly its state before or after that commit,
// with nothing committed earlier lost; the staged changes are then
// committed by the new run.
func TestCrashMidCommit(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 92)
	c := newChildConfig(t, crashCommitPolicy, "Write first.txt, then post to http://api.example.com/status", `
echo one > first.txt
wait_for go1
mkdir holddir
i=0; while [ $i -lt 400 ]; do echo "batch file $i" > b$i.txt; i=$((i+1)); done
yes 0123456789abcdef | head -c 16777216 > big.bin
echo changed > mod.txt
rm gone.txt
touch /run/carbd/wrote
wait_for go2
curl -sS -m 60 -X POST --data ok http://api.example.com/status; echo "post=$?"
sleep 120
`)
	for name, content := range map[string]string{"mod.txt": "original\n", "gone.txt": "bye\n", "keep.txt": "keep\n"} {
		if err := os.WriteFile(filepath.Join(c.Workdir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Run(t, "chown", "-R", fmt.Sprint(sandboxUID), c.Workdir)
	c.Oracle, c.OperatorTimeout = "operator", 2*time.Minute
	c.Hosts = map[string][]netip.Addr{"api.example.com": {w.addr}}
	ch := startChild(t, c)

	waitFor(t, 30*time.Second, "first.txt committed", ch.out, func() bool {
		b, err := os.ReadFile(filepath.Join(c.Workdir, "first.txt"))
		return err == nil && string(b) == "one\n"
	})
	ch.tell(t, "go1")
	waitFor(t, 60*time.Second, "the agent's writes", ch.out, func() bool {
		_, err := os.Stat(ch.agentFile("wrote"))
		return err == nil
	})
	// The scope the mkdir opened holds every commit point: W is the state
	// before the commit to come, the merged view the state after it.
	beforeCommit := snapshot(t, c.Workdir)
	merged := filepath.Join(c.StateDir, "sandboxes", c.ID, "merged")
	afterCommit := snapshot(t, merged)
	if _, ok := beforeCommit["first.txt"]; !ok || beforeCommit["gone.txt"] == "" {
		t.Fatalf("W before the commit: %v", beforeCommit)
	}
	if _, ok := afterCommit["b399.txt"]; !ok || afterCommit["gone.txt"] != "" {
		t.Fatalf("the merged view lacks the agent's writes: %d entries", len(afterCommit))
	}
	st := ch.status(t)
	if st.Scope == nil || len(st.Scope.Held) == 0 {
		t.Fatalf("no open scope holds the writes: %+v", st)
	}
	ch.tell(t, "go2")
	hold := ch.pendingWith(t, "file:mkdir holddir ")
	if _, err := ch.client().Do(Request{Cmd: "approve", ID: hold.ID}, nil); err != nil {
		t.Fatal(err)
	}
	// The scope commits; the next commit point applies everything in one
	// commit. Kill the daemon as soon as the commit touches W.
	journal := filepath.Join(c.StagingDir, "journal")
	sawJournal := false
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(journal, "applying")); err == nil {
			ch.kill9(t)
			break
		}
		if _, err := os.Stat(journal); err == nil {
			sawJournal = true
		} else if sawJournal {
			// The commit finished between two looks: crash now anyway.
			ch.kill9(t)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no commit started after the approval:\n%s", ch.out.String())
		}
		time.Sleep(100 * time.Microsecond)
	}
	_, interrupted := os.Stat(filepath.Join(journal, "applying"))
	_, finished := os.Stat(filepath.Join(journal, "done"))
	t.Logf("killed with the journal applying: %v, done: %v", interrupted == nil, finished == nil)

	// Restart. The agent opens a scope at once (a mkdir waiting for the
	// operator), so no commit point runs while W is inspected.
	c.Script = `
mkdir holddir2
touch /run/carbd/scoped
wait_for go3
curl -sS -m 60 -X POST --data ok http://api.example.com/status; echo "post=$?"
echo second > second.txt
`
	ch2 := startChild(t, c)
	waitFor(t, 30*time.Second, "the new scope", ch2.out, func() bool {
		st := ch2.status(t)
		_, err := os.Stat(ch2.agentFile("scoped"))
		return err == nil && st.Scope != nil
	})
	if !strings.Contains(ch2.out.String(), "staging journal recovered") && interrupted == nil {
		t.Errorf("the restarted carbd did not report a journal recovery:\n%s", ch2.out.String())
	}
	if _, err := os.Stat(journal); err == nil {
		t.Errorf("the journal is still there after the restart")
	}
	recovered := snapshot(t, c.Workdir)
	dBefore, dAfter := cmp.Diff(beforeCommit, recovered), cmp.Diff(afterCommit, recovered)
	if dBefore != "" && dAfter != "" {
		t.Fatalf("after recovery W is neither the state before nor after the interrupted commit\nvs before:\n%s\nvs after:\n%s", dBefore, dAfter)
	}
	if dBefore == "" {
		t.Logf("recovered to the state before the commit (rolled back)")
	} else {
		t.Logf("recovered to the state after the commit")
	}
	// Decisions do not survive a crash: the new run decides the staged
	// changes again as it meets them, and asks the operator about the
	// mkdir the policy defers a second time. Approved, everything the
	// interrupted commit held is committed. Recovered to the state after
	// the commit (the kill came after done), there is nothing left to
	// decide again: the mkdir is in W, and the run ends once holddir2 is
	// approved.
	ch2.tell(t, "go3")
	hold2 := ch2.pendingWith(t, "file:mkdir holddir2 ")
	if _, err := ch2.client().Do(Request{Cmd: "approve", ID: hold2.ID}, nil); err != nil {
		t.Fatal(err)
	}
	if dBefore == "" {
		again := ch2.pendingWith(t, "file:mkdir holddir ")
		if _, err := ch2.client().Do(Request{Cmd: "approve", ID: again.ID}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if code := ch2.waitExit(t); code != 0 {
		t.Fatalf("restarted carbd run exited %d\n%s", code, ch2.out.String())
	}
	final := snapshot(t, c.Workdir)
	if final["second.txt"] == "" || !strings.HasPrefix(final["holddir2"], "dir") {
		t.Errorf("the new run's changes are missing: second.txt %q holddir2 %q", final["second.txt"], final["holddir2"])
	}
	delete(final, "second.txt")
	delete(final, "holddir2")
	if d := cmp.Diff(afterCommit, final); d != "" {
		t.Errorf("after the new run W is not the state after the interrupted commit (-want +got):\n%s", d)
	}
	if left := leftovers(t, c.ID, c.StateDir); len(left) > 0 {
		t.Errorf("after the restarted run ended, left on the host:\n%s", strings.Join(left, "\n"))
	}
}

// SIGTERM while a request waits for the operator: the run ends at once
// (not at the operator's deadline), the waiting request is refused and
// never reaches the world, the released write is committed, and nothing
// of the sandbox is left on the host.
func TestSigtermTeardown(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	w := newWorld(t, 93)
	c := newChildConfig(t, e2ePolicy, crashTask, `
curl -sS -m 5 http://api.example.com/status > report.txt; echo "get=$?"
curl -sS -m 120 http://api.example.com/waits-9b3e; echo "waits=$?"
sleep 120
`)
	c.Oracle, c.OperatorTimeout = "operator", 10*time.Minute
	c.Hosts = map[string][]netip.Addr{"api.example.com": {w.addr}}
	ch := startChild(t, c)
	// (While the operator is asked, the engine and so the commit points
	// wait: report.txt is committed when the run ends.)
	waiting := ch.pendingWith(t, "waits-9b3e")
	st := ch.status(t)
	if err := ch.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := ch.waitExit(t)
	out := ch.out.String()
	if code != 128+int(syscall.SIGTERM) {
		t.Errorf("carbd run exited %d, want the sandbox's %d (its command was terminated)\n%s", code, 128+int(syscall.SIGTERM), out)
	}
	if !strings.Contains(out, "carbd: sandbox "+c.ID+" exited") {
		t.Errorf("no summary after SIGTERM:\n%s", out)
	}
	if b, err := os.ReadFile(filepath.Join(c.Workdir, "report.txt")); err != nil || !strings.Contains(string(b), "hello from") {
		t.Errorf("the released write was not committed at the end: %q %v", b, err)
	}
	for _, r := range w.requests() {
		if strings.Contains(r, "waits-9b3e") {
			t.Errorf("the request waiting for the operator reached the world: %q", r)
		}
	}
	if err := syscall.Kill(st.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the sandbox's init (pid %d) is still there: %v", st.Pid, err)
	}
	if left := leftovers(t, c.ID, c.StateDir); len(left) > 0 {
		t.Errorf("after SIGTERM, left on the host:\n%s", strings.Join(left, "\n"))
	}
	// The audit log was written and closed properly: every line parses.
	f, err := os.Open(filepath.Join(c.StateDir, "sandboxes", c.ID, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	refused := false
	for n := 1; sc.Scan(); n++ {
		var rec decide.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("audit line %d: %v: %s", n, err, sc.Bytes())
		}
		if rec.Seq == waiting.ID && rec.Verdict == decide.Refuse && strings.Contains(rec.Justification, "carbd is stopping") {
			refused = true
		}
	}
	if !refused {
		t.Errorf("the audit log has no refusal of #%d because carbd was stopping", waiting.ID)
	}
}

// BenchmarkTracingSync is what the network channel adds to every network
// decision: bringing the file trace up to date (a marker through the
// tracer's ring buffer and reader) before the engine decides, so that a
// read the agent made just before sending is known. Idle tracer: the
// floor of that cost; under file traffic it also waits for the records
// queued before the marker.
func BenchmarkTracingSync(b *testing.B) {
	testutil.RequireRoot(b)
	root := b.TempDir()
	tr, err := fileev.New(fileev.Config{Root: root})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, func(*fileev.Record, []decide.Event) {}) }()
	defer func() {
		cancel()
		<-done
	}()
	fc := &fileChannel{d: &daemon{cfg: Config{HoldTimeout: time.Second}}, tracer: tr}
	b.ResetTimer()
	for range b.N {
		if err := fc.syncTracing(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// ended reports whether the child has exited, with its exit status.
func (ch *child) ended() string {
	select {
	case <-ch.done:
		return fmt.Sprintf("yes, status %d", ch.code)
	default:
		return "no"
	}
}
