package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyPipeline writes runs-<to>.tar.gz beside runs-<from>.tar.gz in dir:
// the same runs under another pipeline's name.
func copyPipeline(t *testing.T, dir, from, to string) {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "runs-"+from+".tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.ReplaceAll(body, []byte(`"pipeline_name":"`+from+`"`), []byte(`"pipeline_name":"`+to+`"`))
		h.Name = to + strings.TrimPrefix(h.Name, from)
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	zw.Close()
	if err := os.WriteFile(filepath.Join(dir, "runs-"+to+".tar.gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestEvalAgentDojoLOPO(t *testing.T) {
	dir := evalArchive(t, 20)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--lopo"}, "--lopo needs 2 or more pipelines, got 1"},
		{[]string{"--lopo", "--lopo-splits", "0"}, "--lopo-splits 0"},
	} {
		args := append([]string{"eval", "agentdojo", "--runs", dir, "--policies", evalPolicies, "--splits", "2", "--ledger-alpha", "0.1"}, tc.args...)
		if code, stdout, stderr := runCLI(args...); code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, want 2 with %q\nstdout: %s\nstderr: %s", tc.args, code, tc.want, stdout, stderr)
		}
	}

	copyPipeline(t, dir, "p", "q")
	base := []string{"eval", "agentdojo", "--runs", dir, "--policies", evalPolicies, "--splits", "2", "--ledger-alpha", "0.1", "--lopo", "--lopo-splits", "2"}
	code, stdout, stderr := runCLI(append(base, "--json")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	var rep struct {
		LOPO []struct {
			Pipeline     string   `json:"pipeline"`
			Calibrated   []string `json:"calibrated_on"`
			Splits       int      `json:"splits"`
			TestEpisodes int      `json:"test_episodes"`
			CalEpisodes  int      `json:"cal_episodes"`
			Methods      []struct {
				Method string `json:"method"`
			} `json:"methods"`
		} `json:"lopo"`
	}
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if len(rep.LOPO) != 2 {
		t.Fatalf("%d LOPO entries, want 2", len(rep.LOPO))
	}
	for i, want := range [][2]string{{"p", "q"}, {"q", "p"}} {
		l := rep.LOPO[i]
		// 20 benign and 20 attacked runs per pipeline (the malformed
		// member is left out).
		if l.Pipeline != want[0] || len(l.Calibrated) != 1 || l.Calibrated[0] != want[1] || l.Splits != 2 ||
			l.TestEpisodes != 40 || l.CalEpisodes != 40 || len(l.Methods) == 0 {
			t.Errorf("LOPO %d: %+v", i, l)
		}
	}
	code, stdout, stderr = runCLI(base...)
	if code != 0 || !strings.Contains(stdout, "== leave-one-pipeline-out") || !strings.Contains(stdout, "lopo: released") {
		t.Errorf("text: exit %d\n%s\n%s", code, stdout, stderr)
	}
}
