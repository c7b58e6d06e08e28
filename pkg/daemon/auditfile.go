package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
)

// The pcapng audit a run keeps in its working directory's state
// (docs/operator.md, "Audit"): <WorkStateDir>/runs/<run>/audit.pcapng,
// mode 0600, at most DefaultPcapMaxBytes, and the newest keepAuditRuns
// runs of a working directory (older run directories are removed when a
// run starts). run.json beside it names the sandbox, the working
// directory and the file (which is elsewhere with carbd run --pcap).
const (
	DefaultPcapMaxBytes = 128 << 20
	keepAuditRuns       = 8
	auditRunsDir        = "runs"
	auditPcapName       = "audit.pcapng"
	auditRunInfo        = "run.json"
)

// RunInfo describes a run's audit (run.json).
type RunInfo struct {
	Run      string    `json:"run"`
	Sandbox  string    `json:"sandbox"`
	Workdir  string    `json:"workdir"`
	Started  time.Time `json:"started"`
	Ended    time.Time `json:"ended,omitzero"`
	Pcap     string    `json:"pcap"`
	Frames   uint64    `json:"frames"`
	Dropped  uint64    `json:"dropped"` // frames not written (beyond the cap)
	Finished bool      `json:"finished"`
	// Dir is the run's directory (not stored).
	Dir string `json:"-"`
}

// openAuditStream creates the run's directory and its streamed pcapng,
// and removes the oldest runs' directories beyond keepAuditRuns.
func (nc *netChannel) openAuditStream() (*capture.Stream, func() error, error) {
	d := nc.d
	root := filepath.Join(d.cfg.WorkStateDir, auditRunsDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, nil, fmt.Errorf("audit: %w", err)
	}
	pruneAuditRuns(root, keepAuditRuns-1)
	run := "run"
	if d.files != nil && d.files.st != nil && d.files.st.RunID() != "" {
		run = d.files.st.RunID()
	}
	// A run resumed after a crash keeps its staging run id: its audit is
	// a second directory.
	name := run
	for i := 2; ; i++ {
		err := os.Mkdir(filepath.Join(root, name), 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || i > 1000 {
			return nil, nil, fmt.Errorf("audit: %w", err)
		}
		name = run + "-" + strconv.Itoa(i)
	}
	dir := filepath.Join(root, name)
	info := RunInfo{Run: name, Sandbox: d.cfg.ID, Workdir: d.cfg.Workdir, Started: d.started.UTC(), Pcap: d.cfg.Pcap, Dir: dir}
	if info.Pcap == "" {
		info.Pcap = filepath.Join(dir, auditPcapName)
	} else if abs, err := filepath.Abs(info.Pcap); err == nil {
		info.Pcap = abs
	}
	max := d.cfg.PcapMaxBytes
	if max == 0 {
		max = DefaultPcapMaxBytes
	}
	s, err := capture.NewStream(capture.StreamConfig{Path: info.Pcap, Ifname: nc.plan.HostIf, MaxBytes: max,
		Delay: d.cfg.HoldTimeout + time.Second, Annotate: nc.annotate})
	if err != nil {
		return nil, nil, err
	}
	if err := writeRunInfo(info); err != nil {
		s.Close()
		return nil, nil, err
	}
	d.log.Info("audit: pcapng streamed", "file", info.Pcap, "run", name)
	closeFn := func() error {
		err := s.Close()
		st := s.Stats()
		info.Ended, info.Frames, info.Dropped, info.Finished = time.Now().UTC(), st.Frames, st.Dropped, true
		if st.Dropped > 0 {
			d.log.Warn("audit: frames beyond the pcapng's cap were not written", "file", info.Pcap, "dropped", st.Dropped, "cap", max)
		}
		return errors.Join(err, writeRunInfo(info))
	}
	return s, closeFn, nil
}

func writeRunInfo(info RunInfo) error {
	b, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(info.Dir, auditRunInfo+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(info.Dir, auditRunInfo)); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// pruneAuditRuns removes the oldest run directories under root beyond
// keep (run ids begin with their start time, so names sort by age).
func pruneAuditRuns(root string, keep int) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	sort.Strings(dirs)
	for len(dirs) > keep {
		_ = os.RemoveAll(filepath.Join(root, dirs[0]))
		dirs = dirs[1:]
	}
}

// ListRuns lists the runs whose audit is kept under workStateRoot
// (DefaultWorkStateRoot), oldest first. A run carbd did not finish (it
// crashed or was killed) has Finished false; its file holds what was
// written up to the crash.
func ListRuns(workStateRoot string) ([]RunInfo, error) {
	ws, err := os.ReadDir(workStateRoot)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var out []RunInfo
	for _, w := range ws {
		root := filepath.Join(workStateRoot, w.Name(), auditRunsDir)
		runs, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, r := range runs {
			dir := filepath.Join(root, r.Name())
			b, err := os.ReadFile(filepath.Join(dir, auditRunInfo))
			if err != nil {
				continue
			}
			var info RunInfo
			if json.Unmarshal(b, &info) != nil {
				continue
			}
			info.Dir = dir
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Started.Equal(out[j].Started) {
			return out[i].Started.Before(out[j].Started)
		}
		return out[i].Run < out[j].Run
	})
	return out, nil
}

// FindRun finds a kept run by its id (or a unique prefix of it), or the
// newest run of a sandbox.
func FindRun(workStateRoot, run, sandbox string) (RunInfo, error) {
	runs, err := ListRuns(workStateRoot)
	if err != nil {
		return RunInfo{}, err
	}
	var found []RunInfo
	for _, r := range runs {
		switch {
		case run != "" && r.Run == run:
			return r, nil
		case run != "" && strings.HasPrefix(r.Run, run):
			found = append(found, r)
		case run == "" && sandbox != "" && r.Sandbox == sandbox:
			found = append(found, r)
		}
	}
	if run == "" && len(found) > 0 {
		return found[len(found)-1], nil // the newest
	}
	switch len(found) {
	case 0:
		if run != "" {
			return RunInfo{}, fmt.Errorf("audit: no run %q under %s (carbd audit --list)", run, workStateRoot)
		}
		return RunInfo{}, fmt.Errorf("audit: no run of sandbox %q under %s (carbd audit --list)", sandbox, workStateRoot)
	case 1:
		return found[0], nil
	}
	return RunInfo{}, fmt.Errorf("audit: %d runs begin with %q: give more of the id", len(found), run)
}

// LabelRecord is the decision log's record (audit.jsonl, type "label")
// of the label a commit-point decision gives its path, written after the
// decision (Seq) it belongs to: its basis, and, when the staged content
// was not proved, why not. Basis "image": the staged file holds exactly
// what its decided writes produced (the file channel's image), and the
// path keeps the label those writes gave it. Basis "read": it is
// labelled with the read label at the commit point (joined with the
// location's earlier label); Unproved says why (LabelBasis*). Label is
// the location's label after the decision (the read label while it is
// held), LevelName its level as the policy names it. Records of other
// types ignore this one; its fields are only ever added to.
type LabelRecord struct {
	Type      string        `json:"type"` // "label"
	Time      time.Time     `json:"time"`
	Run       string        `json:"run"`
	Seq       uint64        `json:"seq"`
	Op        string        `json:"op"`
	Path      string        `json:"path"`
	Basis     string        `json:"basis"`
	Unproved  string        `json:"unproved,omitempty"`
	Label     *decide.Label `json:"label,omitempty"`
	LevelName string        `json:"level_name,omitempty"`
}

// The bases of a LabelRecord.
const (
	LabelBasisImage = "image"
	LabelBasisRead  = "read"
)
