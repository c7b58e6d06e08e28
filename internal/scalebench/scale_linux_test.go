package scalebench

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/benchstat"
	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// The sandboxes' user (they map their root to it) and the first sandbox
// index (their addresses and queue numbers): away from the indexes other
// tests take (the CLI tests: 4096..8191).
const (
	sandboxUID = 64321
	indexBase  = 12000
	worldOctet = 135 // the world is 198.18.135.2
)

const policy = `
version: 1
levels: [public, secret]
trusted:
  task: true
parties:
  - {name: api, hosts: ["api.example.com"], clearance: public}
operations:
  - {ops: ["http:GET", "http:HEAD", "dns:query"], kind: blocking}
  - {ops: ["http:*"], kind: stallable}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// agentScript is each sandbox's agent: its first instruction stamps the
// time, then three requests its task names and three file writes; then
// it idles, blocked on reading its control FIFO (no process forked
// while it idles: an agent polling with `sleep 0.1` forks ten processes
// a second, each traced, which is not idle); told to hold, it sends
// requests the operator is asked about (not in its task) and waits for
// them in the background until it is told to exit.
const agentScript = `date +%s%N > /run/carbd/exec
for i in 0 1 2; do
  curl -sS -m 60 -o /dev/null http://api.example.com/$CARBD_SANDBOX/task-$i || echo "curl $i: $?"
  echo "data $i" > out-$i.txt
done
mkfifo -m 0600 /run/carbd/ctl && exec 3<>/run/carbd/ctl
date +%s%N > /run/carbd/loopdone
read cmd <&3
if [ "$cmd" = hold ]; then
  j=0; while [ $j -lt $HELD ]; do curl -s -m 300 -o /dev/null http://api.example.com/$CARBD_SANDBOX/held-$j & j=$((j+1)); done
  read cmd <&3
fi
`

type run struct {
	id, work, audit string
	cmd             *exec.Cmd
	out             bytes.Buffer
	start           time.Time
	done            chan struct{}
	code            int
}

type fleet struct {
	b          *testing.B
	bin, state string
	runs       []*run
	// script is the agent's script ("": agentScript).
	script string
}

func uniq() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newWorld creates the world namespace with an HTTP server on
// 198.18.135.2:80, routed from the host; it is removed at the end.
func newWorld(b *testing.B) *atomic.Int64 {
	ns := testutil.NewNetNS(b)
	hostIf := testutil.UniqueName("csw")
	testutil.Run(b, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	b.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	testutil.Run(b, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/30", worldOctet), "dev", hostIf)
	testutil.Run(b, "ip", "link", "set", hostIf, "up")
	testutil.Run(b, "ip", "-n", ns, "addr", "add", fmt.Sprintf("198.18.%d.2/30", worldOctet), "dev", "eth0")
	testutil.Run(b, "ip", "-n", ns, "link", "set", "eth0", "up")
	testutil.Run(b, "ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", worldOctet))
	var l net.Listener
	if err := netnsx.DoNamed(ns, func() (err error) { l, err = net.Listen("tcp", fmt.Sprintf("198.18.%d.2:80", worldOctet)); return err }); err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "hello %s\n", r.URL.Path)
	})}
	go srv.Serve(l)
	b.Cleanup(func() { srv.Close() })
	return &n
}

func buildCarbd(b *testing.B, dir string) string {
	bin := filepath.Join(dir, "carbd")
	cmd := exec.Command(testutil.GoTool(), "build", "-o", bin, "../../cmd/carbd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// prepare makes sandbox i's working directory, audit path and index.
func (f *fleet) prepare(base, tag string, i int) *run {
	b := f.b
	r := &run{id: fmt.Sprintf("s%s-%03d", tag, i), done: make(chan struct{})}
	r.work = filepath.Join(base, "w", strconv.Itoa(i))
	r.audit = filepath.Join(base, "audit", r.id+".jsonl")
	for _, d := range []string{r.work, filepath.Dir(r.audit), filepath.Join(f.state, "sandboxes", r.id)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.Chown(r.work, sandboxUID, sandboxUID); err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(f.state, "sandboxes", r.id), 0o711); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.state, "sandboxes", r.id, "index"), []byte(strconv.Itoa(indexBase+i)), 0o600); err != nil {
		b.Fatal(err)
	}
	return r
}

func (f *fleet) start(r *run, policyPath string, held int) {
	task := "Fetch"
	for i := 0; i < 3; i++ {
		task += fmt.Sprintf(" http://api.example.com/%s/task-%d", r.id, i)
	}
	task += " and save each to out-N.txt"
	args := []string{"run", "--policy", policyPath, "--workdir", r.work, "--task", task, "--id", r.id, "--state-dir", f.state,
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxUID),
		"--host", fmt.Sprintf("api.example.com=198.18.%d.2", worldOctet), "--audit", r.audit,
		"--oracle", "operator", "--operator-timeout", "300s",
		// (Not --env: carbd scrubs an inline --env value from every
		// argument, the paths included.)
		"--", "/bin/sh", "-c", "HELD=" + strconv.Itoa(held) + "\n" + f.agentScript()}
	r.cmd = exec.Command(f.bin, args...)
	r.cmd.Stdout, r.cmd.Stderr = &lockedBuf{b: &r.out}, &lockedBuf{b: &r.out}
	// A benchmark process that dies takes its runs down cleanly.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	r.start = time.Now()
	if err := r.cmd.Start(); err != nil {
		f.b.Fatal(err)
	}
	go func() {
		_ = r.cmd.Wait()
		r.code = r.cmd.ProcessState.ExitCode()
		close(r.done)
	}()
}

func (f *fleet) agentScript() string {
	if f.script != "" {
		return f.script
	}
	return agentScript
}

type lockedBuf struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (f *fleet) agentFile(r *run, name string) string {
	return filepath.Join(f.state, "sandboxes", r.id, "agent", name)
}

// tell writes a command (hold, exit) to the agent's control FIFO,
// waiting for the agent to have opened it.
func (f *fleet) tell(r *run, cmd string) {
	path := f.agentFile(r, "ctl")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Write(fd, []byte(cmd+"\n"))
			unix.Close(fd)
			if err == nil {
				return
			}
		}
		select {
		case <-r.done:
			return // it ended: nothing to tell
		default:
		}
		if time.Now().After(deadline) {
			f.b.Fatalf("sandbox %s: tell %s: %v", r.id, cmd, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stamp reads a time the agent wrote (date +%s%N).
func (f *fleet) stamp(r *run, name string) (time.Time, bool) {
	b, err := os.ReadFile(f.agentFile(r, name))
	if err != nil {
		return time.Time{}, false
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// waitAll waits until cond holds for every run (or fails after limit).
func (f *fleet) waitAll(runs []*run, limit time.Duration, what string, cond func(*run) bool) {
	deadline := time.Now().Add(limit)
	for {
		missing := 0
		var first *run
		for _, r := range runs {
			select {
			case <-r.done:
				f.b.Fatalf("sandbox %s ended (exit %d) while waiting for %s:\n%s", r.id, r.code, what, r.out.String())
			default:
			}
			if !cond(r) {
				missing++
				if first == nil {
					first = r
				}
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			f.b.Fatalf("%d sandboxes never reached %s; %s says:\n%s", missing, what, first.id, first.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cleanup stops every run still going and removes what a killed carbd
// leaves behind.
func (f *fleet) cleanup() {
	for _, r := range f.runs {
		if r.cmd == nil || r.cmd.Process == nil {
			continue
		}
		select {
		case <-r.done:
			continue
		default:
		}
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(60 * time.Second)
	for _, r := range f.runs {
		if r.cmd == nil || r.cmd.Process == nil {
			continue
		}
		select {
		case <-r.done:
		case <-deadline:
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	}
	for _, r := range f.runs {
		removeLeftovers(r.id, f.state)
		if id, err := daemon.WorkStateID(r.work); err == nil {
			_ = os.RemoveAll(filepath.Join(daemon.DefaultWorkStateRoot, id))
		}
	}
}

// removeLeftovers removes what a killed carbd leaves on the host: rules,
// pinned BPF state, its link, NAT tables, its cgroup, its mount.
func removeLeftovers(id, stateDir string) {
	hostIf := "cbh-" + id
	if _, err := os.Stat(filepath.Join(stateDir, "sandboxes", id, "merged")); err == nil {
		_ = exec.Command("umount", "-l", filepath.Join(stateDir, "sandboxes", id, "merged")).Run()
	}
	if exec.Command("ip", "link", "show", hostIf).Run() != nil {
		return // carbd tore its sandbox down
	}
	_ = tcx.Remove(tcx.Config{SandboxID: id, Ifname: hostIf})
	_ = nfrules.Remove(nfrules.Config{SandboxID: id, Iface: hostIf, QueueNum: netns.QueueBase})
	_ = exec.Command("ip", "link", "del", hostIf).Run()
	_ = exec.Command("nft", "delete", "table", "ip", "carbd-nat-"+id).Run()
	_ = exec.Command("nft", "delete", "table", "ip6", "carbd-nat-"+id).Run()
	if mnt, err := fileev.Cgroup2Mount(); err == nil {
		_ = os.WriteFile(filepath.Join(mnt, "carbd-"+id, "cgroup.kill"), []byte("1"), 0)
		time.Sleep(100 * time.Millisecond)
		_ = os.Remove(filepath.Join(mnt, "carbd-"+id))
	}
}

// mem is a memory reading, in KiB.
type mem struct {
	carbd   float64 // carbd processes' proportional set size
	sandbox float64 // the sandboxes' processes (their cgroups' PSS)
	kernel  float64 // slab, kernel stacks, page tables, per-CPU, vmalloc
	used    float64 // MemTotal - MemAvailable: everything, other helpers' work too
}

func (m mem) sub(o mem) mem {
	return mem{m.carbd - o.carbd, m.sandbox - o.sandbox, m.kernel - o.kernel, m.used - o.used}
}
func (m mem) div(n float64) mem { return mem{m.carbd / n, m.sandbox / n, m.kernel / n, m.used / n} }
func (m mem) total() float64    { return m.carbd + m.sandbox + m.kernel }

func meminfo() map[string]float64 {
	out := map[string]float64{}
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return out
	}
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	return out
}

func pss(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return 0
}

func (f *fleet) measure(runs []*run) mem {
	// Let freed memory settle (RCU, deferred frees) before reading.
	time.Sleep(time.Second)
	var m mem
	mnt, _ := fileev.Cgroup2Mount()
	for _, r := range runs {
		select {
		case <-r.done:
			continue
		default:
		}
		m.carbd += pss(r.cmd.Process.Pid)
		if mnt != "" {
			// The sandbox's processes (its init, the agent's shell and
			// what it runs): the cgroup v2 hierarchy here may have no
			// memory controller, so their PSS.
			if b, err := os.ReadFile(filepath.Join(mnt, "carbd-"+r.id, "cgroup.procs")); err == nil {
				for _, l := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(l); err == nil {
						m.sandbox += pss(pid)
					}
				}
			}
		}
	}
	mi := meminfo()
	m.kernel = mi["Slab"] + mi["KernelStack"] + mi["PageTables"] + mi["Percpu"] + mi["VmallocUsed"]
	m.used = mi["MemTotal"] - mi["MemAvailable"]
	return m
}

// pending counts the questions waiting for the operator in runs.
func (f *fleet) pending(runs []*run) int {
	n := 0
	for _, r := range runs {
		c, ok := daemon.SocketOf(f.state, r.id)
		if !ok {
			continue
		}
		resp, err := c.Do(daemon.Request{Cmd: "held"}, nil)
		if err != nil {
			continue
		}
		for _, h := range resp.Held {
			if h.Pending {
				n++
			}
		}
	}
	return n
}

// boundQueues reads the queues bound now (/proc/net/netfilter/nfnetlink_queue).
func boundQueues() map[int]bool {
	out := map[int]bool{}
	fh, err := os.Open("/proc/net/netfilter/nfnetlink_queue")
	if err != nil {
		return out
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			if q, err := strconv.Atoi(f[0]); err == nil {
				out[q] = true
			}
		}
	}
	return out
}

// isolation checks each sandbox's decision log: every request it
// decided names that sandbox. It returns the violations and the
// decisions counted between the loops' start and end.
func (f *fleet) isolation(from, to time.Time) (violations []string, decisions int) {
	for _, r := range f.runs {
		raw, err := os.ReadFile(r.audit)
		if err != nil {
			violations = append(violations, fmt.Sprintf("%s: no decision log: %v", r.id, err))
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		for {
			var rec decide.AuditRecord
			if err := dec.Decode(&rec); err == io.EOF {
				break
			} else if err != nil {
				violations = append(violations, fmt.Sprintf("%s: decision log: %v", r.id, err))
				break
			}
			if rec.Type != "decision" || rec.Event == nil {
				continue
			}
			if !rec.Time.Before(from) && !rec.Time.After(to) {
				decisions++
			}
			if strings.Contains(rec.Event.Obj, "api.example.com/") && !strings.Contains(rec.Event.Obj, "/"+r.id+"/") {
				violations = append(violations, fmt.Sprintf("%s decided %s %s", r.id, rec.Event.Op, rec.Event.Obj))
			}
		}
	}
	return violations, decisions
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkHundredSandboxes: see the package documentation. Each
// iteration is the whole scenario, for 20 sandboxes and for 100 (or
// CARBD_SCALE_N); run it with -benchtime=1x.
func BenchmarkHundredSandboxes(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireTool(b, "curl")
	sizes := []int{20, 100}
	if n := envInt("CARBD_SCALE_N", 0); n > 0 {
		sizes = []int{n}
	}
	// At most 3: the verdict loop decides 4 effects at once, and a
	// question blocks its decision (the held requests' DNS lookups need
	// the fourth).
	held := envInt("CARBD_SCALE_HELD", 3)
	dir, err := os.MkdirTemp("/var/lib", "carbd-scale-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	bin := os.Getenv("CARBD_SCALE_BIN") // a carbd built elsewhere; default: build this checkout's
	if bin == "" {
		bin = buildCarbd(b, dir)
	}
	policyPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policyPath, []byte(policy), 0o644); err != nil {
		b.Fatal(err)
	}
	served := newWorld(b)
	for _, n := range sizes {
		if n < 2 {
			b.Fatal("CARBD_SCALE_N must be at least 2")
		}
		b.Run(fmt.Sprintf("sandboxes=%d", n), func(b *testing.B) {
			scenario(b, n, held, bin, policyPath, filepath.Join(dir, fmt.Sprintf("n%d", n)), served)
		})
	}
}

// scenario starts n sandboxes at once and measures them (see the
// package documentation).
func scenario(b *testing.B, n, held int, bin, policyPath, dir string, served *atomic.Int64) {
	servedBefore := served.Load()
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		base := filepath.Join(dir, fmt.Sprintf("it%d", it))
		f := &fleet{b: b, bin: bin, state: filepath.Join(base, "state")}
		if err := os.MkdirAll(f.state, 0o711); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(f.cleanup)
		tag := uniq()
		for i := 0; i < n; i++ {
			f.runs = append(f.runs, f.prepare(base, tag, i))
		}
		m0 := f.measure(nil)
		// All at once.
		for _, r := range f.runs {
			f.start(r, policyPath, held)
		}
		f.waitAll(f.runs, 5*time.Minute, "the agent's first instruction", func(r *run) bool { _, ok := f.stamp(r, "exec"); return ok })
		var lat []time.Duration
		first := time.Time{}
		for _, r := range f.runs {
			t, _ := f.stamp(r, "exec")
			lat = append(lat, t.Sub(r.start))
			if first.IsZero() || t.Before(first) {
				first = t
			}
			if d := os.Getenv("CARBD_SCALE_LOG"); d != "" {
				// As BenchmarkStartWhileRunning: each start's times
				// and log, for a profiling build's start-up marks.
				log := fmt.Sprintf("started %d exec %d\n%s", r.start.UnixNano(), t.UnixNano(), r.out.String())
				if err := os.WriteFile(filepath.Join(d, r.id+".log"), []byte(log), 0o644); err != nil {
					b.Error(err)
				}
			}
		}
		f.waitAll(f.runs, 5*time.Minute, "the end of the agent loop", func(r *run) bool { _, ok := f.stamp(r, "loopdone"); return ok })
		last := time.Time{}
		for _, r := range f.runs {
			if t, _ := f.stamp(r, "loopdone"); t.After(last) {
				last = t
			}
		}
		// Isolation while all run: each its own queue, bound.
		bound := boundQueues()
		var unbound []string
		for i, r := range f.runs {
			if !bound[netns.QueueBase+indexBase+i] {
				unbound = append(unbound, r.id)
			}
		}
		mN := f.measure(f.runs)
		// Half of them end; the rest stay idle.
		half := f.runs[n/2:]
		keep := f.runs[:n/2]
		for _, r := range half {
			f.tell(r, "exit")
		}
		for _, r := range half {
			select {
			case <-r.done:
			case <-time.After(2 * time.Minute):
				b.Fatalf("sandbox %s did not end:\n%s", r.id, r.out.String())
			}
			if r.code != 0 {
				b.Errorf("sandbox %s exited %d:\n%s", r.id, r.code, r.out.String())
			}
		}
		mHalf := f.measure(keep)
		// Held flows: the rest each hold `held` requests for the operator.
		for _, r := range keep {
			f.tell(r, "hold")
		}
		want := len(keep) * held
		deadline := time.Now().Add(3 * time.Minute)
		for got := f.pending(keep); got < want; got = f.pending(keep) {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d requests held for the operator", got, want)
			}
			time.Sleep(500 * time.Millisecond)
		}
		mHeld := f.measure(keep)
		for _, r := range keep {
			f.tell(r, "exit")
		}
		for _, r := range keep {
			select {
			case <-r.done:
			case <-time.After(2 * time.Minute):
				b.Fatalf("sandbox %s did not end:\n%s", r.id, r.out.String())
			}
			if r.code != 0 {
				b.Errorf("sandbox %s exited %d:\n%s", r.id, r.code, r.out.String())
			}
		}
		violations, decisions := f.isolation(first, last)
		b.StopTimer()

		hi := mN.sub(mHalf).div(float64(len(half)))
		lo := mHalf.sub(m0).div(float64(len(keep)))
		perFlow := mHeld.sub(mHalf).div(float64(want))
		p50, p99 := benchstat.Median(lat), benchstat.Quantile(lat, 0.99)
		rate := float64(decisions) / last.Sub(first).Seconds()
		b.ReportMetric(float64(p50.Microseconds())/1000, "start-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, "start-p99-ms")
		b.ReportMetric(rate, "decisions/s")
		b.ReportMetric(hi.total(), "idle-KiB/sandbox")
		b.ReportMetric(hi.carbd, "carbd-KiB/sandbox")
		b.ReportMetric(hi.kernel, "kernel-KiB/sandbox")
		b.ReportMetric(hi.sandbox, "procs-KiB/sandbox")
		b.ReportMetric(hi.total()/lo.total(), "linearity")
		// A held flow's client (a curl process in the sandbox) is the
		// agent's memory, not carbd's: carbd and the kernel only.
		b.ReportMetric(perFlow.carbd*1024, "carbd-B/held-flow")
		b.ReportMetric((perFlow.carbd+perFlow.kernel)*1024, "B/held-flow")
		b.ReportMetric(float64(len(violations)+len(unbound)), "isolation-violations")
		b.Logf("%d sandboxes started at once: start-to-exec p50 %v p99 %v (min %v max %v); %d decisions in %v across all: %.0f/s; world served %d requests",
			n, p50, p99, benchstat.Quantile(lat, 0), benchstat.Quantile(lat, 1), decisions, last.Sub(first).Round(time.Millisecond), rate, served.Load()-servedBefore)
		b.Logf("memory per idle sandbox (KiB), from %d to %d sandboxes: carbd %.0f, sandbox processes %.0f, kernel %.0f, total %.0f (system-wide used %.0f); from 0 to %d: carbd %.0f, sandbox processes %.0f, kernel %.0f, total %.0f (used %.0f); linearity %.2f",
			len(keep), n, hi.carbd, hi.sandbox, hi.kernel, hi.total(), hi.used, len(keep), lo.carbd, lo.sandbox, lo.kernel, lo.total(), lo.used, hi.total()/lo.total())
		b.Logf("memory per held flow (%d flows in %d sandboxes): carbd %.0f B, kernel %.0f B (its client, a curl process: %.0f B; system-wide used %.0f B)",
			want, len(keep), perFlow.carbd*1024, perFlow.kernel*1024, perFlow.sandbox*1024, perFlow.used*1024)
		for _, v := range violations {
			b.Errorf("isolation: %s", v)
		}
		if len(unbound) > 0 {
			b.Errorf("isolation: no bound queue of its own for %v", unbound)
		}
		b.StartTimer()
	}
}
