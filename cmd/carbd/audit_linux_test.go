package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/daemon"
)

// tsharkFields reads a pcapng with tshark and returns one line per frame:
// the fields joined with "|". A file cut inside a block is an error.
func tsharkFields(t *testing.T, tshark, file string, filter string, fields ...string) ([]string, error) {
	t.Helper()
	args := []string{"-r", file, "-T", "fields", "-E", "separator=|"}
	if filter != "" {
		args = append(args, "-Y", filter)
	}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command(tshark, args...).Output()
	s := strings.TrimRight(string(out), "\n")
	if s == "" {
		return nil, err
	}
	return strings.Split(s, "\n"), err
}

// A finished run's pcapng audit is kept in the working directory's state
// (0600), every frame commented with its final verdict (ARP and IPv6
// neighbour discovery as link-local); `carbd audit` after the run
// exports it by sandbox, by run id and by path, and tshark filters on
// the verdicts.
func TestAuditAfterRun(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	tshark := testutil.RequireTool(t, "tshark")
	w := newWorld(t, 83)
	work := cliWorkdir(t)
	r := startRun(t, bin, w, work, `
curl -sS -m 20 -o /dev/null -w "code=%{http_code} " http://api.example.com/status; echo "status=$?"
curl -sS -m 20 -o /dev/null http://api.example.com/exfil-5e0b; echo "exfil=$?"
`)
	if code := r.waitExit(t); code != 0 {
		t.Fatalf("carbd run exited %d:\n%s", code, r.diagnostics())
	}
	if out := r.out.String(); !strings.Contains(out, "code=200 status=0") || strings.Contains(out, "exfil=0") {
		t.Fatalf("the agent's requests: want /status released and /exfil-5e0b refused:\n%s", out)
	}
	// Still running: nothing. The run is listed with its file.
	code, list, errOut := r.cli(t, "audit", "--list", "--sandbox", r.id)
	if code != 0 || !strings.Contains(list, r.id) {
		t.Fatalf("carbd audit --list: exit %d: %s%s", code, list, errOut)
	}
	runs, err := daemon.ListRuns(daemon.DefaultWorkStateRoot)
	if err != nil {
		t.Fatal(err)
	}
	var info daemon.RunInfo
	for _, ri := range runs {
		if ri.Sandbox == r.id {
			info = ri
		}
	}
	if !info.Finished || info.Frames == 0 || !strings.HasPrefix(info.Pcap, daemon.DefaultWorkStateRoot+"/") {
		t.Fatalf("run %+v", info)
	}
	st, err := os.Stat(info.Pcap)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600 (it holds the agent's payloads)", info.Pcap, st.Mode().Perm())
	}
	kept, err := os.ReadFile(info.Pcap)
	if err != nil {
		t.Fatal(err)
	}

	// The three ways to name it export the same file.
	dir := t.TempDir()
	for name, args := range map[string][]string{
		"sandbox": {"--sandbox", r.id},
		"run":     {"--run", info.Run},
		"file":    {info.Pcap},
	} {
		out := filepath.Join(dir, name+".pcapng")
		if code, stdout, errOut := r.cli(t, append([]string{"audit", "--pcap", out}, args...)...); code != 0 {
			t.Fatalf("carbd audit %v: exit %d: %s%s", args, code, stdout, errOut)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, kept) {
			t.Errorf("carbd audit %v exported %d bytes, the run's file has %d", args, len(b), len(kept))
		}
		if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("carbd audit %v: the export's mode is not 0600: %v %v", args, st.Mode(), err)
		}
	}
	exported := filepath.Join(dir, "run.pcapng")

	// Every frame carries carbd's comment; the refused request's frames
	// say refuse, the released one's release, ARP link-local.
	frames, err := tsharkFields(t, tshark, exported, "", "frame.number", "eth.type", "http.request.uri", "frame.comment")
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	uris := map[string]string{}
	arp := 0
	for _, l := range frames {
		f := strings.SplitN(l, "|", 4)
		if len(f) != 4 || !strings.HasPrefix(f[3], "carbd: ") {
			t.Errorf("a frame without carbd's comment: %q", l)
			continue
		}
		if f[2] != "" {
			uris[f[2]] = f[3]
		}
		if f[1] == "0x0806" {
			arp++
			if !strings.HasPrefix(f[3], "carbd: link-local") {
				t.Errorf("an ARP frame commented %q", f[3])
			}
		}
	}
	if arp == 0 {
		t.Errorf("no ARP frame in the audit:\n%s", strings.Join(frames, "\n"))
	}
	if c := uris["/status"]; !strings.HasPrefix(c, "carbd: release #") {
		t.Errorf("the /status request commented %q", c)
	}
	if c := uris["/exfil-5e0b"]; !strings.HasPrefix(c, "carbd: refuse #") {
		t.Errorf("the /exfil-5e0b request commented %q", c)
	}
	refused, err := tsharkFields(t, tshark, exported, `frame.comment contains "carbd: refuse"`, "http.request.uri")
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	if !strings.Contains(strings.Join(refused, "\n"), "/exfil-5e0b") || strings.Contains(strings.Join(refused, "\n"), "/status") {
		t.Errorf("frames filtered on carbd: refuse: %q", refused)
	}
	if code, _, errOut := r.cli(t, "audit", "--pcap", filepath.Join(dir, "x.pcapng"), "--run", "no-such-run"); code != 1 || !strings.Contains(errOut, "no run") {
		t.Errorf("an unknown run: exit %d %s", code, errOut)
	}
}

// carbd run --pcap FILE streams the audit: tshark reads it while the run
// goes, and after a kill -9 of carbd the file holds every block written
// before; carbd audit FILE exports it up to its last whole block.
func TestAuditStreamSurvivesKill(t *testing.T) {
	bin := carbdBinary(t)
	testutil.RequireTool(t, "curl")
	tshark := testutil.RequireTool(t, "tshark")
	w := newWorld(t, 89)
	work := cliWorkdir(t)
	pcap := filepath.Join(t.TempDir(), "live.pcapng")
	r := startRun(t, bin, w, work, `
curl -sS -m 20 -o /dev/null -w "code=%{http_code} " http://api.example.com/status; echo "status=$?"
curl -sS -m 20 -o /dev/null http://api.example.com/exfil-77d1; echo "exfil=$?"
wait_for exit
`, "--pcap", pcap)
	t.Cleanup(func() { removeLeftovers(r.id, r.state) })
	// Read while it grows, until both requests are there with their
	// verdicts.
	var frames []string
	waitFor(t, 60*time.Second, "the streamed audit to show both requests' verdicts", r.out, func() bool {
		frames, _ = tsharkFields(t, tshark, pcap, "http.request", "http.request.uri", "frame.comment")
		got := strings.Join(frames, "\n")
		return strings.Contains(got, "/status|carbd: release") && strings.Contains(got, "/exfil-77d1|carbd: refuse")
	})
	if st, err := os.Stat(pcap); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("%s while the run goes: %v %v, want mode 0600", pcap, st, err)
	}
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.done
	removeLeftovers(r.id, r.state)
	after, err := tsharkFields(t, tshark, pcap, "http.request", "http.request.uri", "frame.comment")
	if len(after) < len(frames) {
		t.Fatalf("after kill -9, tshark reads %q (%v), before it read %q", after, err, frames)
	}
	out := filepath.Join(t.TempDir(), "export.pcapng")
	if code, stdout, errOut := r.cli(t, "audit", "--pcap", out, pcap); code != 0 {
		t.Fatalf("carbd audit FILE: exit %d: %s%s", code, stdout, errOut)
	}
	exported, err := tsharkFields(t, tshark, out, "http.request", "http.request.uri", "frame.comment")
	if err != nil {
		t.Fatalf("tshark on the export of a killed run's file: %v", err)
	}
	if strings.Join(exported, "\n") != strings.Join(after, "\n") {
		t.Errorf("the export has %q, the file %q", exported, after)
	}
	// The run is listed as unfinished.
	if code, list, _ := r.cli(t, "audit", "--list", "--sandbox", r.id); code != 0 || !strings.Contains(list, "unfinished") || !strings.Contains(list, pcap) {
		t.Errorf("carbd audit --list after a kill: exit %d:\n%s", code, list)
	}
}
