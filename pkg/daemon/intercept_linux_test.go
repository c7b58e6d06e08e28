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
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// Interception through the real sandbox (docs/interception.md): real
// clients inside a netns sandbox reach a TLS world through carbd, each
// trusting carbd's CA only through what carbd injects (the bundle over
// the system's, the environment). The world's CA is given to carbd as
// an upstream CA; the world logs every request it receives, whole.

// interceptPolicy gates no field of HTTP(S), TLS and DNS: what decides
// is the sensitivity of what a request carries against api.example.com's
// clearance (public), so a clean request is released before and after
// the agent read the key, and one carrying the key is deferred and
// refused by the strict oracle.
const interceptPolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
sensitive:
  - {name: keys, level: secret, paths: ["certs/**"]}
parties:
  - {name: api, hosts: ["api.example.com"], clearance: public}
operations:
  - {ops: ["http:*", "tls:*", "dns:query", "ws:*"], kind: blocking, gate: []}
  - {ops: ["file:*"], kind: stageable, gate: []}
defaults: {kind: blocking, gate: [target, credential, command]}
`

// tlsWorld is the world's HTTPS server: api.example.com with a
// certificate from the world's CA (trusted by carbd through UpstreamCAs),
// badcert.example with one from a CA nobody trusts, git http-backend
// under /git/, and a log of every request as it arrived.
type tlsWorld struct {
	caFile string // the world's CA (PEM)
	gitDir string // GIT_PROJECT_ROOT

	mu   sync.Mutex
	reqs []string // "HOST METHOD URI PROTO | header values | body"
}

func (w *tlsWorld) requests() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.reqs...)
}

// testCA is a CA for the tests' worlds.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) leaf(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: names[0]},
		DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serveTLSWorld serves the world's HTTPS on w's address, port 443
// (HTTP/2 and HTTP/1.1). files is a directory the sandbox can read (not
// under /tmp): the world's CA is written there for the client that is
// told to trust it instead of carbd's.
func serveTLSWorld(t *testing.T, w *world, files string, also ...netip.Addr) *tlsWorld {
	t.Helper()
	ca, rogue := newTestCA(t, "carbd test world CA"), newTestCA(t, "nobody's CA")
	api, bad := ca.leaf(t, "api.example.com", "api6.example.com"), rogue.leaf(t, "badcert.example")
	tw := &tlsWorld{caFile: filepath.Join(files, "world-ca.pem"), gitDir: t.TempDir()}
	if err := os.WriteFile(tw.caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	// A bare repository with one commit, pushable over smart HTTP.
	seed := t.TempDir()
	bare := filepath.Join(tw.gitDir, "repo.git")
	testutil.Run(t, "git", "init", "-q", "--bare", "-b", "main", bare)
	testutil.Run(t, "git", "-C", bare, "config", "http.receivepack", "true")
	testutil.Run(t, "git", "init", "-q", "-b", "main", seed)
	if err := os.WriteFile(filepath.Join(seed, "README"), []byte("seed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "git", "-C", seed, "add", "README")
	testutil.Run(t, "git", "-C", seed, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "seed")
	testutil.Run(t, "git", "-C", seed, "push", "-q", bare, "main")
	gitCGI := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Root: "/git",
		Env: []string{"GIT_PROJECT_ROOT=" + tw.gitDir, "GIT_HTTP_EXPORT_ALL=1"}}

	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var hv []string
		for k, vs := range r.Header {
			hv = append(hv, k+": "+strings.Join(vs, ","))
		}
		sort.Strings(hv)
		tw.mu.Lock()
		tw.reqs = append(tw.reqs, fmt.Sprintf("%s %s %s %s | %s | %s", r.Host, r.Method, r.RequestURI, r.Proto, strings.Join(hv, "; "), body))
		tw.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/git/") {
			r.Body = io.NopCloser(bytes.NewReader(body))
			gitCGI.ServeHTTP(rw, r)
			return
		}
		fmt.Fprintf(rw, "ok %s\n", r.URL.Path)
	}), TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if h.ServerName == "badcert.example" {
			return &bad, nil
		}
		return &api, nil
	}}}
	for _, a := range append([]netip.Addr{w.addr}, also...) {
		l := listenIn(t, w.ns, "tcp", netip.AddrPortFrom(a, 443).String())
		go srv.ServeTLS(l, "", "")
	}
	t.Cleanup(func() { srv.Close() })
	return tw
}

// worldIPv6 gives the world an IPv6 address, reachable from the host
// through a veth pair of its own (fd00:cbd6:<octet>::/64), and returns
// it.
func worldIPv6(t *testing.T, w *world, octet int) netip.Addr {
	t.Helper()
	hostIf := testutil.UniqueName("cw6")
	addr := netip.MustParseAddr(fmt.Sprintf("fd00:cbd6:%d::2", octet))
	testutil.Run(t, "ip", "link", "add", hostIf, "type", "veth", "peer", "name", "eth6", "netns", w.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", hostIf).Run() })
	testutil.Run(t, "ip", "-6", "addr", "add", fmt.Sprintf("fd00:cbd6:%d::1/64", octet), "dev", hostIf, "nodad")
	testutil.Run(t, "ip", "link", "set", hostIf, "up")
	testutil.Run(t, "ip", "-n", w.ns, "-6", "addr", "add", addr.String()+"/64", "dev", "eth6", "nodad")
	testutil.Run(t, "ip", "-n", w.ns, "link", "set", "eth6", "up")
	testutil.Run(t, "ip", "-n", w.ns, "-6", "route", "add", "default", "via", fmt.Sprintf("fd00:cbd6:%d::1", octet))
	return addr
}

// visibleDir is a directory the sandbox sees (read-only): it mounts
// fresh tmpfs over /tmp, /var/tmp, /run and /root.
func visibleDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/lib", "carbd-itest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// interceptScript is the agent: each client makes a clean request before
// the agent reads the key, then (after it read it) a clean request and
// the key in a body, a header, the query and the path; then the
// keep-alive and HTTP/2 sequences, git, an upstream certificate failure
// and a client that trusts another CA than carbd's.
const interceptScript = `set -u
U=https://api.example.com W=$PWD
TD=$TESTDATA
r() { c=$1 l=$2; shift 2; echo "$c $l $(cl $c "$@" 2>&1 | tr '\n' ' ')"; }
cl() {
  c=$1; shift; m=$1 u=$2 b=${3:-} h=${4:-}
  case $c in
  curl)
    set -- -sS -m 20 -X "$m" -o /tmp/body -w '%{http_code} %{http_version}'
    [ -n "$b" ] && set -- "$@" --data-binary "$b"
    [ -n "$h" ] && set -- "$@" -H "X-Data: $h"
    curl "$@" "$u"; echo " $(head -c 300 /tmp/body 2>/dev/null)";;
  urllib|requests) python3 $TD/httpsclient.py $c "$m" "$u" "$b" "$h";;
  node) node --no-warnings $TD/httpsclient.js "$m" "$u" "$b" "$h";;
  go) $BIN/httpsclient req "$m" "$u" "$b" "$h";;
  esac
}
CLIENTS="curl urllib requests node go"
command -v python3 >/dev/null && python3 -c 'import requests' 2>/dev/null || CLIENTS="curl urllib node go"
echo "clients: $CLIENTS"
for c in $CLIENTS; do r $c before GET $U/$c/before; done
git clone -q $U/git/repo.git /tmp/c1 2>&1; echo "git clone-before=$?"
key=$(grep -v -- ----- certs/service.pem)
for c in $CLIENTS; do
  r $c after GET $U/$c/after
  r $c body POST $U/$c/body "key=$key"
  r $c header GET $U/$c/header "" "$key"
  r $c query GET "$U/$c/query?k=$key"
  r $c path GET "$U/$c/path/$key"
done
# One HTTP/1.1 kept-alive connection and one HTTP/2 connection: a
# refused request between two released ones.
for v in 1.1 2; do
  curl -sS -m 20 --http$v -o /dev/null -o /dev/null -o /dev/null -w "curl ka$v %{http_code} %{http_version} connects=%{num_connects}\n" \
    "$U/curl/ka$v-1" "$U/curl/ka$v-2?k=$key" "$U/curl/ka$v-3"
done
for v in h1 h2; do $BIN/httpsclient ka $v "$U/go/ka$v-1" "$U/go/ka$v-2/$key" "$U/go/ka$v-3" | sed "s/^/go ka$v /"; done
# git: clone and push after the read, then the key in a header, the
# query and the path.
git clone -q $U/git/repo.git /tmp/c2 2>&1; echo "git clone-after=$?"
cd /tmp/c2 && echo change > change.txt && git add change.txt && git -c user.name=a -c user.email=a@example.com commit -q -m change && \
  git push -q origin main 2>&1; echo "git push=$?"; cd - >/dev/null
git -c http.extraHeader="X-Data: $key" ls-remote $U/git/repo.git >/dev/null 2>&1; echo "git header=$?"
git ls-remote "$U/git/repo.git?k=$key" >/dev/null 2>&1; echo "git query=$?"
git ls-remote "$U/git/$key/repo.git" >/dev/null 2>&1; echo "git path=$?"
# The key committed and pushed: the pack is compressed (zlib), so the
# engine cannot see into it: it is decided as opaque content (refused
# after the secret read, as the clean push above is).
cd /tmp/c2 && cp "$W/certs/service.pem" key.pem && git add key.pem && git -c user.name=a -c user.email=a@example.com commit -q -m key && \
  git push -q origin main >/dev/null 2>&1; echo "git push-key=$?"; cd - >/dev/null
# The upstream's certificate is not trusted: a 403 that says why.
curl -sS -m 20 -w ' badcert=%{http_code}\n' https://badcert.example/x
# A client that trusts another CA than carbd's fails closed.
curl -sS -m 20 --cacert $TD/../world-ca.pem $U/curl/othertrust >/dev/null 2>&1; echo "othertrust=$?"
exit 0
`

func TestInterceptClients(t *testing.T) {
	for _, tool := range []string{"curl", "git", "python3", "node"} {
		testutil.RequireTool(t, tool)
	}
	if _, err := os.Stat("/usr/lib/git-core/git-http-backend"); err != nil {
		t.Skipf("git http-backend: %v", err)
	}
	w := newWorld(t, 97)
	files := visibleDir(t)
	tw := serveTLSWorld(t, w, files)
	bin := filepath.Join(files, "bin")
	build := exec.Command(testutil.GoTool(), "build", "-o", filepath.Join(bin, "httpsclient"), "./testdata/httpsclient")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go client: %v\n%s", err, out)
	}
	td, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	// The client scripts are copied next to the binary: the checkout may
	// be under /tmp, which the sandbox does not see.
	tdSandbox := filepath.Join(files, "td")
	if err := os.MkdirAll(tdSandbox, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"httpsclient.py", "httpsclient.js"} {
		b, err := os.ReadFile(filepath.Join(td, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tdSandbox, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept.yaml", []byte(interceptPolicy))
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{} // the agent's output and carbd's log, written concurrently
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	_, err = Run(ctx, Config{ID: testutil.UniqueName("i"), StateDir: t.TempDir(), Policy: p, PolicyPath: "intercept.yaml",
		Workdir: work, Task: "Try every client against https://api.example.com", Argv: []string{"/bin/sh", "-c", interceptScript},
		UID: sandboxUID, GID: sandboxUID, Env: []string{"TESTDATA=" + tdSandbox, "BIN=" + bin},
		Hosts:       map[string][]netip.Addr{"api.example.com": {w.addr}, "badcert.example": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
		Intercept: InterceptConfig{CADir: t.TempDir(), UpstreamCAs: []string{tw.caFile}}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("run took %v; the agent saw:\n%s", time.Since(start).Round(time.Millisecond), text)
	reqs := tw.requests()
	t.Logf("the world saw:\n%s", strings.Join(reqs, "\n"))

	lines := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 {
			lines[f[0]+" "+f[1]] = strings.Join(f[2:], " ")
		}
	}
	clients := []string{"curl", "urllib", "requests", "node", "go"}
	if !strings.Contains(text, "clients: curl urllib requests node go") {
		t.Logf("python3-requests is not installed: requests not tried")
		clients = []string{"curl", "urllib", "node", "go"}
	}
	seen := func(path string) bool {
		for _, r := range reqs {
			if f := strings.Fields(r); len(f) > 2 && strings.HasPrefix(f[2], path) {
				return true
			}
		}
		return false
	}
	for _, c := range clients {
		for _, l := range []string{"before", "after"} {
			if got := lines[c+" "+l]; !strings.HasPrefix(got, "200") || !strings.Contains(got, "ok /"+c+"/"+l) {
				t.Errorf("%s, clean request %s the read: %q, want 200 and the world's answer", c, l, got)
			}
			if !seen("/" + c + "/" + l) {
				t.Errorf("%s, clean request %s the read: the world did not see it", c, l)
			}
		}
		for _, l := range []string{"body", "header", "query", "path"} {
			if got := lines[c+" "+l]; !strings.HasPrefix(got, "403") || !strings.Contains(got, "carbd") {
				t.Errorf("%s, the key in the %s: %q, want 403 with carbd's notice", c, l, got)
			}
			if seen("/" + c + "/" + l) {
				t.Errorf("%s, the key in the %s: the world saw the request", c, l)
			}
		}
	}
	for _, r := range reqs {
		if strings.Contains(r, workstateSecret) {
			t.Errorf("the key reached the world: %q", r)
		}
	}
	// Keep-alive and HTTP/2: the refused request in the middle, the
	// others complete on the same connection.
	for _, v := range []string{"1.1", "2"} {
		want := fmt.Sprintf("curl ka%s 200 %s connects=1\ncurl ka%s 403 %s connects=0\ncurl ka%s 200 %s connects=0", v, v, v, v, v, v)
		if !strings.Contains(text, want) {
			t.Errorf("curl --http%s on one connection: want\n%s", v, want)
		}
		if !seen("/curl/ka"+v+"-1") || !seen("/curl/ka"+v+"-3") || seen("/curl/ka"+v+"-2") {
			t.Errorf("curl --http%s on one connection: the world saw the wrong requests", v)
		}
	}
	for _, v := range []struct{ name, proto string }{{"h1", "HTTP/1.1"}, {"h2", "HTTP/2.0"}} {
		want := fmt.Sprintf("go ka%[1]s 200 %[2]s reused=false ok /go/ka%[1]s-1 \ngo ka%[1]s 403 %[2]s reused=true carbd", v.name, v.proto)
		if !strings.Contains(text, want) || !strings.Contains(text, fmt.Sprintf("go ka%[1]s 200 %[2]s reused=true ok /go/ka%[1]s-3", v.name, v.proto)) {
			t.Errorf("Go %s on one connection: want\n%s\n...200 reused=true", v.name, want)
		}
		if !seen("/go/ka"+v.name+"-1") || !seen("/go/ka"+v.name+"-3") || seen("/go/ka"+v.name+"-2") {
			t.Errorf("Go %s on one connection: the world saw the wrong requests", v.name)
		}
	}
	for _, l := range []string{"git clone-before=0", "git clone-after=0"} {
		if !strings.Contains(text, l) {
			t.Errorf("want %q", l)
		}
	}
	// A push after the secret read carries a compressed pack, which may
	// carry the secret: refused, whatever the commit holds.
	for _, l := range []string{"git push=0", "git push-key=0"} {
		if strings.Contains(text, l) {
			t.Errorf("%q: a push after the secret read went through", l)
		}
	}
	for _, l := range []string{"git header=0", "git query=0", "git path=0"} {
		if strings.Contains(text, l) {
			t.Errorf("%q: git succeeded with the key in the request", l)
		}
	}
	if !strings.Contains(text, "badcert=403") || !strings.Contains(text, "not trusted") {
		t.Errorf("the untrusted upstream: want a 403 saying its certificate is not trusted")
	}
	if !strings.Contains(text, "othertrust=60") || seen("/curl/othertrust") {
		t.Errorf("a client trusting another CA: want curl exit 60 and nothing upstream")
	}
	if b, err := exec.Command("git", "-C", filepath.Join(tw.gitDir, "repo.git"), "show", "main:key.pem").Output(); err == nil && strings.Contains(string(b), workstateSecret) {
		t.Errorf("the key inside a pushed git pack reached the world")
	}
	for _, r := range reqs {
		if strings.HasPrefix(r, "badcert.example") {
			t.Errorf("the untrusted upstream got a request: %q", r)
		}
	}
}

// The audit of intercepted HTTPS: the pcapng export carries the guest
// leg's TLS secrets as a Decryption Secrets Block, so tshark shows the
// decrypted requests (HTTP/1.1 and HTTP/2, over IPv4 and IPv6) with
// nothing but the file, each with its connection's decisions;
// InterceptConfig.KeyLog (carbd run --keylog) gets both legs' secrets,
// in a file only its owner reads. The guest's IPv6 HTTPS is redirected
// and decided like its IPv4.
func TestInterceptKeylogPcapng(t *testing.T) {
	testutil.RequireTool(t, "curl")
	tshark := testutil.RequireTool(t, "tshark")
	w := newWorld(t, 98)
	w6 := worldIPv6(t, w, 98)
	tw := serveTLSWorld(t, w, visibleDir(t), w6)
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept.yaml", []byte(interceptPolicy))
	if err != nil {
		t.Fatal(err)
	}
	state, id := t.TempDir(), testutil.UniqueName("i")
	keylog := filepath.Join(t.TempDir(), "keys.log")
	script := `set -u
U=https://api.example.com
curl -sS -m 20 --http1.1 $U/pcap/h1 -o /dev/null -w 'h1=%{http_code}\n'
curl -sS -m 20 --http2 $U/pcap/h2 -o /dev/null -w 'h2=%{http_code}\n'
key=$(grep -v -- ----- certs/service.pem)
curl -sS -m 20 --http1.1 --data-binary "$key" $U/pcap/refused -o /dev/null -w 'refused=%{http_code}\n'
curl -sS -m 20 -6 https://api6.example.com/pcap/v6 -o /dev/null -w 'v6=%{http_code} %{remote_ip}\n'
curl -sS -m 20 -6 --data-binary "$key" https://api6.example.com/pcap/v6-refused -o /dev/null -w 'v6refused=%{http_code}\n'
echo audit-now
i=0; while [ ! -e /run/carbd/audited ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
`
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Config{ID: id, StateDir: state, Policy: p, PolicyPath: "intercept.yaml",
			Workdir: work, Task: "Fetch https://api.example.com/pcap", Argv: []string{"/bin/sh", "-c", script},
			UID: sandboxUID, GID: sandboxUID, Hosts: map[string][]netip.Addr{"api.example.com": {w.addr}, "api6.example.com": {w6}},
			HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
			Intercept: InterceptConfig{CADir: t.TempDir(), UpstreamCAs: []string{tw.caFile}, KeyLog: keylog}})
		done <- err
	}()
	waitFor(t, 2*time.Minute, "the agent's requests", out, func() bool { return strings.Contains(out.String(), "audit-now") })
	pcap := filepath.Join(t.TempDir(), "audit.pcapng")
	f, err := os.Create(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (Client{Path: filepath.Join(state, "sandboxes", id, "operator.sock")}).Do(Request{Cmd: "audit"}, f); err != nil {
		t.Fatalf("audit export: %v", err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(state, "sandboxes", id, "agent", "audited"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	// The run's decision log stays in its state directory; the guest's
	// CA bundle (the host's roots) goes with the run.
	sb := filepath.Join(state, "sandboxes", id)
	if _, err := os.Stat(filepath.Join(sb, "ca-bundle.pem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the guest's CA bundle after the run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(sb, "audit.jsonl")); err != nil {
		t.Errorf("the run's decision log: %v", err)
	}
	text := out.String()
	for _, want := range []string{"h1=200", "h2=200", "refused=403", "v6=200 " + w6.String(), "v6refused=403"} {
		if !strings.Contains(text, want) {
			t.Errorf("the agent saw no %s:\n%s", want, text)
		}
	}
	var got []string
	for _, r := range tw.requests() {
		got = append(got, strings.Join(strings.Fields(r)[:3], " "))
	}
	want := []string{"api.example.com GET /pcap/h1", "api.example.com GET /pcap/h2", "api6.example.com GET /pcap/v6"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the world saw %q, want %q", got, want)
	}
	fields, err := exec.Command(tshark, "-r", pcap, "-Y", "http.request || http2.type == 1", "-T", "fields", "-E", "separator=|",
		"-e", "http.request.method", "-e", "http.request.uri", "-e", "http2.headers.path", "-e", "frame.comment").CombinedOutput()
	if err != nil {
		t.Fatalf("tshark: %v\n%s", err, fields)
	}
	t.Logf("tshark:\n%s", fields)
	// Each decrypted request is shown with its connection's decisions.
	for want, note := range map[string]string{"GET|/pcap/h1|": "release http:GET", "POST|/pcap/refused|": "refuse http:POST", "/pcap/h2": "release http:GET",
		"|/pcap/v6|": "release http:GET", "|/pcap/v6-refused|": "refuse http:POST"} {
		found := false
		for _, l := range strings.Split(string(fields), "\n") {
			if strings.Contains(l, want) {
				found = true
				if !strings.Contains(l, "carbd: intercepted: ") || !strings.Contains(l, note) {
					t.Errorf("the decrypted request %q: annotation %q, want the connection's decisions with %q", want, l, note)
				}
			}
		}
		if !found {
			t.Errorf("tshark does not show the decrypted request %q", want)
		}
	}
	st, err := os.Stat(keylog)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key log mode %v, want 0600", st.Mode().Perm())
	}
	b, err := os.ReadFile(keylog)
	if err != nil {
		t.Fatal(err)
	}
	randoms := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) == 3 && len(f[1]) == 64 {
			randoms[f[1]] = true
		} else {
			t.Errorf("key log line %q is not in the NSS format", l)
		}
	}
	// Five connections, each with two legs.
	if len(randoms) < 10 {
		t.Errorf("the key log has %d connections' secrets, want both legs of 5 connections", len(randoms))
	}
}
