package daemon

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// The policy's intercept section in a real sandbox run
// (docs/interception.md): a pass party spliced to the world (the client
// sees the world's own certificate, the audit has its tls:connect and no
// request), an intercepted party, an extra TLS port, a client that
// refuses carbd's CA (closed, then passed with on_refused_ca: pass),
// QUIC to the intercepted ports refused.

const interceptPassPolicy = interceptPolicy + `
intercept:
  ports: [8443]
  pass: ["pinned.example"]
  on_refused_ca: pass
`

// passWorld is the world of these tests: HTTPS on 443 and 8443 for
// api.example.com, pinned.example and refuser.example (one certificate
// from the world's CA), and UDP listeners on 443 and 8443 that record
// every datagram.
type passWorld struct {
	caFile string
	mu     sync.Mutex
	reqs   []string // "HOST:PORT METHOD URI"
	udp    []string // "PORT LEN"
}

func (pw *passWorld) requests() []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return append([]string(nil), pw.reqs...)
}

func (pw *passWorld) datagrams() []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return append([]string(nil), pw.udp...)
}

func servePassWorld(t *testing.T, w *world, files string, also ...netip.Addr) *passWorld {
	t.Helper()
	ca := newTestCA(t, "carbd pass test world CA")
	leaf := ca.leaf(t, "api.example.com", "api6.example.com", "pinned.example", "refuser.example")
	pw := &passWorld{caFile: filepath.Join(files, "pass-world-ca.pem")}
	if err := os.WriteFile(pw.caFile, ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ap := range listenAddrs(append([]netip.Addr{w.addr}, also...), 443, 8443) {
		port := ap.Port()
		srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			pw.mu.Lock()
			pw.reqs = append(pw.reqs, fmt.Sprintf("%s:%d %s %s", r.Host, port, r.Method, r.RequestURI))
			pw.mu.Unlock()
			fmt.Fprintf(rw, "world %d %s\n", port, r.URL.Path)
		}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{leaf}}}
		l := listenIn(t, w.ns, "tcp", ap.String())
		go srv.ServeTLS(l, "", "")
		t.Cleanup(func() { srv.Close() })
		var pc net.PacketConn
		if err := netnsx.DoNamed(w.ns, func() (err error) {
			pc, err = net.ListenPacket("udp", ap.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				pw.mu.Lock()
				pw.udp = append(pw.udp, fmt.Sprintf("%d %d", port, n))
				pw.mu.Unlock()
			}
		}()
	}
	return pw
}

// listenAddrs are the addresses with each port.
func listenAddrs(addrs []netip.Addr, ports ...uint16) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range addrs {
		for _, p := range ports {
			out = append(out, netip.AddrPortFrom(a, p))
		}
	}
	return out
}

// passScript is the agent. Each line it prints is "NAME RESULT".
const passScript = `set -u
WCA=$FILES/pass-world-ca.pem
c() { n=$1; shift; echo "$n $(curl -sS -m 20 -o /tmp/b -w '%{http_code}' "$@" 2>&1 | tr '\n' ' ') $(head -c 100 /tmp/b 2>/dev/null | tr '\n' ' ')"; rm -f /tmp/b; }
# A pass party: the client trusts only the world's CA, so it succeeds
# only if it sees the world's own certificate.
c pass --cacert $WCA https://pinned.example/pass
# Intercepted: carbd's CA (the bundle carbd injects).
c intercepted https://api.example.com/intercepted
# An extra TLS port of the policy's intercept.ports, IPv4 and IPv6.
c extra https://api.example.com:8443/extra
c extra6 -6 https://api6.example.com:8443/extra6
# A client that refuses carbd's CA: closed; then (on_refused_ca: pass)
# the same server name passes through opaque.
c refuser1 --cacert $WCA https://refuser.example/first
c refuser2 --cacert $WCA https://refuser.example/second
# QUIC: UDP to 443 and 8443 is refused, nothing leaves.
python3 -c '
import socket
for port in (443, 8443):
    for fam, host in ((socket.AF_INET, "api.example.com"), (socket.AF_INET6, "api6.example.com")):
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.sendto(b"\xc3\x00\x00\x00\x01" + bytes(1200), (host, port))
print("udp sent")'
curl -sS -m 5 --http3 https://api.example.com/h3 >/dev/null 2>&1; echo "http3 $?"
# A passed connection kept alive: its second request comes after the
# agent read the key, so it is decided again (opaque: it may carry the
# key) and cut before it leaves.
python3 -c '
import ssl, http.client, sys
ctx = ssl.create_default_context(cafile=sys.argv[1])
c = http.client.HTTPSConnection("pinned.example", 443, context=ctx, timeout=20)
c.request("GET", "/ka1"); r = c.getresponse(); print("ka1", r.status, r.read().decode().strip())
open("certs/service.pem").read()
try:
    c.request("GET", "/ka2"); r = c.getresponse(); print("ka2", r.status, r.read().decode().strip())
except Exception as e:
    print("ka2 failed", type(e).__name__)
' $WCA
# After the read, a new pass connection carries the key as far as carbd
# can tell: refused before any byte goes upstream.
c pass-after --cacert $WCA https://pinned.example/pass-after
exit 0
`

func TestInterceptPolicySection(t *testing.T) {
	testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "python3")
	w := newWorld(t, 143)
	w6 := worldIPv6(t, w, 143)
	files := visibleDir(t)
	pw := servePassWorld(t, w, files, w6)
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept-pass.yaml", []byte(interceptPassPolicy))
	if err != nil {
		t.Fatal(err)
	}
	state, id := t.TempDir(), testutil.UniqueName("ip")
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, err = Run(ctx, Config{ID: id, StateDir: state, Policy: p, PolicyPath: "intercept-pass.yaml",
		Workdir: work, Task: "Fetch https://api.example.com and https://pinned.example", Argv: []string{"/bin/sh", "-c", passScript},
		UID: sandboxUID, GID: sandboxUID, Env: []string{"FILES=" + files},
		Hosts:       map[string][]netip.Addr{"api.example.com": {w.addr}, "api6.example.com": {w6}, "pinned.example": {w.addr}, "refuser.example": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
		Intercept: InterceptConfig{CADir: t.TempDir(), UpstreamCAs: []string{pw.caFile}}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("the agent saw:\n%s", text)
	reqs := pw.requests()
	t.Logf("the world saw:\n%s", strings.Join(reqs, "\n"))
	lines := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if name, rest, ok := strings.Cut(l, " "); ok {
			lines[name] = strings.TrimSpace(rest)
		}
	}
	seen := func(uri string) bool {
		for _, r := range reqs {
			if strings.HasSuffix(r, " "+uri) {
				return true
			}
		}
		return false
	}
	for name, want := range map[string]string{
		"pass":        "200 world 443 /pass",
		"intercepted": "200 world 443 /intercepted",
		"extra":       "200 world 8443 /extra",
		"extra6":      "200 world 8443 /extra6",
		"refuser2":    "200 world 443 /second",
		"ka1":         "200 world 443 /ka1",
	} {
		if got := lines[name]; got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	// The refusing client's first connection was intercepted: carbd's
	// certificate, which it does not trust: curl exit 60, nothing
	// upstream.
	if got := lines["refuser1"]; !strings.HasSuffix(got, "000") || !strings.Contains(got, "curl: (60)") {
		t.Errorf("refuser1: %q, want curl's certificate failure", got)
	}
	for _, uri := range []string{"/first", "/ka2", "/pass-after"} {
		if seen(uri) {
			t.Errorf("the world saw %s", uri)
		}
	}
	if got := lines["ka2"]; !strings.HasPrefix(got, "failed") {
		t.Errorf("ka2 (after the key was read, on a passed connection): %q, want the connection cut", got)
	}
	if got := lines["pass-after"]; !strings.HasSuffix(got, "000") {
		t.Errorf("pass-after: %q, want the connection refused", got)
	}
	if !strings.Contains(text, "udp sent") {
		t.Errorf("the UDP sends did not run")
	}
	if got := lines["http3"]; got == "0" {
		t.Errorf("curl --http3 succeeded")
	}
	if d := pw.datagrams(); len(d) != 0 {
		t.Errorf("UDP reached the world: %q", d)
	}

	// The audit: the pass party's connections are tls:connect decisions,
	// opaque, and nothing of their content; the refusal of carbd's CA a
	// tls:ca-refused record; the extra port's request an http:GET.
	type auditRec struct {
		Type    string `json:"type"`
		Seq     uint64 `json:"seq"`
		Verdict string `json:"verdict"`
		SNI     string `json:"sni"`
		Alert   string `json:"alert"`
		Event   *struct {
			Op     string `json:"op"`
			Obj    string `json:"obj"`
			Opaque bool   `json:"opaque"`
			Dest   *struct {
				Host string `json:"host"`
				Port uint16 `json:"port"`
			} `json:"dest"`
		} `json:"event"`
	}
	f, err := os.Open(filepath.Join(state, "sandboxes", id, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		passSeqs  []uint64              // the pass parties' tls:connect effects, in order
		final     = map[uint64]string{} // their latest verdict (a deferred one's resolution)
		caRefused []string
		extraGets int
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r auditRec
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		switch {
		case r.Type == "tls:ca-refused":
			caRefused = append(caRefused, r.SNI+" "+r.Alert)
		case r.Event == nil:
		case r.Event.Op == "tls:connect" && (strings.HasPrefix(r.Event.Obj, "pinned.example:") || strings.HasPrefix(r.Event.Obj, "refuser.example:")):
			if _, ok := final[r.Seq]; !ok {
				passSeqs = append(passSeqs, r.Seq)
			}
			what := "intercepted"
			if r.Event.Opaque {
				what = "opaque"
			}
			final[r.Seq] = r.Event.Obj + " " + what + " " + r.Verdict
		case strings.HasPrefix(r.Event.Op, "http:") && r.Event.Dest != nil && (r.Event.Dest.Host == "pinned.example" || r.Event.Dest.Host == "refuser.example"):
			t.Errorf("an http record of a passed connection: %s %s", r.Event.Op, r.Event.Obj)
		case strings.HasPrefix(r.Event.Op, "http:") && r.Event.Dest != nil && r.Event.Dest.Port == 8443:
			extraGets++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var passConnects []string
	for _, seq := range passSeqs {
		passConnects = append(passConnects, final[seq])
	}
	t.Logf("pass connections: %q; ca-refused: %q", passConnects, caRefused)
	if len(caRefused) != 1 || caRefused[0] != "refuser.example tls: unknown certificate authority" {
		t.Errorf("tls:ca-refused records %q, want one for refuser.example", caRefused)
	}
	// pass, refuser1 (intercepted: then its client refused carbd's CA),
	// refuser2, ka1, ka2 (decided again after the read), pass-after.
	want := []string{"pinned.example:443 opaque release", "refuser.example:443 intercepted release", "refuser.example:443 opaque release",
		"pinned.example:443 opaque release", "pinned.example:443 opaque refuse", "pinned.example:443 opaque refuse"}
	if strings.Join(passConnects, ",") != strings.Join(want, ",") {
		t.Errorf("the pass connections' decisions %q, want %q", passConnects, want)
	}
	if extraGets != 2 {
		t.Errorf("%d http records of requests on port 8443, want 2 (IPv4 and IPv6)", extraGets)
	}
}
