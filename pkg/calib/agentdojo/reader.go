package agentdojo

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// ErrNotRun matches (errors.Is) the error for a member of an archive or
// folder that is not a run file (not .json, or not laid out as
// <pipeline>/<suite>/<task>/<attack>/<file>.json). Such members are
// skipped, and reported.
var ErrNotRun = errors.New("agentdojo: not a run file")

// RunError is a problem with one member of a dataset: a malformed run, a
// member that is not a run, or a broken archive. It names the archive (or
// folder) and the member path; iteration continues after it.
type RunError struct {
	Archive string
	Member  string // "" when the archive itself is broken
	Err     error
}

func (e *RunError) Error() string {
	if e.Member == "" {
		return e.Archive + ": " + e.Err.Error()
	}
	return e.Archive + ": " + e.Member + ": " + e.Err.Error()
}

func (e *RunError) Unwrap() error { return e.Err }

// Dataset is a set of recorded runs: a runs-*.tar.gz archive, a directory
// of such archives, or an unpacked folder of run files. Runs are read
// streaming, never unpacked to disk.
type Dataset struct {
	Path     string
	archives []string // archives to stream, in order
	folder   string   // an unpacked folder, when archives is empty

	// Goals are the injection goals by benchmark version and suite, and
	// Envs the suites' clean environments. Open loads both when it finds
	// prompts-and-goals.json and environments/ beside the runs; either may
	// be nil, or replaced before Runs is called. Each run is attached to
	// them (see Run.Attach).
	Goals *Goals
	Envs  map[string]*Environment
}

// Open opens a dataset at path: a runs-*.tar.gz archive, a directory
// holding such archives (the data directory), or an unpacked folder of run
// files. It looks for prompts-and-goals.json and environments/ in the
// directory of the runs and up to two directories above it.
func Open(path string) (*Dataset, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("agentdojo: open runs: %w", err)
	}
	d := &Dataset{Path: path}
	var auxStart string
	if !st.IsDir() {
		if !isArchive(path) {
			return nil, fmt.Errorf("agentdojo: open runs: %s is neither a directory nor a .tar.gz archive", path)
		}
		d.archives = []string{path}
		auxStart = filepath.Dir(path)
	} else {
		auxStart = path
		ents, err := os.ReadDir(path)
		if err != nil {
			return nil, fmt.Errorf("agentdojo: open runs: %w", err)
		}
		for _, e := range ents {
			if !e.IsDir() && isArchive(e.Name()) {
				d.archives = append(d.archives, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(d.archives)
		if len(d.archives) == 0 {
			d.folder = path
		}
	}
	dir := auxStart
	for range 3 {
		if d.Goals == nil {
			gp := filepath.Join(dir, "prompts-and-goals.json")
			if _, err := os.Stat(gp); err == nil {
				if d.Goals, err = LoadGoals(gp); err != nil {
					return nil, err
				}
			}
		}
		if d.Envs == nil {
			ep := filepath.Join(dir, "environments")
			if st, err := os.Stat(ep); err == nil && st.IsDir() {
				if d.Envs, err = LoadEnvironments(ep); err != nil {
					return nil, err
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return d, nil
}

func isArchive(name string) bool {
	return strings.HasSuffix(name, ".tar.gz") || strings.HasSuffix(name, ".tgz")
}

// Runs iterates over every run of the dataset. A member that cannot be
// read as a run yields a nil run and a *RunError (wrapping ErrMalformed or
// ErrNotRun, or the archive's read error), and iteration goes on with the
// next member (the next archive, when an archive is broken). Nothing is
// dropped silently.
func (d *Dataset) Runs() iter.Seq2[*Run, error] {
	return func(yield func(*Run, error) bool) {
		if d.folder != "" {
			d.walkFolder(yield)
			return
		}
		for _, a := range d.archives {
			if !d.streamArchive(a, yield) {
				return
			}
		}
	}
}

// streamArchive yields the runs of one archive; it returns false when the
// consumer stopped.
func (d *Dataset) streamArchive(archive string, yield func(*Run, error) bool) bool {
	f, err := os.Open(archive)
	if err != nil {
		return yield(nil, &RunError{Archive: archive, Err: err})
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return yield(nil, &RunError{Archive: archive, Err: fmt.Errorf("gzip: %w", err)})
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return true
		}
		if err != nil {
			return yield(nil, &RunError{Archive: archive, Err: fmt.Errorf("read archive: %w", err)})
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		member := h.Name
		if h.Size > maxRunSize {
			if !yield(nil, &RunError{Archive: archive, Member: member, Err: fmt.Errorf("%w: %d bytes is more than the %d a run may have", ErrMalformed, h.Size, maxRunSize)}) {
				return false
			}
			continue
		}
		if _, err := classifyMember(member); err != nil {
			if !yield(nil, &RunError{Archive: archive, Member: member, Err: err}) {
				return false
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return yield(nil, &RunError{Archive: archive, Member: member, Err: fmt.Errorf("read archive: %w", err)})
		}
		r, err := d.build(archive, member, data)
		if !yield(r, err) {
			return false
		}
	}
}

func (d *Dataset) walkFolder(yield func(*Run, error) bool) {
	root := d.folder
	stop := false
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if !yield(nil, &RunError{Archive: root, Member: rel(root, p), Err: err}) {
				stop = true
				return fs.SkipAll
			}
			return nil
		}
		if e.IsDir() {
			if e.Name() == "environments" && p != root {
				return fs.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".json") || e.Name() == "prompts-and-goals.json" {
			return nil
		}
		member := rel(root, p)
		// A folder may be the pipeline's own directory: name the member
		// with the folder's base name in front, as in an archive.
		if len(strings.Split(member, "/")) == 4 {
			member = filepath.Base(root) + "/" + member
		}
		if _, err := classifyMember(member); err != nil {
			if !yield(nil, &RunError{Archive: root, Member: member, Err: err}) {
				stop = true
				return fs.SkipAll
			}
			return nil
		}
		data, err := readLimited(p)
		if err != nil {
			if !yield(nil, &RunError{Archive: root, Member: member, Err: err}) {
				stop = true
				return fs.SkipAll
			}
			return nil
		}
		r, err := d.build(root, member, data)
		if !yield(r, err) {
			stop = true
			return fs.SkipAll
		}
		return nil
	})
	if err != nil && !stop {
		yield(nil, &RunError{Archive: root, Err: err})
	}
}

func readLimited(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRunSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRunSize {
		return nil, fmt.Errorf("%w: more than the %d bytes a run may have", ErrMalformed, maxRunSize)
	}
	return data, nil
}

func rel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return filepath.ToSlash(r)
}

// memberPath is what a member's path says about its run.
type memberPath struct {
	pipeline, suite, task, attack, file string
}

// classifyMember parses <...>/<pipeline>/<suite>/<task>/<attack>/<file>.json.
func classifyMember(member string) (memberPath, error) {
	var mp memberPath
	clean := path.Clean(strings.TrimPrefix(member, "./"))
	if !strings.HasSuffix(clean, ".json") {
		return mp, fmt.Errorf("%w: not a .json file", ErrNotRun)
	}
	parts := strings.Split(clean, "/")
	if len(parts) < 5 {
		return mp, fmt.Errorf("%w: want <pipeline>/<suite>/<task>/<attack>/<file>.json", ErrNotRun)
	}
	parts = parts[len(parts)-5:]
	mp = memberPath{pipeline: parts[0], suite: parts[1], task: parts[2], attack: parts[3], file: strings.TrimSuffix(parts[4], ".json")}
	switch {
	case strings.HasPrefix(mp.task, "user_task_"), strings.HasPrefix(mp.task, "injection_task_"):
	default:
		return mp, fmt.Errorf("%w: %q is neither user_task_N nor injection_task_N", ErrNotRun, mp.task)
	}
	if (mp.attack == "none") != (mp.file == "none") {
		return mp, fmt.Errorf("%w: attack %q with file %q (want none/none.json or <attack>/injection_task_N.json)", ErrNotRun, mp.attack, parts[4])
	}
	if mp.attack != "none" && (!strings.HasPrefix(mp.file, "injection_task_") || strings.HasPrefix(mp.task, "injection_task_")) {
		return mp, fmt.Errorf("%w: %s/%s is not user_task_N/<attack>/injection_task_N.json", ErrNotRun, mp.task, parts[4])
	}
	return mp, nil
}

// build parses a member's data and checks it against the member path: the
// path names the pipeline, and its suite, tasks and attack must agree with
// the JSON.
func (d *Dataset) build(archive, member string, data []byte) (*Run, error) {
	mp, err := classifyMember(member)
	if err != nil {
		return nil, &RunError{Archive: archive, Member: member, Err: err}
	}
	r, err := ParseRun(data)
	if err != nil {
		return nil, &RunError{Archive: archive, Member: member, Err: err}
	}
	r.Archive, r.Member, r.Pipeline = archive, member, mp.pipeline
	mismatch := func(what, inPath, inJSON string) error {
		return &RunError{Archive: archive, Member: member,
			Err: fmt.Errorf("%w: the path says %s %q, the run says %q", ErrMalformed, what, inPath, inJSON)}
	}
	if mp.suite != r.Suite {
		return nil, mismatch("suite", mp.suite, r.Suite)
	}
	if mp.task != r.UserTask {
		return nil, mismatch("task", mp.task, r.UserTask)
	}
	wantAttack, wantInj := mp.attack, mp.file
	if wantAttack == "none" {
		wantAttack, wantInj = "", ""
	}
	if wantAttack != r.Attack {
		return nil, mismatch("attack", mp.attack, r.Attack)
	}
	if wantInj != r.InjectionTask {
		return nil, mismatch("injection task", mp.file, r.InjectionTask)
	}
	r.Attach(d.Goals, d.Envs)
	return r, nil
}

// Attach gives the run its injection goal (from goals, by benchmark
// version, suite and injection task) and its suite's clean environment,
// which the violation labels use. Either may be nil.
func (r *Run) Attach(goals *Goals, envs map[string]*Environment) {
	r.Goal = ""
	if goals != nil {
		task := r.InjectionTask
		if r.Kind == InjectionAsPrompt {
			task = r.UserTask
		}
		if task != "" {
			r.Goal, _ = goals.Goal(r.BenchmarkVersion, r.Suite, task)
		}
	}
	r.env = envs[r.Suite]
}
