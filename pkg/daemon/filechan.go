package daemon

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

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

	mu           sync.Mutex // guards the fields below
	changes      uint64     // traced changes (outgoing file events)
	unattributed uint64     // reads the tracer could not attribute
	assumed      bool       // the sensitive files were assumed read …
	assumedAt    uint64     // … when changes was this
	paths        map[string]*pathState
	committed    []string
	aborted      []string
	refusals     []string
	events       uint64
	commits      uint64
	aborts       uint64
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
	name := "carbd-" + fc.d.cfg.ID
	removeStaleCgroup(name)
	cg, err := fileev.NewCgroup(name)
	if err != nil {
		fc.d.log.Warn("file tracing off (no cgroup): every sensitive file counts as read", "err", err)
		fc.assumeSensitiveRead(nil)
		return ""
	}
	fc.cg = cg
	tr, err := fileev.New(fileev.Config{Root: fc.merged})
	if err != nil {
		fc.d.log.Warn("file tracing off: every sensitive file counts as read", "err", err)
		fc.assumeSensitiveRead(nil)
		return cg.Path
	}
	if _, err := tr.Trace(fileev.Target{Cgroup: cg.Path, View: view}); err != nil {
		tr.Close()
		fc.d.log.Warn("file tracing off: every sensitive file counts as read", "err", err)
		fc.assumeSensitiveRead(nil)
		return cg.Path
	}
	fc.tracer = tr
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fc.cancel = cancel
	fc.done = make(chan struct{})
	go func() {
		defer close(fc.done)
		_ = tr.Run(tctx, func(rec *fileev.Record, evs []decide.Event) {
			if unattributedRead(rec) {
				fc.mu.Lock()
				fc.unattributed++
				fc.mu.Unlock()
				fc.assumeSensitiveRead(rec)
			}
			for _, ev := range evs {
				fc.event(tctx, ev)
			}
		})
	}()
	return cg.Path
}

// removeStaleCgroup removes the cgroup a crashed carbd left for this
// sandbox (its processes died with that carbd; any left are killed), so
// that the new run can trace its own.
func removeStaleCgroup(name string) {
	mnt, err := fileev.Cgroup2Mount()
	if err != nil {
		return
	}
	cg, err := fileev.OpenCgroup(filepath.Join(mnt, name))
	if err != nil {
		return
	}
	_ = cg.Kill()
	// cgroup.kill is asynchronous: the directory can be removed once the
	// last process is gone.
	for i := 0; i < 100 && cg.Remove() != nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

// syncTracing returns once every traced file operation that returned
// before the call has been handled (reads observed by the engine, writes
// proposed), so that an effect decided next is decided knowing what the
// agent read before it. Without tracing it returns at once.
func (fc *fileChannel) syncTracing(ctx context.Context) error {
	if fc == nil || fc.tracer == nil {
		return nil
	}
	// Bounded by the longest a packet may wait for its decision: the
	// tracer waits behind the engine while the oracle is asked.
	ctx, cancel := context.WithTimeout(ctx, fc.d.cfg.HoldTimeout+fc.d.oracleWait())
	defer cancel()
	return fc.tracer.Sync(ctx)
}

// unattributedRead reports a record of a read the tracer could not
// attribute: data was read (read, mmap, copy) but the path is unknown
// (malformed: the descriptor was not seen opened and the process is gone)
// or its content could not be read back.
func unattributedRead(r *fileev.Record) bool {
	if r.Kind != fileev.KindSyscall || r.Ret <= 0 {
		return false
	}
	switch r.Op {
	case fileev.OpRead, fileev.OpMmap, fileev.OpCopy:
		return r.Malformed != "" || (r.InRoot && r.ContentErr != "")
	}
	return false
}

// maxAssumedContent bounds what one sensitive file contributes when it
// is assumed read, and maxAssumedTotal all of them.
const (
	maxAssumedContent = 1 << 20
	maxAssumedTotal   = 16 << 20
)

// assumeSensitiveRead is the answer to a read carbd cannot see (an
// unattributed read, or tracing off): it cannot know what the agent read,
// so it takes the agent to have read every file of the working directory
// the policy calls sensitive (as the agent sees it, in the merged view).
// Their content joins the sensitive set, so an effect carrying any of it
// is deferred as if the read had been traced: fail closed, at no cost to
// effects that carry none of it. The files are read again only once the
// agent has changed something since. rec is the record that triggered it
// (nil: tracing is off).
func (fc *fileChannel) assumeSensitiveRead(rec *fileev.Record) {
	fc.mu.Lock()
	if fc.assumed && fc.assumedAt == fc.changes {
		fc.mu.Unlock()
		return
	}
	fc.assumed, fc.assumedAt = true, fc.changes
	fc.mu.Unlock()
	why := "file tracing is off"
	if rec != nil {
		why = fmt.Sprintf("a %s by pid %d could not be attributed (%s%s)", rec.Op, rec.PID, rec.Malformed, rec.ContentErr)
	}
	root, err := os.Open(fc.merged)
	if err != nil {
		fc.d.log.Warn("assume the sensitive files read", "err", err)
		return
	}
	defer root.Close()
	total, n := 0, 0
	for _, src := range fc.d.engine.Policy().Sensitive {
		for _, g := range src.Paths {
			_ = filepath.WalkDir(filepath.Join(fc.merged, staticPrefix(g.Pattern)), func(p string, de fs.DirEntry, err error) error {
				if err != nil || !de.Type().IsRegular() || total >= maxAssumedTotal {
					return nil
				}
				rel, err := filepath.Rel(fc.merged, p)
				if err != nil || !g.Match(rel) {
					return nil
				}
				content, err := readBeneath(int(root.Fd()), rel, min(maxAssumedContent, maxAssumedTotal-total))
				if err != nil {
					return nil
				}
				total += len(content)
				n++
				fc.d.engine.Observe(decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: rel, Op: fileev.OpNameRead,
					Content: content, Source: "file:" + rel + " (assumed read: " + why + ")"})
				return nil
			})
		}
	}
	fc.d.log.Info("the sensitive files count as read", "why", why, "files", n)
}

// staticPrefix is the directory part of a glob before its first pattern
// character: where a walk for its matches starts.
func staticPrefix(pattern string) string {
	dir := ""
	for _, part := range strings.Split(pattern, "/") {
		if strings.ContainsAny(part, "*?[{\\") {
			break
		}
		dir = filepath.Join(dir, part)
	}
	if dir == pattern {
		return filepath.Dir(dir) // a literal path: walk its directory
	}
	return dir
}

// readBeneath reads at most limit bytes of the regular file rel below the
// directory at dirfd, never following a symlink or leaving the directory
// (the agent controls what the merged view holds).
func readBeneath(dirfd int, rel string, limit int) (string, error) {
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV})
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", rel)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)))
	return string(b), err
}

// event handles one traced file operation.
func (fc *fileChannel) event(ctx context.Context, ev decide.Event) {
	fc.mu.Lock()
	fc.events++
	if ev.Dir == decide.Out {
		fc.changes++
	}
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
	c := FileCounters{Events: fc.events, Unattributed: fc.unattributed, Committed: fc.commits, Aborted: fc.aborts, Refused: uint64(len(fc.refusals))}
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
