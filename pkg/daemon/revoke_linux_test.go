package daemon

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// revokeScript keeps one HTTPS connection to pinned.example alive (TLS is
// not intercepted: the flow is opaque, decided by its server name and
// released to its end), sends two requests on it, reads the private key,
// and sends a third: the connection is decided again at its next packet
// and refused, since opaque content may carry what the agent read. The
// agent pauses after the read, so the read is delivered before the
// send (RevokeOpen); TestOpaqueFlowReadRace sends with no pause (the read
// generation).
const revokeScript = `set -u
python3 -c '
import ssl, http.client, sys
ctx = ssl.create_default_context(cafile=sys.argv[1])
c = http.client.HTTPSConnection("pinned.example", 443, context=ctx, timeout=15)
for path in ("/before1", "/before2"):
    c.request("GET", path); r = c.getresponse(); print(path[1:], r.status, r.read().decode().strip())
open("certs/service.pem").read()
import time; time.sleep(2)
try:
    c.request("GET", "/after"); r = c.getresponse(); print("after", r.status, r.read().decode().strip())
except Exception as e:
    print("after failed", type(e).__name__)
' $FILES/pass-world-ca.pem
exit 0
`

// TestOpaqueFlowDecidedAgainAfterRead: with interception off, a released
// TLS connection whose agent then reads a secret carries no more bytes
// upstream (DESIGN, "Release a byte range, not a flow").
func TestOpaqueFlowDecidedAgainAfterRead(t *testing.T) {
	testutil.RequireTool(t, "python3")
	w := newWorld(t, 144)
	files := visibleDir(t)
	pw := servePassWorld(t, w, files)
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept.yaml", []byte(interceptPolicy))
	if err != nil {
		t.Fatal(err)
	}
	state, id := t.TempDir(), testutil.UniqueName("rv")
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err = Run(ctx, Config{ID: id, StateDir: state, Policy: p, PolicyPath: "intercept.yaml",
		Workdir: work, Task: "Fetch https://pinned.example", Argv: []string{"/bin/sh", "-c", revokeScript},
		UID: sandboxUID, GID: sandboxUID, Env: []string{"FILES=" + files},
		Hosts:       map[string][]netip.Addr{"pinned.example": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
		Intercept: InterceptConfig{Off: true}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Logf("the agent saw:\n%s", text)
	reqs := pw.requests()
	t.Logf("the world saw:\n%s", strings.Join(reqs, "\n"))
	for _, want := range []string{"before1 200", "before2 200", "after failed"} {
		if !strings.Contains(text, want) {
			t.Errorf("the agent's output lacks %q", want)
		}
	}
	got := map[string]bool{}
	for _, r := range reqs {
		f := strings.Fields(r)
		got[f[len(f)-1]] = true
	}
	if !got["/before1"] || !got["/before2"] {
		t.Errorf("the world missed a request sent before the read: %q", reqs)
	}
	if got["/after"] {
		t.Errorf("a request sent on the released opaque connection after the agent read the key reached the world: %q", reqs)
	}
}
