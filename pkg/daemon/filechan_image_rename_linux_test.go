package daemon

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Real tools save a file by writing a temporary file and renaming it
// over the target: sed -i, Python's tempfile and os.replace, a
// renameat2 exchange. The image of the temporary file goes with it
// (fileimage.go), so a file saved before the agent read a secret and
// committed after keeps the label of its writes and can be posted; saved
// after the read, or written with a write the tracer did not capture
// whole, it is labelled with what the agent had read: not posted. The
// audit log says which, and why (LabelRecord).

// renameAgent is imageAgent's protocol (MODE, REPORT, "ready", a line on
// stdin, then report.md posted to api.example.com) with report.md saved
// through a rename.
const renameAgent = `
import ctypes, os, subprocess, sys, tempfile, urllib.request
def say(s):
    sys.stdout.write(s + "\n")
    sys.stdout.flush()
def read_key():
    with open("certs/service.pem", "rb") as f:
        f.read()
def sed():
    subprocess.run(["/bin/sed", "-i", "s/open tickets: 7/open tickets: 8/", "report.md"], check=True)
def replace(data):
    fd, tmp = tempfile.mkstemp(dir=".", prefix=".report.md.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, "report.md")
def exchange(data):
    fd = os.open("report.md.new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.close(fd)
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if libc.renameat2(AT_FDCWD, b"report.md.new", AT_FDCWD, b"report.md", RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
if MODE == "sed-before":
    sed()
    read_key()
elif MODE == "sed-after":
    read_key()
    sed()
elif MODE == "replace-before":
    replace(REPORT)
    read_key()
elif MODE == "replace-after":
    read_key()
    replace(REPORT)
elif MODE == "replace-big":
    replace(REPORT + b"x" * (1 << 20))
    read_key()
elif MODE == "exchange-before":
    exchange(REPORT)
    read_key()
say("ready")
if not sys.stdin.readline():
    sys.exit(3)
with open("report.md", "rb") as f:
    body = f.read(len(REPORT))
try:
    r = urllib.request.urlopen(urllib.request.Request("http://api.example.com/reports", data=body, method="POST"), timeout=8)
    say("post=%d" % r.status)
except Exception as e:
    say("post=error %s" % e)
`

// sedOriginal is report.md in W before sed edits it ("open tickets: 7"
// becomes 8; the build line the world looks for stays).
const sedOriginal = imageReport

// runRename runs renameAgent in mode; existing is report.md in W before
// the run ("" for none). It returns whether report.md was posted,
// whether its released staging decision was proved, and its label
// records in the audit log.
func runRename(t *testing.T, mode, existing string) (posted_, proved_ bool, labels []LabelRecord, out string) {
	t.Helper()
	sum, w, out, dir := runImageAgent(t, mode, renameAgent, existing)
	return posted(w), proved(sum, true), labelRecords(t, dir, "report.md"), out
}

// labelRecords reads the label records of path from the audit log in
// dir.
func labelRecords(t *testing.T, dir, path string) []LabelRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []LabelRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r LabelRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit log: %v: %s", err, sc.Bytes())
		}
		if r.Type == "label" && r.Path == path {
			out = append(out, r)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRenameSavedBeforeSecret: report.md saved through a rename before
// the key was read (sed -i over W's report.md, a Python tempfile and
// os.replace, a renameat2 exchange), committed after: posted, and the
// audit log says its label is its writes' (basis image).
func TestRenameSavedBeforeSecret(t *testing.T) {
	for _, tc := range []struct{ mode, existing string }{
		{"sed-before", sedOriginal},
		{"replace-before", ""},
		{"replace-before", "last week's report\n"},
		{"exchange-before", "last week's report\n"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			posted, proved, labels, out := runRename(t, tc.mode, tc.existing)
			if !posted {
				t.Errorf("report.md, saved before the key was read, was not posted\n%s", out)
			}
			if !proved {
				t.Errorf("report.md's staging decision was not marked as written as decided")
			}
			if len(labels) == 0 || labels[len(labels)-1].Basis != LabelBasisImage || labels[len(labels)-1].Unproved != "" {
				t.Errorf("audit: report.md's label records %+v, want the last with basis %q", labels, LabelBasisImage)
			}
		})
	}
}

// TestRenameSavedAfterSecret: the same saves after the key was read:
// proved (the label of writes decided after the read is the secret's),
// not posted.
func TestRenameSavedAfterSecret(t *testing.T) {
	for _, tc := range []struct{ mode, existing string }{
		{"sed-after", sedOriginal},
		{"replace-after", ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			posted, _, labels, out := runRename(t, tc.mode, tc.existing)
			if posted {
				t.Errorf("report.md, saved after the key was read, was posted\n%s", out)
			}
			if len(labels) == 0 || labels[len(labels)-1].LevelName != "secret" {
				t.Errorf("audit: report.md's label records %+v, want the last at level secret", labels)
			}
		})
	}
}

// TestRenameUncapturedUnproved: a temporary file written (before the
// key was read) in one write past the tracer's capture, then renamed
// over report.md: not proved, labelled with the read label at the commit
// point, not posted; the audit log says why.
func TestRenameUncapturedUnproved(t *testing.T) {
	posted, proved, labels, out := runRename(t, "replace-big", "")
	if posted {
		t.Errorf("report.md, saved through a write past the capture, was posted\n%s", out)
	}
	if proved {
		t.Errorf("report.md, saved through a write past the capture, was marked as written as decided")
	}
	if len(labels) == 0 {
		t.Fatalf("audit: no label record of report.md\n%s", out)
	}
	last := labels[len(labels)-1]
	if last.Basis != LabelBasisRead || last.Unproved != whyCut || last.LevelName != "secret" {
		t.Errorf("audit: report.md's last label record %+v, want basis %q, unproved %q, level secret", last, LabelBasisRead, whyCut)
	}
}

// TestAuditLabelMapped: report.md stored through a shared mapping before
// the key was read: the audit log says it was labelled with the read
// label because of the mapping.
func TestAuditLabelMapped(t *testing.T) {
	_, _, out, dir := runImageAgent(t, "mmap", imageAgent, "")
	labels := labelRecords(t, dir, "report.md")
	if len(labels) == 0 {
		t.Fatalf("audit: no label record of report.md\n%s", out)
	}
	last := labels[len(labels)-1]
	if last.Basis != LabelBasisRead || last.Unproved != whyMapping || last.LevelName != "secret" || last.Seq == 0 || last.Run == "" {
		t.Errorf("audit: report.md's last label record %+v, want basis %q, unproved %q, level secret", last, LabelBasisRead, whyMapping)
	}
}
