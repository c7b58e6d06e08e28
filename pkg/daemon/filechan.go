package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/staging"
)

// fileChannel is the working directory's staging and the tracing of the
// sandbox's file operations. The staging layer, not the event stream, is
// the record of what is staged: at every commit point the upper layer is
// scanned, every change the engine has not decided (a lost or untraced
// event) is proposed then, and only changes whose every decision is a
// release are committed.
type fileChannel struct {
	d      *daemon
	st     *staging.Stager
	merged string
	tracer *fileev.Tracer
	cg     *fileev.Cgroup
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex // guards the fields below
	paths     map[string]*pathState
	committed []string
	aborted   []string
	refusals  []string
	events    uint64
	commits   uint64
	aborts    uint64
}

// pathState is what the engine said about a path since its last commit
// point.
type pathState struct {
	decided bool // some decision was recorded
	refused bool // some effect on it was refused
	held    bool // some effect on it is held in the open scope
	seqs    []uint64
}

func openFileChannel(d *daemon) (*fileChannel, error) {
	fc := &fileChannel{d: d, paths: map[string]*pathState{}}
	fc.merged = filepath.Join(d.dir, "merged")
	st, err := staging.Open(staging.Config{WorkDir: d.cfg.Workdir, StateDir: d.cfg.StagingDir, MergedDir: fc.merged})
	if err != nil {
		return nil, fmt.Errorf("staging: %w", err)
	}
	fc.st = st
	if rec := st.Recovery(); rec != (staging.Recovery{}) {
		d.log.Info("staging journal recovered", "recovery", fmt.Sprintf("%+v", rec))
	}
	// The merged view's root takes its owner from the upper layer's root:
	// the working directory's owner, so the sandbox (mapped to that user)
	// can create entries at the top of W.
	if wst, err := os.Stat(d.cfg.Workdir); err == nil {
		sys := wst.Sys().(*syscall.Stat_t)
		if err := os.Chown(st.Layout().Upper, int(sys.Uid), int(sys.Gid)); err != nil {
			st.Close()
			return nil, fmt.Errorf("staging: upper layer owner: %w", err)
		}
	}
	if err := st.Mount(); err != nil {
		st.Close()
		return nil, fmt.Errorf("staging: mount the merged view: %w", err)
	}
	return fc, nil
}

// locationLabel gives the engine the labels earlier sessions persisted.
func (fc *fileChannel) locationLabel(path string) (decide.Label, bool) {
	return fc.st.Labels().Committed(path)
}

// startTracing creates the sandbox's cgroup and traces it. Tracing feeds
// provenance (what the agent reads) and early decisions on writes; when
// the kernel refuses it, the file channel still stages and decides every
// change at commit points, and status says tracing is off.
//
// view is where the traced processes see the merged view: the working
// directory's path in a namespace sandbox, "/" for virtiofsd.
func (fc *fileChannel) startTracing(ctx context.Context, view string) (cgroupPath string) {
	cg, err := fileev.NewCgroup("carbd-" + fc.d.cfg.ID)
	if err != nil {
		fc.d.log.Warn("file tracing off: no cgroup", "err", err)
		return ""
	}
	fc.cg = cg
	tr, err := fileev.New(fileev.Config{Root: fc.merged})
	if err != nil {
		fc.d.log.Warn("file tracing off", "err", err)
		return cg.Path
	}
	if _, err := tr.Trace(fileev.Target{Cgroup: cg.Path, View: view}); err != nil {
		tr.Close()
		fc.d.log.Warn("file tracing off", "err", err)
		return cg.Path
	}
	fc.tracer = tr
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fc.cancel = cancel
	fc.done = make(chan struct{})
	go func() {
		defer close(fc.done)
		_ = tr.Run(tctx, func(_ *fileev.Record, evs []decide.Event) {
			for _, ev := range evs {
				fc.event(tctx, ev)
			}
		})
	}()
	return cg.Path
}

// event handles one traced file operation.
func (fc *fileChannel) event(ctx context.Context, ev decide.Event) {
	fc.mu.Lock()
	fc.events++
	fc.mu.Unlock()
	if ev.Dir == decide.In {
		fc.d.engine.Observe(ev)
		return
	}
	fc.propose(ctx, ev)
}

// propose decides a file effect and remembers the decision for its paths.
func (fc *fileChannel) propose(ctx context.Context, ev decide.Event) decide.Decision {
	res := fc.d.engine.Propose(ctx, ev)
	fc.d.record(res.Decision)
	for i := range res.Resolutions {
		fc.d.applyResolution(&res.Resolutions[i])
	}
	fc.note(res.Decision)
	return res.Decision
}

// note records a decision (initial or final) against the paths it names.
func (fc *fileChannel) note(dec decide.Decision) {
	if dec.Event == nil || dec.Event.Ch != decide.ChanFile {
		return
	}
	paths := []string{dec.Event.Obj}
	for _, f := range dec.Event.Fields {
		if f.Role == decide.RoleTarget && f.Value != "" && f.Value != dec.Event.Obj && !strings.Contains(f.Name, "link") {
			paths = append(paths, f.Value)
		}
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, p := range paths {
		ps := fc.paths[p]
		if ps == nil {
			ps = &pathState{}
			fc.paths[p] = ps
		}
		ps.decided = true
		ps.seqs = append(ps.seqs, dec.Seq)
		switch dec.Verdict {
		case decide.Refuse:
			ps.refused = true
		}
	}
}

// commitPoint applies what is decided: released changes go to W (with
// the labels of what the agent had read), refused ones are reverted, held
// ones stay staged.
func (fc *fileChannel) commitPoint(ctx context.Context) {
	if fc.tracer != nil {
		if err := fc.tracer.Sync(ctx); err != nil {
			fc.d.log.Warn("file tracing sync", "err", err)
		}
		if fc.tracer.TakeRescan() {
			fc.d.log.Debug("file events may have been lost: the staged changes are decided from a rescan")
		}
	}
	changes, err := fc.st.Changes(ctx)
	if err != nil {
		fc.d.log.Error("scan the staged changes", "err", err)
		return
	}
	var commit, abort []staging.Change
	for _, c := range changes {
		if c.Refused != "" {
			abort = append(abort, c)
			continue
		}
		state := fc.state(c.Path)
		if state == nil {
			// Not seen by tracing: decide it now from the staging layer.
			ev, err := fc.st.Event(c)
			if err != nil {
				fc.d.log.Warn("staged change", "path", c.Path, "err", err)
				continue
			}
			fc.propose(ctx, ev)
			state = fc.state(c.Path)
		}
		if state == nil {
			continue
		}
		switch verdict := fc.verdictOf(state); verdict {
		case decide.Release:
			commit = append(commit, c)
		case decide.Refuse:
			abort = append(abort, c)
		}
	}
	if len(commit) > 0 {
		for _, c := range commit {
			if lb, ok := fc.d.engine.LocationLabel(c.Path); ok {
				_ = fc.st.Stage(c.Path, lb)
			}
		}
		res, err := fc.st.Commit(ctx, commit)
		fc.finish(commit, res, err, true)
	}
	if len(abort) > 0 {
		res, err := fc.st.Abort(ctx, abort)
		fc.finish(abort, res, err, false)
	}
}

// state returns the decisions recorded for path or for the directory it
// is in (a new directory's files are decided with it).
func (fc *fileChannel) state(path string) *pathState {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if ps, ok := fc.paths[path]; ok {
		return ps
	}
	return nil
}

// verdictOf is the verdict a path's decisions add up to: refused if any
// was refused, held while any is held, else released.
func (fc *fileChannel) verdictOf(ps *pathState) decide.Verdict {
	if ps.refused {
		return decide.Refuse
	}
	fc.d.mu.Lock()
	defer fc.d.mu.Unlock()
	for _, s := range ps.seqs {
		f, ok := fc.d.final[s]
		if !ok {
			return decide.Defer
		}
		if f.Verdict == decide.Refuse {
			return decide.Refuse
		}
	}
	return decide.Release
}

func (fc *fileChannel) finish(changes []staging.Change, res *staging.Result, err error, commit bool) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	what := "abort"
	if commit {
		what = "commit"
	}
	if err != nil {
		fc.d.log.Error(what+" staged changes", "err", err)
		return
	}
	refused := map[string]bool{}
	for _, r := range res.Refused {
		refused[r.Path] = true
		fc.refusals = append(fc.refusals, r.String())
	}
	for _, c := range changes {
		if refused[c.Path] {
			continue
		}
		delete(fc.paths, c.Path)
		if commit {
			fc.committed = append(fc.committed, c.Path)
			fc.commits++
		} else {
			fc.aborted = append(fc.aborted, c.Path)
			fc.aborts++
		}
	}
}

func (fc *fileChannel) outcome() (committed, aborted, refusals []string) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	committed = uniqSorted(fc.committed)
	aborted = uniqSorted(fc.aborted)
	return committed, aborted, append([]string(nil), fc.refusals...)
}

func (fc *fileChannel) counters() FileCounters {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	c := FileCounters{Events: fc.events, Committed: fc.commits, Aborted: fc.aborts, Refused: uint64(len(fc.refusals))}
	if fc.tracer != nil {
		c.Lost = fc.tracer.Lost()
	}
	return c
}

func (fc *fileChannel) mechanism() string {
	if fc.tracer == nil {
		return "off"
	}
	m, _ := fc.tracer.Mechanism()
	return m
}

func (fc *fileChannel) close() error {
	if fc.cancel != nil {
		fc.cancel()
		<-fc.done
	}
	if fc.tracer != nil {
		fc.tracer.Close()
	}
	if fc.cg != nil {
		_ = fc.cg.Kill()
		_ = fc.cg.Remove()
	}
	err := fc.st.Unmount()
	if cerr := fc.st.Close(); err == nil {
		err = cerr
	}
	return err
}

func uniqSorted(s []string) []string {
	m := map[string]bool{}
	var out []string
	for _, x := range s {
		if !m[x] {
			m[x] = true
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

func sortDecisions(ds []decide.Decision) {
	sort.Slice(ds, func(i, j int) bool { return ds[i].Seq < ds[j].Seq })
}
