package intercept

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// The same script for every real client: a clean request, a refused
// upload, then on one kept-alive connection a released, a refused and a
// released request. Each client prints one line per request:
// "<status> <body with newlines removed>".

const pyScript = `
import sys, ssl, urllib.request, urllib.error, http.client
base, cafile, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(cafile=cafile)
def show(status, body):
    print(status, body.decode().replace("\n", " "))
def urlopen(req):
    try:
        with urllib.request.urlopen(req, context=ctx) as r:
            show(r.status, r.read())
    except urllib.error.HTTPError as e:
        show(e.code, e.read())
urlopen(base + "/hello")
urlopen(urllib.request.Request(base + "/upload", data=b"token=` + secret + `", method="POST"))
c = http.client.HTTPSConnection("localhost", port, context=ctx)
for method, path, body in [("GET", "/ka1", None), ("GET", "/ka2?token=` + secret + `", None), ("GET", "/ka3", None)]:
    c.request(method, path, body=body)
    r = c.getresponse()
    show(r.status, r.read())
`

const nodeScript = `
const base = process.argv[2];
async function req(path, init) {
  const r = await fetch(base + path, init);
  console.log(r.status, (await r.text()).replace(/\n/g, " "));
}
(async () => {
  await req("/hello");
  // Node's fetch (undici) alternates between two connections for
  // sequential requests; one connection per origin keeps them on one.
  const sym = Symbol.for("undici.globalDispatcher.1");
  const Agent = globalThis[sym].constructor;
  globalThis[sym] = new Agent({connections: 1});
  await req("/upload", {method: "POST", body: "token=` + secret + `"});
  await req("/ka1");
  await req("/ka2?token=` + secret + `");
  await req("/ka3");
})().catch(e => { console.error(e); process.exit(3); });
`

func curlArgs(tp *testProxy, h2 bool) []string {
	a := []string{"-sS", "--cacert", tp.caFile, "--no-progress-meter"}
	if h2 {
		return append(a, "--http2")
	}
	return append(a, "--http1.1")
}

// runCurl runs the script with curl: one invocation for the clean
// request, one for the refused upload, one with three URLs that curl
// sends on one connection.
func runCurl(t *testing.T, tp *testProxy, h2 bool) string {
	curl := testutil.RequireTool(t, "curl")
	w := []string{"-w", `%{http_code}\n`}
	var out strings.Builder
	run := func(args ...string) {
		cmd := exec.Command(curl, append(curlArgs(tp, h2), args...)...)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, b)
		}
		out.Write(b)
	}
	run(append(w, tp.url("/hello"))...)
	run(append(w, "-d", "token="+secret, tp.url("/upload"))...)
	run(append(w, tp.url("/ka1"), tp.url("/ka2?token="+secret), tp.url("/ka3"))...)
	return curlLines(out.String())
}

// curlLines turns curl's "body...code\n" output into "code body" lines.
func curlLines(s string) string {
	var lines []string
	body := ""
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if len(l) >= 3 && strings.Trim(l[len(l)-3:], "0123456789") == "" {
			code := l[len(l)-3:]
			body += l[:len(l)-3]
			lines = append(lines, code+" "+strings.TrimSpace(body))
			body = ""
			continue
		}
		body += l + " "
	}
	return strings.Join(lines, "\n")
}

func TestRealClients(t *testing.T) {
	clients := []struct {
		name string
		h2   bool
		run  func(t *testing.T, tp *testProxy) string
	}{
		{"curl-http1.1", false, func(t *testing.T, tp *testProxy) string { return runCurl(t, tp, false) }},
		{"curl-http2", true, func(t *testing.T, tp *testProxy) string { return runCurl(t, tp, true) }},
		{"python3", false, func(t *testing.T, tp *testProxy) string {
			py := testutil.RequireTool(t, "python3")
			return runScript(t, exec.Command(py, "-c", pyScript, tp.url(""), tp.caFile, itoa(int(tp.addr.Port()))))
		}},
		{"node", false, func(t *testing.T, tp *testProxy) string {
			node := testutil.RequireTool(t, "node")
			f := filepath.Join(t.TempDir(), "client.js")
			if err := os.WriteFile(f, []byte(nodeScript), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(node, "--dns-result-order=ipv4first", f, tp.url(""))
			cmd.Env = append(os.Environ(), "NODE_EXTRA_CA_CERTS="+tp.caFile)
			return runScript(t, cmd)
		}},
	}
	for _, cl := range clients {
		t.Run(cl.name, func(t *testing.T) {
			w := newWorld(t)
			tp := newTestProxy(t, w, nil)
			out := cl.run(t, tp)
			lines := strings.Split(out, "\n")
			wantProto := "HTTP/1.1"
			if cl.h2 {
				wantProto = "HTTP/2.0"
			}
			want := []string{
				"200 hello from the world: " + wantProto + " GET /hello",
				"403 carbd: request refused: the request carries a sensitive value in body",
				"200 hello from the world: " + wantProto + " GET /ka1",
				"403 carbd: request refused: the request carries a sensitive value in url",
				"200 hello from the world: " + wantProto + " GET /ka3",
			}
			if len(lines) != len(want) {
				t.Fatalf("output:\n%s", out)
			}
			for i := range want {
				if !strings.HasPrefix(lines[i], want[i]) {
					t.Errorf("request %d: %q, want prefix %q", i, lines[i], want[i])
				}
			}
			if n := w.bytesWith(secret); n != 0 {
				t.Errorf("%d requests with the secret reached the world", n)
			}
			var uris []string
			for _, r := range w.received() {
				uris = append(uris, r.URI)
			}
			if strings.Join(uris, " ") != "/hello /ka1 /ka3" {
				t.Errorf("the world received %v", uris)
			}
			// The last three requests came on one connection.
			reqs := tp.dec.seen()
			if len(reqs) != 5 {
				t.Fatalf("decider saw %d requests", len(reqs))
			}
			if reqs[2].Client != reqs[3].Client || reqs[3].Client != reqs[4].Client {
				t.Errorf("keep-alive requests on several connections: %v %v %v", reqs[2].Client, reqs[3].Client, reqs[4].Client)
			}
		})
	}
}

// TestRealClientsFailClosed: curl given an untrusting bundle fails the
// handshake (exit 60); curl against a world whose certificate the proxy
// does not trust gets the 403 notice. Nothing reaches the world.
func TestRealClientsFailClosed(t *testing.T) {
	curl := testutil.RequireTool(t, "curl")
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	cmd := exec.Command(curl, "-sS", "--cacert", w.caFile, tp.url("/hello"))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 60 {
		t.Errorf("curl without carbd's CA: %v\n%s", err, out)
	}
	py := testutil.RequireTool(t, "python3")
	out, err = exec.Command(py, "-c", `import sys, urllib.request, ssl
urllib.request.urlopen(sys.argv[1], context=ssl.create_default_context(cafile=sys.argv[2]))`, tp.url("/hello"), w.caFile).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "CERTIFICATE_VERIFY_FAILED") {
		t.Errorf("python3 without carbd's CA: %v\n%s", err, out)
	}
	other := newWorld(t)
	tp2 := newTestProxy(t, w, func(c *Config) { c.UpstreamCAFiles = []string{other.caFile} })
	for _, h2 := range []bool{false, true} {
		out, err = exec.Command(curl, append(curlArgs(tp2, h2), "-w", `%{http_code}\n`, tp2.url("/hello"))...).CombinedOutput()
		if err != nil || !strings.HasPrefix(curlLines(string(out)), "403 carbd: request refused: intercept: upstream certificate of localhost") {
			t.Errorf("h2=%v: curl to an untrusted world: %v\n%s", h2, err, out)
		}
	}
	if n := len(w.received()); n != 0 {
		t.Errorf("the world received %d requests", n)
	}
}

func runScript(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("%v: %v\n%s%s", cmd.Args[:1], err, out, stderr)
	}
	return strings.TrimRight(string(out), "\n")
}

func itoa(n int) string { return strconv.Itoa(n) }
