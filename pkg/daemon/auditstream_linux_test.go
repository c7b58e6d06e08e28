package daemon

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
)

// The streamed pcapng audit of a finished run, kept in the working
// directory's state: mode 0600, listed by ListRuns, the interception's
// keys in it (tshark shows the intercepted HTTPS decrypted with nothing
// but the file), every frame commented with carbd's final verdict.
func TestAuditStreamIntercepted(t *testing.T) {
	testutil.RequireTool(t, "curl")
	tshark := testutil.RequireTool(t, "tshark")
	w := newWorld(t, 118)
	tw := serveTLSWorld(t, w, visibleDir(t))
	work := secretWorkdir(t)
	p, err := decide.ParsePolicy("intercept.yaml", []byte(interceptPolicy))
	if err != nil {
		t.Fatal(err)
	}
	state, id, wstate := t.TempDir(), testutil.UniqueName("a"), t.TempDir()
	script := `set -u
U=https://api.example.com
curl -sS -m 20 --http1.1 $U/stream/ok -o /dev/null -w 'ok=%{http_code}\n'
key=$(grep -v -- ----- certs/service.pem)
curl -sS -m 20 --http1.1 --data-binary "$key" $U/stream/refused -o /dev/null -w 'refused=%{http_code}\n'
`
	out := &syncBuffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err = Run(ctx, Config{ID: id, StateDir: state, WorkStateDir: wstate, Policy: p, PolicyPath: "intercept.yaml",
		Workdir: work, Task: "Fetch https://api.example.com/stream", Argv: []string{"/bin/sh", "-c", script},
		UID: sandboxUID, GID: sandboxUID, Hosts: map[string][]netip.Addr{"api.example.com": {w.addr}},
		HoldTimeout: 3 * time.Second, Stdout: out, Stderr: out,
		Intercept: InterceptConfig{CADir: t.TempDir(), UpstreamCAs: []string{tw.caFile}}})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if text := out.String(); !strings.Contains(text, "ok=200") || !strings.Contains(text, "refused=403") {
		t.Fatalf("the agent's requests:\n%s", text)
	}
	runs, err := ListRuns(filepath.Dir(wstate))
	if err != nil {
		t.Fatal(err)
	}
	var info RunInfo
	for _, r := range runs {
		if r.Sandbox == id {
			info = r
		}
	}
	if want := filepath.Join(wstate, "runs", info.Run, "audit.pcapng"); info.Pcap != want || !info.Finished || info.Frames == 0 || info.Dropped != 0 {
		t.Fatalf("run %+v, want a finished run with frames in %s", info, want)
	}
	for _, p := range []string{info.Pcap, info.Dir} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm&0o077 != 0 {
			t.Errorf("%s: mode %v, want nothing for group and others", p, perm)
		}
	}
	fields, err := exec.Command(tshark, "-r", info.Pcap, "-T", "fields", "-E", "separator=|",
		"-e", "http.request.method", "-e", "http.request.uri", "-e", "frame.comment").Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(fields)), "\n")
	found := map[string]string{}
	for _, l := range lines {
		f := strings.SplitN(l, "|", 3)
		if len(f) != 3 || !strings.HasPrefix(f[2], "carbd: ") {
			t.Errorf("a frame without carbd's comment: %q", l)
			continue
		}
		if f[1] != "" {
			found[f[1]] = f[2]
		}
	}
	for uri, note := range map[string]string{"/stream/ok": "release http:GET", "/stream/refused": "refuse http:POST"} {
		if c, ok := found[uri]; !ok || !strings.HasPrefix(c, "carbd: intercepted: ") || !strings.Contains(c, note) {
			t.Errorf("the decrypted request %s: comment %q (found %v), want the connection's decisions with %q", uri, c, ok, note)
		}
	}
}
