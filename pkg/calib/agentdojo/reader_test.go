package agentdojo

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeArchive writes a runs-*.tar.gz with the given members (directories
// are added as a real archive has them).
func writeArchive(t *testing.T, path string, members map[string]string, order []string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	for _, name := range order {
		for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
		}
		body := members[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func collect(t *testing.T, d *Dataset) ([]*Run, []*RunError) {
	t.Helper()
	var runs []*Run
	var errs []*RunError
	for r, err := range d.Runs() {
		if err != nil {
			var re *RunError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not a *RunError", err)
			}
			errs = append(errs, re)
			continue
		}
		runs = append(runs, r)
	}
	return runs, errs
}

// A malformed member and a member that is not a run are reported with
// the archive and member path, and iteration goes on.
func TestOpenArchiveReportsAndContinues(t *testing.T) {
	dir := t.TempDir()
	good := "p1/banking/user_task_0/important_instructions/injection_task_0.json"
	broken := "p1/banking/user_task_1/none/none.json"
	notRun := "p1/README.md"
	mismatch := "p1/slack/user_task_0/important_instructions/injection_task_0.json"
	archive := filepath.Join(dir, "runs-p1.tar.gz")
	writeArchive(t, archive, map[string]string{
		broken:   `{"suite_name": "banking", "messages": [`,
		notRun:   "# notes",
		good:     attackedRun,
		mismatch: attackedRun, // says banking, stored under slack
	}, []string{broken, notRun, good, mismatch})

	d, err := Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	runs, errs := collect(t, d)
	if len(runs) != 1 || runs[0].Member != good || runs[0].Archive != archive {
		t.Fatalf("runs = %d (%v)", len(runs), runs)
	}
	// The pipeline comes from the path, not from pipeline_name.
	if runs[0].Pipeline != "p1" || runs[0].PipelineName != "gpt-4o-2024-05-13" {
		t.Errorf("pipeline = %q, pipeline_name = %q", runs[0].Pipeline, runs[0].PipelineName)
	}
	if len(errs) != 3 {
		t.Fatalf("%d errors, want 3: %v", len(errs), errs)
	}
	for i, want := range []struct {
		member string
		is     error
		says   string
	}{
		{broken, ErrMalformed, "unexpected EOF"},
		{notRun, ErrNotRun, "not a .json file"},
		{mismatch, ErrMalformed, `the path says suite "slack", the run says "banking"`},
	} {
		e := errs[i]
		if e.Archive != archive || e.Member != want.member || !errors.Is(e, want.is) || !strings.Contains(e.Error(), want.says) {
			t.Errorf("error %d = %v (archive %q, member %q)", i, e, e.Archive, e.Member)
		}
		if !strings.HasPrefix(e.Error(), archive+": "+want.member+": ") {
			t.Errorf("error %d does not name archive and member: %v", i, e)
		}
	}
	st := NewStats()
	for _, e := range errs {
		st.AddError(e)
	}
	var out bytes.Buffer
	if err := st.Write(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "skipped: 3") || !strings.Contains(out.String(), notRun) {
		t.Errorf("stats do not list the skipped members:\n%s", out.String())
	}
}

// A broken archive is reported and the next archive is still read.
func TestOpenDirectoryOfArchives(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "runs-a.tar.gz"), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	member := "b/banking/user_task_0/important_instructions/injection_task_0.json"
	writeArchive(t, filepath.Join(dir, "runs-b.tar.gz"), map[string]string{member: attackedRun}, []string{member})
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	runs, errs := collect(t, d)
	if len(runs) != 1 || runs[0].Pipeline != "b" {
		t.Errorf("runs = %v", runs)
	}
	if len(errs) != 1 || errs[0].Archive != filepath.Join(dir, "runs-a.tar.gz") || errs[0].Member != "" {
		t.Errorf("errors = %v", errs)
	}
}

// An unpacked folder reads the same, whether it is the folder holding
// pipelines or a pipeline's own folder.
func TestOpenFolder(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "local-llama", "slack", "user_task_1", "none")
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "none.json"), []byte(llamaRun), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{dir, filepath.Join(dir, "local-llama")} {
		d, err := Open(root)
		if err != nil {
			t.Fatal(err)
		}
		runs, errs := collect(t, d)
		if len(errs) != 0 || len(runs) != 1 {
			t.Fatalf("%s: runs %d, errors %v", root, len(runs), errs)
		}
		if r := runs[0]; r.Pipeline != "local-llama" || r.Member != "local-llama/slack/user_task_1/none/none.json" || r.Kind != Benign {
			t.Errorf("%s: run %q %q %v", root, r.Pipeline, r.Member, r.Kind)
		}
	}
	if _, err := Open(filepath.Join(dir, "missing")); err == nil {
		t.Error("Open of a missing path: no error")
	}
}
