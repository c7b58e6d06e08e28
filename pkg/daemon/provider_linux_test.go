package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// serveTLS serves HTTPS in the world's namespace with a self-signed
// certificate for names, recording each request in w. It returns the
// certificate's PEM file, for carbd's interception to trust upstream.
func serveTLS(t *testing.T, w *world, names ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	l := listenIn(t, w.ns, "tcp", netip.AddrPortFrom(w.addr, 443).String())
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.reqs = append(w.reqs, strings.Join([]string{r.Host, r.Method, r.URL.Path, "tls"}, " "))
		w.mu.Unlock()
		fmt.Fprintf(rw, "model %s\n", r.Host)
	}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	pemFile := filepath.Join(t.TempDir(), "world.pem")
	if err := os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return pemFile
}

// The shipped examples/policy.yaml lets an agent reach its model
// providers out of the box (their DNS names and their TLS traffic),
// refuses the lookups an agent makes on its own at start (codex: github,
// chatgpt) quietly (no question to the operator, one audit line each, an
// answer to the resolver instead of a timeout), and lets nothing else
// out unasked.
func TestExamplePolicyModelProvider(t *testing.T) {
	testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "dig")
	p, err := decide.LoadPolicy(filepath.Join("..", "..", "examples", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, 94)
	worldCA := serveTLS(t, w, "api.openai.com", "api.anthropic.com", "example.org")
	work := workdir(t)
	agentHosts := []string{"github.com", "api.github.com", "chatgpt.com", "ab.chatgpt.com"}
	hosts := map[string][]netip.Addr{"api.openai.com": {w.addr}, "api.anthropic.com": {w.addr}, "example.org": {w.addr}}
	for _, h := range agentHosts {
		hosts[h] = []netip.Addr{w.addr}
	}
	script := `set -u
for h in api.openai.com api.anthropic.com; do
  echo "dns $h: $(dig +tries=1 +time=5 +short $h A | head -1)"
  curl -sS -k -m 10 https://$h/v1/models -o /dev/null -w "tls $h: %{http_code}\n"
done
for h in ` + strings.Join(agentHosts, " ") + `; do
  echo "dns $h: $(dig +tries=1 +time=5 $h A | grep -o 'status: [A-Z]*\|timed out\|unreachable' | head -1)"
done
command -v node >/dev/null && node -e 'const dns = require("dns"); dns.setServers(dns.getServers()); dns.resolve4("update.example.dev", (e, a) => console.log("c-ares update.example.dev: " + (e ? e.code : a)))'

curl -sS -k -m 5 https://example.org/ -o /dev/null; echo "unasked=$?"
`
	op := decide.NewOperator(time.Minute)
	auditPath := filepath.Join(t.TempDir(), "audit.jsonl")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := Run(ctx, Config{ID: testutil.UniqueName("m"), StateDir: t.TempDir(), Policy: p, PolicyPath: "examples/policy.yaml",
		Workdir: work, Task: "Summarise README.md", Argv: []string{"/bin/sh", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Oracle: op, Operator: op, Hosts: hosts, HoldTimeout: 3 * time.Second, AuditPath: auditPath, Stdout: &out, Stderr: &out,
		Intercept: InterceptConfig{UpstreamCAs: []string{worldCA}}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("agent:\n%s", text)
	for _, h := range []string{"api.openai.com", "api.anthropic.com"} {
		if !strings.Contains(text, "dns "+h+": "+w.addr.String()) || !strings.Contains(text, "tls "+h+": 200") {
			t.Errorf("the model provider %s is not reachable out of the box:\n%s", h, text)
		}
	}
	// The resolver gets an answer at once (NXDOMAIN, as a DNS firewall
	// gives), so stub resolvers neither wait nor retry.
	for _, h := range agentHosts {
		if !strings.Contains(text, "dns "+h+": status: NXDOMAIN") {
			t.Errorf("the agent's own lookup of %s was not answered NXDOMAIN:\n%s", h, text)
		}
	}
	if strings.Contains(text, "c-ares update.example.dev:") && !strings.Contains(text, "c-ares update.example.dev: ENOTFOUND") {
		t.Errorf("node's resolver (c-ares) was not answered at once:\n%s", text)
	}
	if strings.Contains(text, "unasked=0") {
		t.Errorf("an unasked destination was reached:\n%s", text)
	}

	var tlsReqs []string
	for _, r := range w.requests() {
		tlsReqs = append(tlsReqs, r)
		if !strings.HasPrefix(r, "api.openai.com ") && !strings.HasPrefix(r, "api.anthropic.com ") {
			t.Errorf("the world saw a request it should not have: %q", r)
		}
	}
	if len(tlsReqs) != 2 {
		t.Errorf("the world saw %q, want one request to each model provider", tlsReqs)
	}
	// Quiet: nobody asked the operator about the agent's own lookups,
	// and each is one audit line.
	audit, err := os.ReadFile(auditPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(audit)), "\n") {
		var r decide.AuditRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		if r.Event != nil && r.Event.Op == decide.OpDNSQuery {
			lines[r.Event.Obj]++
			if r.Layer == decide.LayerOracle {
				t.Errorf("the oracle was asked about a lookup: %s", l)
			}
		}
	}
	for _, h := range append(agentHosts, "update.example.dev") {
		if lines[h] != 1 {
			t.Errorf("%d audit lines for the lookup of %s, want 1 (no retry)", lines[h], h)
		}
	}
	_ = sum
}

// Without interception, TLS is decided by its server name: a connection
// to another address that claims the model provider's name (curl
// --resolve, no lookup through carbd) is not the provider's internal
// channel, and does not get out.
func TestProviderNameNotTakenOnTrust(t *testing.T) {
	testutil.RequireTool(t, "curl")
	p, err := decide.LoadPolicy(filepath.Join("..", "..", "examples", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, 95)
	serveTLS(t, w, "api.openai.com")
	script := `curl -sS -k -m 8 --resolve api.openai.com:443:` + w.addr.String() + ` https://api.openai.com/v1/spoof -o /dev/null; echo "spoof=$?"`
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = Run(ctx, Config{ID: testutil.UniqueName("m"), StateDir: t.TempDir(), Policy: p, PolicyPath: "examples/policy.yaml",
		Workdir: workdir(t), Task: "Summarise README.md", Argv: []string{"/bin/sh", "-c", script}, UID: sandboxUID, GID: sandboxUID,
		Oracle: decide.Strict{}, HoldTimeout: 3 * time.Second, Stdout: &out, Stderr: &out, Intercept: InterceptConfig{Off: true}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if strings.Contains(out.String(), "spoof=0") || len(w.requests()) != 0 {
		t.Errorf("a connection claiming the provider's name reached another address: %q\n%s", w.requests(), out.String())
	}
}
