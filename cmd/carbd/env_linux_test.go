package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
)

// headerWorld is a world namespace whose HTTP server records every
// request with its headers.
type headerWorld struct {
	addr netip.Addr
	mu   sync.Mutex
	reqs []string // "HOST METHOD PATH | HEADERS | BODY"
}

// spoof is the world's second address.
func (w *headerWorld) spoof() netip.Addr { return w.addr.Next() }

func (w *headerWorld) requests() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.reqs...)
}

func newHeaderWorld(t *testing.T, octet int) *headerWorld {
	t.Helper()
	testutil.ClaimWorldNet(t, octet)
	ns := testutil.NewNetNS(t)
	hostIf := testutil.UniqueName("cwe")
	w := &headerWorld{addr: netip.AddrFrom4([4]byte{198, 18, byte(octet), 2})}
	testutil.Run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	testutil.Run(t, "ip", "addr", "add", fmt.Sprintf("198.18.%d.1/29", octet), "dev", hostIf)
	testutil.Run(t, "ip", "link", "set", hostIf, "up")
	testutil.Run(t, "ip", "-n", ns, "addr", "add", w.addr.String()+"/29", "dev", "eth0")
	// A second address no name resolves to: where a spoofed Host header
	// would send a key.
	testutil.Run(t, "ip", "-n", ns, "addr", "add", w.spoof().String()+"/29", "dev", "eth0")
	testutil.Run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
	testutil.Run(t, "ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("198.18.%d.1", octet))
	l := listenIn(t, ns, ":80")
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var hs []string
		for k, v := range r.Header {
			hs = append(hs, k+": "+strings.Join(v, ","))
		}
		w.mu.Lock()
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if local != nil && !strings.HasPrefix(local.String(), w.addr.String()+":") {
			hs = append(hs, "AT "+local.String())
		}
		w.reqs = append(w.reqs, r.Host+" "+r.Method+" "+r.URL.Path+" | "+strings.Join(hs, "; ")+" | "+string(body))
		w.mu.Unlock()
		fmt.Fprintf(rw, "hello from %s\n", r.Host)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return w
}

// carbd run --env and --env-file end to end with real curl in the netns
// sandbox: the agent gets the values in its environment and in no
// process's argv; a key sent to the host it is bound to is released, to
// any other host refused with zero bytes upstream; no value appears in
// carbd's output, its audit log or its status.
func TestCLIEnvCredentials(t *testing.T) {
	testutil.RequireTool(t, "curl")
	bin := carbdBinary(t)
	w := newHeaderWorld(t, 146) // its own octet: pkg/daemon's TestSigtermTeardown, run in parallel by go test ./..., uses 93
	work := cliWorkdir(t)
	const (
		hostTok   = "tok-from-host-env-7f3a9c1e55"
		inlineTok = "inline-key-on-argv-04d2b8e6"
		fileTok   = "file-token-unbound-91ac7e20"
	)
	t.Setenv("CARBD_TEST_TOKEN", hostTok)
	envFile := filepath.Join(t.TempDir(), "agent.env")
	if err := os.WriteFile(envFile, []byte("# bound to nothing\nFILE_TOKEN="+fileTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sha := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:])[:16] }
	script := `set -u
echo "host=$(printf %s "$CARBD_TEST_TOKEN" | sha256sum | cut -c1-16)"
echo "inline=$(printf %s "$INLINE_KEY" | sha256sum | cut -c1-16)"
echo "file=$(printf %s "$FILE_TOKEN" | sha256sum | cut -c1-16)"
echo "plain=$PLAIN_LANG"
touch /run/carbd/ready
wait_for go
printf 'header = "Authorization: Bearer %s"\n' "$CARBD_TEST_TOKEN" > /tmp/h1
curl -sS -m 5 -K /tmp/h1 http://api.example.com/status; echo "bound=$?"
curl -sS -m 5 -K /tmp/h1 http://other.example.com/x; echo "other=$?"
curl -sS -m 5 -K /tmp/h1 -H "Host: api.example.com" http://SPOOF/status; echo "spoof=$?"
printf 'header = "X-Api-Key: %s"\n' "$INLINE_KEY" > /tmp/h2
curl -sS -m 5 -K /tmp/h2 http://api.example.com/inline; echo "inlinereq=$?"
printf 'data = "%s"\n' "$FILE_TOKEN" > /tmp/h3
curl -sS -m 5 -K /tmp/h3 http://api.example.com/upload; echo "filereq=$?"
touch /run/carbd/sent
wait_for end
`
	script = strings.ReplaceAll(script, "SPOOF", w.spoof().String())
	r := startRun(t, bin, &world{addr: w.addr}, work, script, "--host", "other.example.com="+w.addr.String(),
		"--task", "Fetch http://api.example.com/status, http://api.example.com/inline and http://other.example.com/x",
		"--env", "CARBD_TEST_TOKEN@api.example.com",
		"--env", "INLINE_KEY="+inlineTok+"@api.example.com",
		"--env-file", envFile,
		"--env", "PLAIN_LANG=C.UTF-8@*")
	agentDir := filepath.Join(r.state, "sandboxes", r.id, "agent")
	waitFor(t, 30*time.Second, "the agent to start", r.out, func() bool {
		_, err := os.Stat(filepath.Join(agentDir, "ready"))
		return err == nil
	})
	// No process on the host (carbd, the sandbox's init, the agent)
	// shows a value in its arguments.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	carbdSeen := false
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		carbdSeen = carbdSeen || strings.Contains(string(b), "INLINE_KEY=")
		for _, v := range []string{hostTok, inlineTok, fileTok} {
			if strings.Contains(string(b), v) {
				t.Errorf("%s shows a value: %q", p, strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	}
	if !carbdSeen {
		t.Errorf("carbd's own command line was not found among %d processes", len(procs))
	}
	if err := os.WriteFile(filepath.Join(agentDir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// The status once the requests are decided.
	waitFor(t, 60*time.Second, "the agent's requests", r.out, func() bool {
		_, err := os.Stat(filepath.Join(agentDir, "sent"))
		return err == nil
	})
	code, status, errOut := r.cli(t, "status", "--json")
	if code != 0 || !strings.Contains(status, `"refused": 3`) {
		t.Errorf("status: exit %d: %s\n%s", code, errOut, status)
	}
	if err := os.WriteFile(filepath.Join(agentDir, "end"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
	case <-time.After(90 * time.Second):
		t.Fatalf("carbd run did not end:\n%s", r.out.String())
	}
	out := r.out.String()
	for _, want := range []string{"host=" + sha(hostTok), "inline=" + sha(inlineTok), "file=" + sha(fileTok), "plain=C.UTF-8", "bound=0", "inlinereq=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("the agent's output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "other=0") || strings.Contains(out, "filereq=0") || strings.Contains(out, "spoof=0") {
		t.Errorf("a request carrying a key to a host it is not bound to succeeded:\n%s", out)
	}
	// The world: the bound requests with their keys, nothing else.
	reqs := w.requests()
	var sawBound, sawInline bool
	for _, q := range reqs {
		switch {
		case strings.HasPrefix(q, "api.example.com GET /status |") && strings.Contains(q, "Authorization: Bearer "+hostTok):
			sawBound = true
		case strings.HasPrefix(q, "api.example.com GET /inline |") && strings.Contains(q, "X-Api-Key: "+inlineTok):
			sawInline = true
		default:
			t.Errorf("the world saw a request it should not have: %q", q)
		}
	}
	if !sawBound || !sawInline {
		t.Errorf("the world saw %q, want the two bound requests with their keys", reqs)
	}
	audit, err := os.ReadFile(r.audit)
	if err != nil {
		t.Fatal(err)
	}
	stateAudit, _ := os.ReadFile(filepath.Join(r.state, "sandboxes", r.id, "audit.jsonl"))
	for what, text := range map[string]string{"output": out, "audit": string(audit), "state audit": string(stateAudit), "status": status} {
		for _, v := range []string{hostTok, inlineTok, fileTok} {
			if strings.Contains(text, v) {
				t.Errorf("the %s holds a value:\n%s", what, text)
			}
		}
	}
	spoofed := false
	for _, l := range strings.Split(string(audit), "\n") {
		spoofed = spoofed || strings.Contains(l, `"addr":"`+w.spoof().String()+`"`) && strings.Contains(l, `"code":"credential-unbound","rule":"CARBD_TEST_TOKEN"`)
	}
	if !spoofed {
		t.Errorf("the request with a spoofed Host header was not refused for its credential:\n%s", audit)
	}
	for _, want := range []string{`"code":"credential-unbound","rule":"CARBD_TEST_TOKEN"`, `"code":"credential-unbound","rule":"FILE_TOKEN"`, "$CARBD_TEST_TOKEN", "$INLINE_KEY"} {
		if !strings.Contains(string(audit), want) {
			t.Errorf("the audit lacks %q:\n%s", want, audit)
		}
	}
}
