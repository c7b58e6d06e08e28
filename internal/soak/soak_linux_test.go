//go:build soak && linux

package soak

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	_ "embed"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/daemon"
)

var (
	flagRuns = flag.Int("soak.runs", 200, "consecutive carbd run sessions")
	flagOut  = flag.String("soak.out", "", "directory for soak.csv and summary.md (default /var/tmp/carbd-soak-<time>)")
	flagKeep = flag.Bool("soak.keep", false, "keep the working directory and its carbd state")
	flagBad  = flag.Int("soak.bad-every", 5, "every how many runs the agent also tries what is refused")
	flagGC   = flag.Int("soak.gc-every", 25, "every how many runs the person runs git gc on the host (0: never)")
	flagRepo = flag.String("soak.repo", "", "the git repository whose history the working directory is cloned from (default: the one holding the current directory)")
	flagBin  = flag.String("soak.bin", "", "a carbd binary to run (default: go build ./cmd/carbd of this tree)")
)

//go:embed agent.sh
var agentScript []byte

const (
	soakUID   = 64330
	soakOctet = 230
	// secret is the private key under certs/: it must never reach the world.
	secret = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjSoakSoakSoak"
	task   = "Maintain the repository: run its tests, commit your work, fetch http://api.example.com/data and https://api.example.com/data, and post a report to http://api.example.com/reports"
)

const policy = `
version: 1
levels: [public, secret]
trusted:
  task: true
  paths: ["README.md", "docs/**"]
sensitive:
  - {name: keys, level: secret, paths: ["certs/**"]}
parties:
  - {name: api, hosts: ["api.example.com"], clearance: public}
refuse:
  - {name: git-hooks, ops: ["file:*"], paths: [".git/hooks/**"]}
  - {name: git-config, ops: ["file:*"], paths: [".git/config"]}
operations:
  - {ops: ["http:GET", "http:HEAD", "dns:query"], kind: blocking}
  - {ops: ["http:*"], kind: stallable}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// world is the outside: a namespace with HTTP and HTTPS servers that
// record every request.
type world struct {
	ns    string
	addr  netip.Addr
	caPEM string // file with the servers' CA (carbd run --upstream-ca)
	mu    sync.Mutex
	reqs  []string // "SCHEME METHOD PATH?QUERY BODY"
}

func (w *world) requests() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.reqs...)
}

func newWorld(t *testing.T, dir string) *world {
	testutil.ClaimWorldNet(t, soakOctet)
	ns := testutil.NewNetNS(t)
	hostIf := testutil.UniqueName("cws")
	w := &world{ns: ns, addr: netip.AddrFrom4([4]byte{198, 18, soakOctet, 2})}
	testutil.Run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	testutil.Run(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/30", soakOctet), "dev", hostIf)
	testutil.Run(t, "ip", "link", "set", hostIf, "up")
	testutil.Run(t, "ip", "-n", ns, "addr", "add", w.addr.String()+"/30", "dev", "eth0")
	testutil.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	testutil.Run(t, "ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", soakOctet))
	h := func(scheme string) http.Handler {
		return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.mu.Lock()
			w.reqs = append(w.reqs, strings.Join([]string{scheme, r.Method, r.URL.RequestURI(), string(body)}, " "))
			w.mu.Unlock()
			fmt.Fprintf(rw, "hello from %s %s\n", r.Host, r.URL.Path)
		})
	}
	cert, caPEM := serverCert(t, "api.example.com")
	w.caPEM = filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(w.caPEM, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		port int
		srv  *http.Server
	}{
		{80, &http.Server{Handler: h("http")}},
		{443, &http.Server{Handler: h("https"), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}},
	} {
		var l net.Listener
		if err := netnsx.DoNamed(ns, func() (err error) {
			l, err = net.Listen("tcp", netip.AddrPortFrom(w.addr, uint16(s.port)).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if s.srv.TLSConfig != nil {
			l = tls.NewListener(l, s.srv.TLSConfig)
		}
		go s.srv.Serve(l)
		t.Cleanup(func() { s.srv.Close() })
	}
	return w
}

// serverCert makes a CA and a certificate for name signed by it.
func serverCert(t *testing.T, name string) (tls.Certificate, []byte) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "soak world CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// person edits the repository on the host as its owner, and remembers
// every edit it made.
type person struct {
	t    *testing.T
	work string
	mu   sync.Mutex
	// lines are the lines the person appended: path -> lines.
	lines map[string][]string
	// commits are the person's commit ids.
	commits []string
}

func (p *person) env() []string {
	return []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=person", "GIT_AUTHOR_EMAIL=person@example.com",
		"GIT_COMMITTER_NAME=person", "GIT_COMMITTER_EMAIL=person@example.com"}
}

// git runs git in the working directory as the owner.
func (p *person) git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = p.work
	cmd.Env = p.env()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: soakUID, Gid: soakUID}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// appendLine appends line to path (in place, as an editor's append or a
// shell's >> does).
func (p *person) appendLine(path, line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(p.work, path), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		p.t.Errorf("person: %v", err)
		return
	}
	_, err = f.WriteString(line + "\n")
	f.Close()
	if err != nil {
		p.t.Errorf("person: %v", err)
		return
	}
	_ = os.Chown(filepath.Join(p.work, path), soakUID, soakUID)
	p.lines[path] = append(p.lines[path], line)
}

// commit commits everything the person sees changed.
func (p *person) commit(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if out, err := p.git("add", "-A"); err != nil {
		p.t.Logf("person: git add: %v: %s", err, out)
		return
	}
	if out, err := p.git("commit", "-q", "--no-verify", "-m", msg); err != nil {
		p.t.Logf("person: git commit: %v: %s", err, out) // nothing to commit, or a lock: not an error of carbd's
		return
	}
	out, err := p.git("rev-parse", "HEAD")
	if err != nil {
		p.t.Errorf("person: rev-parse: %v: %s", err, out)
		return
	}
	p.commits = append(p.commits, strings.TrimSpace(out))
}

// agentEdit is one change the agent says it made: the path now has a line
// (or, gone, no longer exists).
type agentEdit struct {
	path, line string
	gone       bool
}

// parseAgent reads the agent's SOAK lines.
func parseAgent(out string) (edits []agentEdit, status map[string]string, agentSecs float64) {
	status = map[string]string{}
	var t0, t1 float64
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "SOAK ")
		if !ok {
			continue
		}
		f := strings.SplitN(rest, " ", 3)
		switch {
		case f[0] == "edit" && len(f) == 3:
			edits = append(edits, agentEdit{path: f[1], line: f[2]})
		case f[0] == "gone" && len(f) >= 2:
			edits = append(edits, agentEdit{path: f[1], gone: true})
		case f[0] == "t-start" && len(f) >= 2:
			t0, _ = strconv.ParseFloat(f[1], 64)
		case f[0] == "t-end" && len(f) >= 2:
			t1, _ = strconv.ParseFloat(f[1], 64)
		case len(f) >= 2:
			status[f[0]] = f[1]
		}
	}
	if t0 > 0 && t1 > t0 {
		agentSecs = t1 - t0
	}
	return edits, status, agentSecs
}

// conflictPaths reads the conflict reports of the working directory's
// state that are not in seen (and adds them to it): the paths carbd kept
// W's version of.
func conflictPaths(t *testing.T, wsd string, seen map[string]bool) map[string]bool {
	out := map[string]bool{}
	reports, _ := filepath.Glob(filepath.Join(wsd, "conflicts", "*", "report"))
	for _, r := range reports {
		if seen[r] {
			continue
		}
		seen[r] = true
		b, err := os.ReadFile(r)
		if err != nil {
			t.Errorf("conflict report: %v", err)
			continue
		}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Split(l, "\t")
			if len(f) < 4 {
				continue
			}
			p, err := strconv.Unquote(f[2])
			if err != nil {
				t.Errorf("conflict report %s: line %q: %v", r, l, err)
				continue
			}
			out[p] = true
		}
	}
	return out
}

// prepareRepo clones this repository's history (a few hundred files)
// into work, with a key under certs/ and the files the person and agent
// share, owned by the sandbox's user.
func prepareRepo(t *testing.T, work string) {
	root := *flagRepo
	if root == "" {
		out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
		if err != nil {
			t.Fatalf("find the repository: %v", err)
		}
		root = strings.TrimSpace(string(out))
	}
	testutil.Run(t, "git", "clone", "-q", "--no-local", "--depth", "30", "file://"+root, work)
	for name, content := range map[string]string{
		"certs/service.pem": "-----BEGIN PRIVATE KEY-----\n" + secret + "\n-----END PRIVATE KEY-----\n",
		"shared.txt":        "a file both the person and the agent edit\n",
		"person.txt":        "the person's notes\n",
	} {
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Run(t, "chown", "-R", fmt.Sprintf("%d:%d", soakUID, soakUID), work)
}

// runResult is what one carbd run produced.
type runResult struct {
	wall, agentSecs float64
	code            int
	hwmKB, maxRSSKB float64
	userS, sysS     float64
	out             string
}

// runOnce runs one `carbd run` of the agent; during it, the person
// edits the repository once, at a random time.
func runOnce(t *testing.T, bin, base, id, state, work string, w *world, p *person, n int, bad bool) runResult {
	badArg := "0"
	if bad {
		badArg = "1"
	}
	args := []string{"run", "--policy", filepath.Join(base, "policy.yaml"), "--workdir", work, "--task", task,
		"--id", id, "--state-dir", state, "--uid", strconv.Itoa(soakUID), "--gid", strconv.Itoa(soakUID),
		"--host", "api.example.com=" + w.addr.String(), "--upstream-ca", w.caPEM,
		"--audit", filepath.Join(base, "audit", fmt.Sprintf("run-%04d.jsonl", n)),
		"--", "/bin/sh", filepath.Join(base, "agent.sh"), strconv.Itoa(n), badArg}
	var out strings.Builder
	var outMu sync.Mutex
	cmd := exec.Command(bin, args...)
	wr := writerFunc(func(b []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(b) })
	cmd.Stdout, cmd.Stderr = wr, wr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var hwm float64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // carbd's peak RSS, as /proc says while it lives
		defer wg.Done()
		status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
		for {
			if v := statusField(status, "VmHWM:"); v > hwm {
				hwm = v
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	go func() { // the person, during the run
		defer wg.Done()
		select {
		case <-done:
			return
		case <-time.After(time.Duration(300+mrand.IntN(2500)) * time.Millisecond):
		}
		p.appendLine("person.txt", fmt.Sprintf("person-during-%d", n))
		p.appendLine("shared.txt", fmt.Sprintf("person-during-shared-%d", n))
		if n%3 == 0 {
			p.commit(fmt.Sprintf("person during run %d", n))
		}
	}()
	err := cmd.Wait()
	close(done)
	wg.Wait()
	r := runResult{wall: time.Since(start).Seconds(), code: cmd.ProcessState.ExitCode(), hwmKB: hwm}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.maxRSSKB = float64(ru.Maxrss)
		r.userS = time.Duration(ru.Utime.Nano()).Seconds()
		r.sysS = time.Duration(ru.Stime.Nano()).Seconds()
	}
	outMu.Lock()
	r.out = out.String()
	outMu.Unlock()
	if err != nil && r.code < 0 {
		t.Fatalf("run %d: %v\n%s", n, err, r.out)
	}
	_, _, r.agentSecs = parseAgent(r.out)
	return r
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestSoak(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tool := range []string{"git", "python3", "curl", "iptables-save", "nft"} {
		testutil.RequireTool(t, tool)
	}
	base, err := os.MkdirTemp("/var/lib", "carbd-soak-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(base, 0o755)
	t.Cleanup(func() {
		if *flagKeep {
			t.Logf("kept %s", base)
			return
		}
		_ = os.RemoveAll(base)
	})
	work := filepath.Join(base, "work")
	state := filepath.Join(base, "state")
	for _, d := range []string{filepath.Join(base, "audit"), state} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	outDir := *flagOut
	if outDir == "" {
		outDir = "/var/tmp/carbd-soak-" + time.Now().UTC().Format("20060102T150405")
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("figures in %s; working directory %s", outDir, work)

	// The binary, the policy, the agent, the repository, the world.
	bin := filepath.Join(base, "carbd")
	if *flagBin != "" {
		b, err := os.ReadFile(*flagBin)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, b, 0o755); err != nil {
			t.Fatal(err)
		}
	} else {
		build := exec.Command(testutil.GoTool(), "build", "-o", bin, "../../cmd/carbd")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	for name, b := range map[string][]byte{"policy.yaml": []byte(policy), "agent.sh": agentScript} {
		if err := os.WriteFile(filepath.Join(base, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prepareRepo(t, work)
	wsd := filepath.Join(daemon.DefaultWorkStateRoot, mustWorkStateID(t, work))
	id := testutil.UniqueName("s")
	// An index away from the low ones other sandboxes take first (as
	// cmd/carbd's tests do); the daemon takes it back when free.
	h := sha256.Sum256([]byte(id))
	if err := os.MkdirAll(filepath.Join(state, "sandboxes", id), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "sandboxes", id, "index"), []byte(strconv.Itoa(4096+(int(h[0])<<8|int(h[1]))%4096)), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if *flagKeep {
			t.Logf("kept %s", wsd)
			return
		}
		_ = os.RemoveAll(wsd)
	})
	w := newWorld(t, base)
	p := &person{t: t, work: work, lines: map[string][]string{}}
	probe := Probe{ID: id, Base: base, StateDir: state, WorkStateDir: wsd, Binary: bin, Workdir: work, WorldNS: w.ns}

	var rows []Row
	r0 := Measure(probe)
	r0["run"] = 0
	rows = append(rows, r0)
	writeCSV(t, filepath.Join(outDir, "soak.csv"), rows)

	var bads, failures, nConflicts int
	seenReports := map[string]bool{}
	for n := 1; n <= *flagRuns; n++ {
		bad := *flagBad > 0 && n%*flagBad == 0
		if bad {
			bads++
		}
		res := runOnce(t, bin, base, id, state, work, w, p, n, bad)
		edits, status, _ := parseAgent(res.out)
		row := Measure(probe)
		row["run"] = float64(n)
		row["wall_s"], row["agent_s"], row["overhead_s"] = res.wall, res.agentSecs, res.wall-res.agentSecs
		row["exit"] = float64(res.code)
		for k, v := range summaryCounts(res.out) {
			row["run_"+k] = v
		}
		row["carbd_hwm_kb"], row["carbd_maxrss_kb"] = res.hwmKB, res.maxRSSKB
		row["carbd_user_s"], row["carbd_sys_s"] = res.userS, res.sysS

		// Every released agent change is in W, or its conflict is reported.
		conflicts := conflictPaths(t, wsd, seenReports)
		nConflicts += len(conflicts)
		var problems []string
		if len(edits) < 5 {
			problems = append(problems, fmt.Sprintf("the agent reported %d edits (want at least 5)", len(edits)))
		}
		for k, v := range map[string]string{"test": "0", "fetch-http": "0", "fetch-https": "0", "fetch-py": "0", "post": "0"} {
			if status[k] != v {
				problems = append(problems, fmt.Sprintf("agent step %s: status %q, want %q", k, status[k], v))
			}
		}
		for _, e := range edits {
			b, err := os.ReadFile(filepath.Join(work, e.path))
			switch {
			case e.gone && err == nil && !conflicts[e.path]:
				problems = append(problems, fmt.Sprintf("%s: removed by the agent, still in W, no conflict reported", e.path))
			case !e.gone && !strings.Contains(string(b), e.line) && !conflicts[e.path]:
				problems = append(problems, fmt.Sprintf("%s: the agent's %q is not in W and no conflict names it (%v)", e.path, e.line, err))
			}
		}
		if _, err := os.Lstat(filepath.Join(work, ".git/hooks/post-commit")); err == nil {
			problems = append(problems, ".git/hooks/post-commit (refused) is in W")
		}
		if !slices.Contains(w.requests(), fmt.Sprintf("http POST /reports report of run %d", n)) {
			problems = append(problems, "the run's report did not reach the world")
		}
		if bad && (status["leak-http"] == "" || status["hook"] == "") {
			problems = append(problems, "the agent did not try what is refused")
		}
		row["problems"] = float64(len(problems))
		if len(problems) > 0 {
			// Recorded, and the soak goes on: a week has bad hours too.
			failures++
			out := "\n--- output ---\n" + tail(res.out, 60)
			if failures > 5 {
				out = "" // the first five show carbd's output
			}
			t.Errorf("run %d (exit %d, %.1fs):\n  %s%s", n, res.code, res.wall, strings.Join(problems, "\n  "), out)
		}
		rows = append(rows, row)
		writeCSV(t, filepath.Join(outDir, "soak.csv"), rows)
		t.Logf("run %d: exit %d, %.1fs (agent %.1fs), carbd peak %.0f MiB, state %.0f KiB in %.0f files",
			n, res.code, res.wall, res.agentSecs, res.hwmKB/1024, row["ws_bytes"]/1024, row["ws_files"])

		// The person, between runs: an append, an edit of the shared
		// file, a commit.
		p.appendLine("person.txt", fmt.Sprintf("person-between-%d", n))
		p.appendLine("shared.txt", fmt.Sprintf("person-between-shared-%d", n))
		p.commit(fmt.Sprintf("person after run %d", n))
		if *flagGC > 0 && n%*flagGC == 0 {
			// The person packs the repository: the loose objects the
			// agent's commits wrote (each with a label) leave W.
			if out, err := p.git("gc", "-q", "--prune=now"); err != nil {
				t.Errorf("person: git gc: %v: %s", err, out)
			}
		}
	}

	// Nothing of the person's is lost: every line is in W, every commit
	// reachable from HEAD.
	for path, lines := range p.lines {
		b, err := os.ReadFile(filepath.Join(work, path))
		if err != nil {
			t.Errorf("person's %s: %v", path, err)
			continue
		}
		for _, l := range lines {
			if !strings.Contains(string(b), l+"\n") {
				t.Errorf("person's line %q of %s is gone from W", l, path)
			}
		}
	}
	for _, c := range p.commits {
		if out, err := p.git("merge-base", "--is-ancestor", c, "HEAD"); err != nil {
			t.Errorf("person's commit %s is not reachable from HEAD: %v %s", c, err, out)
		}
	}
	fsck, fsckErr := p.git("fsck", "--no-progress")
	t.Logf("git fsck: %v\n%s", fsckErr, tail(fsck, 20))

	// Nothing refused reached the world; what was released did.
	reqs := w.requests()
	var reports int
	for _, r := range reqs {
		if strings.Contains(r, secret) || strings.Contains(r, "/hook") {
			t.Errorf("refused effect reached the world: %q", r)
		}
		if strings.HasPrefix(r, "http POST /reports report of run ") {
			reports++
		}
	}
	if reports != *flagRuns {
		t.Errorf("the world got %d reports, want %d", reports, *flagRuns)
	}
	t.Logf("%d runs (%d with refused effects), %d requests reached the world, %d conflicts reported", *flagRuns, bads, len(reqs), nConflicts)
	summary := summarise(rows)
	if err := os.WriteFile(filepath.Join(outDir, "summary.md"), []byte(summary), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("summary:\n%s", summary)
}

func mustWorkStateID(t *testing.T, work string) string {
	id, err := daemon.WorkStateID(work)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// columns is the union of the rows' columns, "run" first, then sorted.
func columns(rows []Row) []string {
	set := map[string]bool{}
	for _, r := range rows {
		for k := range r {
			set[k] = true
		}
	}
	delete(set, "run")
	cols := []string{"run"}
	var rest []string
	for k := range set {
		rest = append(rest, k)
	}
	sort.Strings(rest)
	return append(cols, rest...)
}

func writeCSV(t *testing.T, path string, rows []Row) {
	cols := columns(rows)
	var b strings.Builder
	b.WriteString(strings.Join(cols, ",") + "\n")
	for _, r := range rows {
		for i, c := range cols {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.FormatFloat(r[c], 'g', 8, 64))
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path+".tmp", []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}
