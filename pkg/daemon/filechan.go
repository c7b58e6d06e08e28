package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
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
	// aliases attributes each traced read to the file it read
	// (readalias.go); nil while tracing is off, or when M's root could
	// not be opened: then every read is unresolved (fail closed).
	aliases *readAliases
	cancel  context.CancelFunc
	done    chan struct{}

	// readGen is the read generation shared with the TC program
	// (revoke.go); set before tracing starts.
	readGen *ebpf.Map

	// lateRecord, set only by in-package tests, takes a record out of
	// the tracer's order when it returns true: the test hands it to
	// handleRecord later, as if its system call had returned after a
	// commit point's second Sync.
	lateRecord atomic.Pointer[func(*fileev.Record, []decide.Event) bool]

	mu           sync.Mutex // guards the fields below
	changes      uint64     // traced changes (outgoing file events)
	unattributed uint64     // reads the tracer could not attribute
	assumed      bool       // the sensitive files were assumed read …
	assumedAt    uint64     // … when changes was this
	paths        map[string]*pathState
	committed    []string
	aborted      []string
	refusals     []string
	refusedSeen  map[string]bool     // the refusals already in refusals (a staged change is refused again at every commit point)
	conflicts    []staging.Conflict  // in the order found
	conflicted   map[string][32]byte // path -> digest of the staged change found in conflict
	unseen       map[string]bool     // paths written with content the tracer did not see: decided from the staging layer
	lost         map[string]bool     // staged paths found at a commit point after a loss, to decide again from the staging layer once
	unshown      map[string][32]byte // path -> digest of a staged change too large for one event: kept staged, never decided or committed
	images       fileImages          // files' content as their decided writes produced it (fileimage.go)
	covered      map[uint64]string   // held staging decisions an oracle's approval of the same bytes covers -> the answer's justification (cover)
	events       uint64
	commits      uint64
	aborts       uint64
}

// The bounds of Config.StagedContentLimit: at least the largest value
// of one extended attribute (XATTR_SIZE_MAX: a user.* attribute an event
// could not show whole would keep its change staged for ever), at most
// the largest staged file (staging.DefaultMaxFileSize: a larger one is
// refused anyway).
const (
	MinStagedContentLimit = 64 << 10
	MaxStagedContentLimit = staging.DefaultMaxFileSize
)

// pathState is what the engine said about a path since its last commit
// point.
type pathState struct {
	decided bool // some decision was recorded
	refused bool // some effect on it was refused
	seqs    []uint64
	ops     map[string]bool // the operations decided (decide.Event.Op)
	// staged is set once the path was decided from the staging layer;
	// digest and size are the staged entry that decision saw
	// (staging.Change.Digest: type, mode, user.* xattrs, target,
	// content). Only that entry is committed on the path's decisions.
	staged bool
	digest [32]byte
	size   int64
	// deferred are the reasons (Reason and Also) of the decisions on the
	// path that the policy deferred, by their seq: what the oracle was
	// asked about when it answered them (cover).
	deferred map[uint64][]decide.Reason
}

func openFileChannel(d *daemon) (*fileChannel, error) {
	fc := &fileChannel{d: d, paths: map[string]*pathState{}, conflicted: map[string][32]byte{}, refusedSeen: map[string]bool{},
		unseen: map[string]bool{}, lost: map[string]bool{}, unshown: map[string][32]byte{}, covered: map[uint64]string{}}
	fc.merged = filepath.Join(d.dir, "merged")
	if within(d.cfg.WorkStateDir, DefaultWorkStateRoot) {
		// Searchable by W's owner, who takes the agent's versions of
		// conflicts from its state directory (hidden from the sandbox).
		for _, dir := range []string{filepath.Dir(DefaultWorkStateRoot), DefaultWorkStateRoot} {
			if err := os.MkdirAll(dir, 0o711); err != nil {
				return nil, fmt.Errorf("staging: state dir: %w", err)
			}
			if err := os.Chmod(dir, 0o711); err != nil {
				return nil, fmt.Errorf("staging: state dir: %w", err)
			}
		}
	}
	if err := migrateIndex(d.cfg.StagingDir, d.cfg.WorkStateDir); err != nil {
		return nil, err
	}
	st, err := staging.Open(staging.Config{WorkDir: d.cfg.Workdir, StateDir: d.cfg.WorkStateDir, LayerDir: d.cfg.StagingDir, MergedDir: fc.merged,
		ContentLimit: d.cfg.StagedContentLimit})
	if err != nil {
		return nil, fmt.Errorf("staging: %w", err)
	}
	fc.st = st
	if rec := st.Recovery(); rec != (staging.Recovery{}) {
		d.log.Info("staging journal recovered", "recovery", fmt.Sprintf("%+v", rec))
	}
	if st.Fresh() {
		d.log.Info("staging: a fresh base of the working directory", "run", st.RunID(), "state", d.cfg.WorkStateDir, "labels", st.Labels().Len())
	} else {
		d.log.Info("staging: resuming the layers of a run that did not finish; its staged changes are decided in this run", "run", st.RunID(), "state", d.cfg.WorkStateDir)
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
		fc.assumeSensitiveRead(nil, "")
		return ""
	}
	fc.cg = cg
	tr, err := fileev.New(fileev.Config{Root: fc.merged, RingBytes: fc.d.cfg.FileRingBytes, ReadGen: fc.readGen})
	if err != nil {
		fc.d.log.Warn("file tracing off: every sensitive file counts as read", "err", err)
		fc.assumeSensitiveRead(nil, "")
		return cg.Path
	}
	if _, err := tr.Trace(fileev.Target{Cgroup: cg.Path, View: view}); err != nil {
		tr.Close()
		fc.d.log.Warn("file tracing off: every sensitive file counts as read", "err", err)
		fc.assumeSensitiveRead(nil, "")
		return cg.Path
	}
	fc.tracer = tr
	if ra, n, complete, err := openReadAliases(fc.merged, fc.st.Layout().Base, fc.d.engine.Policy()); err != nil {
		fc.d.log.Error("reads cannot be attributed to the file read: every read counts as unresolved", "err", err)
	} else {
		fc.aliases = ra
		lvl := slog.LevelDebug
		if !complete {
			lvl = slog.LevelWarn
		}
		fc.d.log.Log(ctx, lvl, "sensitive files indexed by inode", "files", n, "complete", complete)
	}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	fc.cancel = cancel
	fc.done = make(chan struct{})
	var wg sync.WaitGroup
	// Without the tracer, what the agent reads is not known: its end
	// ends the run.
	fc.d.sup.Go(&wg, tctx, "file-tracer", func(ctx context.Context) error {
		return tr.Run(ctx, func(rec *fileev.Record, evs []decide.Event) {
			if h := fc.d.cfg.hooks; h != nil && h.fileRecord != nil {
				h.fileRecord(rec)
			}
			if late := fc.lateRecord.Load(); late != nil && (*late)(rec, evs) {
				return // a test hands it to handleRecord later
			}
			fc.handleRecord(ctx, rec, evs)
		})
	})
	go func() { wg.Wait(); close(fc.done) }()
	return cg.Path
}

// handleRecord handles one record of the file tracer and the events it
// maps to.
func (fc *fileChannel) handleRecord(ctx context.Context, rec *fileev.Record, evs []decide.Event) {
	defer fc.d.fileRecordSeen(rec) // after noteUnseen: the commit point sees its marks
	// A read whose content alone was lost (the file was replaced or
	// removed before its bytes were read back) is still attributed to its
	// path below: it is assumed to have read every sensitive file only if
	// that path's label is not public.
	contentLost := unattributedRead(rec) && rec.Malformed == "" && hasFileRead(evs)
	switch {
	case unattributedRead(rec) && !contentLost:
		fc.mu.Lock()
		fc.unattributed++
		fc.mu.Unlock()
		fc.assumeSensitiveRead(rec, "")
	case rec.Kind == fileev.KindLoss:
		// Records were lost: a read among them is a read carbd did
		// not see.
		fc.assumeSensitiveRead(rec, "")
	}
	fc.noteUnseen(rec)
	if fc.aliases != nil {
		fc.aliases.note(rec)
	}
	for _, ev := range evs {
		if ev.Dir == decide.In && ev.Ch == decide.ChanFile {
			// A read: attributed to the file it read, not to the name
			// it was read by (readalias.go).
			why := fc.attributeRead(rec, &ev)
			if why == "" && contentLost && fc.d.engine.InLabel(ev).Level > 0 {
				// Unknown bytes of a file whose label is not public:
				// they may be any of the sensitive content. Of a public
				// one (no sensitive source, no label a write, rename or
				// link gave its path, none of its other names'), they
				// are nothing S needs, and T only misses what they
				// would have vouched for.
				why = "its content could not be read back: " + rec.ContentErr
			}
			if why != "" {
				fc.mu.Lock()
				fc.unattributed++
				fc.mu.Unlock()
				fc.assumeSensitiveRead(rec, why)
			}
		}
		fc.event(ctx, ev)
	}
}

// attributeRead rewrites ev, an incoming event of rec, to name the file
// it read (readAliases.attribute); it returns why it could not, "" when
// it could.
func (fc *fileChannel) attributeRead(rec *fileev.Record, ev *decide.Event) string {
	if fc.aliases == nil {
		const why = "M's root is not open"
		ev.Fields = append(ev.Fields, decide.Field{Name: decide.FieldUnresolved, Role: decide.RoleControl, Value: why})
		return why
	}
	return fc.aliases.attribute(fc.d.engine.Policy(), rec, ev)
}

// syncTracing returns once every traced file operation that returned
// before the call has been handled (reads observed by the engine, writes
// proposed), so that an effect decided next is decided knowing what the
// agent read before it. Without tracing it returns at once.
//
// After a component failed it returns that failure: nothing is decided
// (and released) any more.
func (fc *fileChannel) syncTracing(ctx context.Context) error {
	if fc == nil {
		return nil
	}
	if cf := fc.d.sup.Err(); cf != nil {
		return cf
	}
	if fc.tracer == nil {
		return nil
	}
	// Bounded by the longest a packet may wait for its decision: the
	// tracer waits behind the engine while the oracle is asked.
	ctx, cancel := context.WithTimeout(ctx, fc.d.cfg.HoldTimeout+fc.d.oracleWait())
	defer cancel()
	return fc.tracer.Sync(ctx)
}

// hasFileRead reports whether evs has an incoming file event (a read).
func hasFileRead(evs []decide.Event) bool {
	for _, ev := range evs {
		if ev.Dir == decide.In && ev.Ch == decide.ChanFile {
			return true
		}
	}
	return false
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

// unseenWrite reports the path in M of a write whose content the tracer
// did not see whole: its read-back failed (the file was renamed, replaced
// or removed before the reader got to it), was cut at MaxContent, or the
// bytes go through a shared mapping. A write whose content was captured
// at the syscall counts too: the capture is the caller's buffer at
// sys_exit, which another thread (or a MAP_SHARED buffer) can change
// after the kernel copied it, so the write is decided early on what the
// capture shows and its commit again on what the staging layer holds
// (docs/file-events.md, Known limits).
func unseenWrite(r *fileev.Record) (string, bool) {
	if r.Kind != fileev.KindSyscall || r.Ret < 0 || r.Malformed != "" {
		return "", false
	}
	partial := r.ContentErr != "" || r.ContentTruncated
	switch r.Op {
	case fileev.OpWrite:
		return r.Path, r.InRoot && r.Ret > 0 && (partial || r.ContentCaptured)
	case fileev.OpCopy:
		return r.Path2, r.InRoot2 && r.Path2 != "" && r.Ret > 0 && partial
	case fileev.OpMmap:
		const protWrite, mapShared = 0x2, 0x1
		return r.Path, r.InRoot && r.Mode&protWrite != 0 && r.Flags&mapShared != 0
	}
	return "", false
}

// noteUnseen keeps the paths whose staged content the event stream did
// not show (unseenWrite), and follows them through renames (moved) and
// links (added), forgetting a path that is removed: at
// the commit point such a path is decided again from the staging layer,
// which holds its content, so that nothing is committed unseen and its
// label is not lost.
func (fc *fileChannel) noteUnseen(r *fileev.Record) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.images.note(r)
	if p, ok := unseenWrite(r); ok {
		fc.unseen[p] = true
		return
	}
	if r.Kind != fileev.KindSyscall || r.Ret < 0 || r.Malformed != "" {
		return
	}
	switch r.Op {
	case fileev.OpUnlink, fileev.OpRmdir:
		if r.InRoot {
			// Gone: what is written there next is seen or not anew.
			fc.followUnseen(r.Path, "", true)
		}
	case fileev.OpRename, fileev.OpLink:
		switch {
		case !r.InRoot2:
		case !r.InRoot:
			// Brought into M from where no write was traced.
			fc.unseen[r.Path2] = true
		case r.Op == fileev.OpRename && r.Flags&renameExchange != 0:
			// Swapped: each name holds what the other held.
			a := fc.followUnseen(r.Path, "", false)
			b := fc.followUnseen(r.Path2, "", false)
			for _, p := range a {
				fc.unseen[r.Path2+p[len(r.Path):]] = true
			}
			for _, p := range b {
				fc.unseen[r.Path+p[len(r.Path2):]] = true
			}
		default:
			fc.followUnseen(r.Path, r.Path2, r.Op == fileev.OpRename)
		}
	}
}

// followUnseen finds the unseen paths at or below from; with to, it marks
// each at its place below to; with drop, it forgets them under from. It
// returns what it found. fc.mu is held.
func (fc *fileChannel) followUnseen(from, to string, drop bool) []string {
	var found []string
	for p := range fc.unseen {
		if p == from || strings.HasPrefix(p, from+"/") {
			found = append(found, p)
		}
	}
	for _, p := range found {
		if drop {
			delete(fc.unseen, p)
		}
	}
	if to != "" {
		for _, p := range found {
			fc.unseen[to+p[len(from):]] = true
		}
	}
	return found
}

// keepUnseen marks path unseen again after takeUnseen, when the commit
// point could not decide it yet.
func (fc *fileChannel) keepUnseen(path string) {
	fc.mu.Lock()
	fc.unseen[path] = true
	fc.mu.Unlock()
}

// takeUnseen reports whether path's content was not seen by the event
// stream since its last decision from the staging layer, and forgets it.
func (fc *fileChannel) takeUnseen(path string) bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if !fc.unseen[path] {
		return false
	}
	delete(fc.unseen, path)
	return true
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
// (nil: tracing is off); detail, when set, says why its read could not be
// attributed.
func (fc *fileChannel) assumeSensitiveRead(rec *fileev.Record, detail string) {
	fc.mu.Lock()
	if fc.assumed && fc.assumedAt == fc.changes {
		fc.mu.Unlock()
		return
	}
	first := !fc.assumed
	fc.assumed, fc.assumedAt = true, fc.changes
	fc.mu.Unlock()
	why := "file tracing is off"
	switch {
	case rec != nil && rec.Kind == fileev.KindLoss:
		why = fmt.Sprintf("file events were lost (%d so far)", rec.Lost)
	case rec != nil && detail != "":
		why = fmt.Sprintf("a %s by pid %d could not be attributed (%s)", rec.Op, rec.PID, detail)
	case rec != nil:
		why = fmt.Sprintf("a %s by pid %d could not be attributed (%s%s)", rec.Op, rec.PID, rec.Malformed, rec.ContentErr)
	}
	root, err := os.Open(fc.merged)
	if err != nil {
		fc.d.log.Warn("assume the sensitive files read", "err", err)
		return
	}
	defer root.Close()
	total, n := 0, 0
	walkSensitive(fc.merged, fc.d.engine.Policy(), 0, func(rel string) bool {
		content, err := readBeneath(int(root.Fd()), rel, min(maxAssumedContent, maxAssumedTotal-total))
		if err != nil {
			return true
		}
		total += len(content)
		n++
		fc.d.observe(decide.Event{Ch: decide.ChanFile, Dir: decide.In, Obj: rel, Op: fileev.OpNameRead,
			Content: content, Source: "file:" + rel + " (assumed read: " + why + ")"})
		return total < maxAssumedTotal
	})
	// A flood of losses renews this every time the agent changed
	// something: said once, then at debug level.
	lvl := slog.LevelInfo
	if !first {
		lvl = slog.LevelDebug
	}
	fc.d.log.Log(context.Background(), lvl, "the sensitive files count as read", "why", why, "files", n)
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

// walkSensitive calls fn with the path relative to M of each regular file
// of M a sensitive source's path glob matches (walking from each glob's
// static prefix) until fn returns false. It visits at most maxVisit
// entries (0: no bound) and reports whether it visited all it had to.
func walkSensitive(merged string, p *decide.Policy, maxVisit int, fn func(rel string) bool) bool {
	visited, complete := 0, true
	for _, src := range p.Sensitive {
		for _, g := range src.Paths {
			err := filepath.WalkDir(filepath.Join(merged, staticPrefix(g.Pattern)), func(path string, de fs.DirEntry, err error) error {
				if visited++; maxVisit > 0 && visited > maxVisit {
					complete = false
					return filepath.SkipAll
				}
				if err != nil || !de.Type().IsRegular() {
					return nil
				}
				rel, err := filepath.Rel(merged, path)
				if err != nil || !g.Match(rel) {
					return nil
				}
				if !fn(rel) {
					return errStopWalk
				}
				return nil
			})
			if err == errStopWalk || !complete {
				return complete
			}
		}
	}
	return complete
}

var errStopWalk = errors.New("stop the walk")

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
		fc.d.observe(ev)
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
	if d := res.Decision; d.Verdict == decide.Defer && d.Event != nil && d.Event.Ch == decide.ChanFile {
		fc.mu.Lock()
		if ps := fc.paths[d.Event.Obj]; ps != nil {
			if ps.deferred == nil {
				ps.deferred = map[uint64][]decide.Reason{}
			}
			ps.deferred[d.Seq] = append([]decide.Reason{d.Reason}, d.Also...)
		}
		fc.mu.Unlock()
	}
	return res.Decision
}

// cover decides whether an oracle's earlier approval covers dec, the
// held staging decision of the change c, whose staged content its image
// proved to be exactly what the path's decided writes produced: then the
// oracle is not asked again about the same bytes (coveringOracle answers
// for it). It covers when ps, the path's decisions before dec, all ended
// released, at least one by the oracle, the path has no user.*
// attribute set since its last commit (the traced setxattr shows only
// its name), its image was built on this path (not carried by a rename:
// its writes were decided on another), and every reason dec was deferred
// for (its code, rule, field, role, level, clearance, party and token;
// not the value: a region then, the whole file now) is a reason the
// oracle approved in one of them. Otherwise the oracle is asked, as
// before: a reason that only the whole file shows (a token split across
// two writes) is asked about.
func (fc *fileChannel) cover(dec decide.Decision, c staging.Change, ps *pathState) {
	if ps == nil {
		return
	}
	fc.mu.Lock()
	if fc.images.moved[c.Path] || ps.ops["file:setxattr"] {
		fc.mu.Unlock()
		return
	}
	seqs := make([]uint64, 0, len(ps.seqs))
	deferred := map[uint64][]decide.Reason{}
	for _, s := range ps.seqs {
		if s != dec.Seq {
			seqs = append(seqs, s)
			deferred[s] = ps.deferred[s]
		}
	}
	fc.mu.Unlock()
	type reasonKey struct{ code, rule, field, role, level, clearance, party, token string }
	key := func(r decide.Reason) reasonKey {
		return reasonKey{r.Code, r.Rule, r.Field, r.Role.String(), r.Level, r.Clearance, r.Party, r.Token}
	}
	approved := map[reasonKey]bool{}
	var by []string
	fc.d.mu.Lock()
	for _, s := range seqs {
		f, ok := fc.d.final[s]
		if !ok || f.Verdict != decide.Release {
			fc.d.mu.Unlock()
			return
		}
		if f.Layer == decide.LayerOracle {
			for _, r := range deferred[s] {
				approved[key(r)] = true
			}
			by = append(by, fmt.Sprintf("#%d", s))
		}
	}
	fc.d.mu.Unlock()
	if len(by) == 0 {
		return
	}
	for _, r := range append([]decide.Reason{dec.Reason}, dec.Also...) {
		if !approved[key(r)] {
			return
		}
	}
	fc.mu.Lock()
	fc.covered[dec.Seq] = fmt.Sprintf("covered by the approval of %s: %q holds exactly the bytes they showed (proved by its image)", strings.Join(by, ", "), c.Path)
	fc.mu.Unlock()
}

// takeCovered returns the justification of the approval that covers the
// held decision seq (cover), and forgets it.
func (fc *fileChannel) takeCovered(seq uint64) (string, bool) {
	if fc == nil {
		return "", false
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	why, ok := fc.covered[seq]
	delete(fc.covered, seq)
	return why, ok
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
		if ps.ops == nil {
			ps.ops = map[string]bool{}
		}
		ps.ops[dec.Event.Op] = true
		switch dec.Verdict {
		case decide.Refuse:
			ps.refused = true
		}
	}
}

// commitPoint applies what is decided: released changes go to W (with
// the labels of what the agent had read), refused ones are reverted, held
// ones stay staged.
//
// The order is Sync, scan, Sync, verdicts. The scan reads what the upper
// layer holds now, and the agent may have written again since the first
// Sync (a path released then, written with new content before the scan
// reads it): the second Sync has every write the scan could have seen
// handled, so a path's decisions cover its scanned content before its
// verdict is taken. A write after the scan is the staging's digest check's
// (Commit copies only the content scanned). When the second Sync fails,
// nothing is committed or aborted at this point.
func (fc *fileChannel) commitPoint(ctx context.Context) {
	defer fc.testStage("done")
	if fc.tracer != nil {
		if err := fc.tracer.Sync(ctx); err != nil {
			fc.d.log.Warn("file tracing sync", "err", err)
		}
	}
	fc.testStage("scan")
	changes, err := fc.st.Changes(ctx)
	if err != nil {
		fc.d.log.Error("scan the staged changes", "err", err)
		return
	}
	if fc.tracer != nil {
		fc.testStage("sync")
		if err := fc.tracer.Sync(ctx); err != nil {
			fc.d.log.Warn("file tracing sync after the scan: nothing committed at this commit point", "err", err)
			return
		}
		if fc.tracer.TakeRescan() {
			// The event stream missed something before this point (a
			// full ring, a cut record): what tracing saw of a staged
			// change may not be what the change holds. Each change
			// staged now is decided once more from the staging layer
			// before it is committed. (Taken after the scan: a failed
			// scan does not forget the loss.)
			fc.markLost(changes)
		}
	}
	var commit, abort []staging.Change
	for _, c := range changes {
		fc.mu.Lock()
		known := fc.conflicted[c.Path] == c.Digest && c.Digest != [32]byte{}
		fc.mu.Unlock()
		if known {
			continue // kept for the user already; it stays staged until the run ends
		}
		if c.Refused != "" {
			abort = append(abort, c)
			continue
		}
		state, unseen := fc.state(c.Path), fc.takeUnseen(c.Path)
		// stale: no decision saw the staged entry as scanned now.
		stale := state != nil && fc.verdictOf(state) != decide.Refuse && !fc.decidedAs(state, c)
		if (unseen || stale) && state != nil && fc.verdictOf(state) == decide.Defer {
			// Its decision is still held (a question open): not asked
			// a second time meanwhile, not committed; decided again from
			// the staging layer once that decision is final.
			if unseen {
				fc.keepUnseen(c.Path)
			}
			continue
		}
		if state == nil || unseen || stale || fc.lostToDecide(c, state) {
			// Not seen by tracing, written with content it did not
			// see, changed since it was decided, or staged when events
			// were lost: decide it now from the staging layer.
			fc.mu.Lock()
			dg, big := fc.unshown[c.Path]
			fc.mu.Unlock()
			if big && dg == c.Digest {
				continue // found too large to show before: kept staged (not read again)
			}
			ev, err := fc.st.Event(c)
			if err != nil {
				// Not committed on what tracing saw: it keeps its
				// marks, and the next commit point tries again.
				if unseen {
					fc.keepUnseen(c.Path)
				}
				fc.d.log.Warn("staged change", "path", c.Path, "err", err)
				continue
			}
			if cut, ok := fieldValueOf(&ev, "truncated"); ok {
				// The event does not show every byte the change would
				// commit: no decision is taken on a partial view. It
				// stays staged (discarded when the run ends), reported.
				fc.mu.Lock()
				fc.unshown[c.Path] = c.Digest
				if fc.refuseLocked(fmt.Sprintf("%s %q: not decided, kept staged: it changes more than one decision is shown (%s)", c.Op, c.Path, cut)) {
					fc.d.log.Warn("staged change too large to decide: not committed", "path", c.Path, "shown", cut)
				}
				fc.mu.Unlock()
				continue
			}
			fc.dropLost(c.Path)
			// A created file holding exactly what its decided writes
			// produced keeps the label they gave it; anything else is
			// labelled with what the agent has read by now.
			fc.mu.Lock()
			img, why := fc.images.proof(c)
			fc.mu.Unlock()
			if why == "" {
				why = holdsExactly(fc.st, c, img)
			}
			ev.WrittenAsDecided = why == ""
			_, labelled := fc.d.engine.LocationLabel(c.Path)
			if ev.WrittenAsDecided && !labelled {
				why = whyNoLabel
			}
			dec := fc.propose(ctx, ev)
			fc.auditLabel(dec, c, why)
			if why == "" && dec.Verdict == decide.Defer {
				fc.cover(dec, c, state)
			}
			fc.noteStaged(c)
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
	if fc.d.sup.Err() != nil {
		// A component failed: nothing is committed or aborted any more;
		// the next run resumes what is staged (as after a crash).
		return
	}
	if len(commit) > 0 {
		// A change whose label cannot be persisted is not committed (it
		// stays staged and is reported): in W without its label, a later
		// read would launder what the agent had read.
		labelled := commit[:0:0]
		for _, c := range commit {
			if !fc.joinSourceLabel(c) {
				continue
			}
			if lb, ok := fc.d.engine.LocationLabel(c.Path); ok {
				if err := fc.st.Stage(c.Path, lb); err != nil {
					fc.mu.Lock()
					if fc.refuseLocked(fmt.Sprintf("%s %q: label not persisted: %v", c.Op, c.Path, err)) {
						fc.d.log.Error("persist the label of a staged change: not committed", "path", c.Path, "err", err)
					}
					fc.mu.Unlock()
					continue
				}
			}
			labelled = append(labelled, c)
		}
		if len(labelled) > 0 {
			fc.testStage("commit")
			res, err := fc.st.Commit(ctx, labelled)
			fc.finish(labelled, res, err, true)
		}
	}
	if len(abort) > 0 {
		res, err := fc.st.Abort(ctx, abort)
		fc.finish(abort, res, err, false)
	}
}

// joinSourceLabel gives a file about to be committed the label of the
// labelled content of B it holds at another path (staging.SourceLabel):
// a rename, a link or an exchange the tracer did not see (io_uring, a
// lost record) moved it there, and labels are never forgotten. The label
// is joined into the engine's, so it is persisted with the change and a
// later read in this run carries it. It reports false when the content
// could not be compared: the change stays staged, reported (fail closed).
func (fc *fileChannel) joinSourceLabel(c staging.Change) bool {
	from, lb, ok, err := fc.st.SourceLabel(c)
	if err != nil {
		fc.mu.Lock()
		if fc.refuseLocked(fmt.Sprintf("%s %q: label not known: %v", c.Op, c.Path, err)) {
			fc.d.log.Error("the label of a staged change's source: not committed", "path", c.Path, "err", err)
		}
		fc.mu.Unlock()
		return false
	}
	if ok {
		fc.d.engine.JoinLocationLabel(c.Path, lb)
		fc.d.log.Info("staged file holds labelled content of another path: label joined", "path", c.Path, "from", from,
			"level", fc.d.engine.Policy().LevelName(lb.Level))
	}
	return true
}

// auditLabel writes the basis of the label the commit-point decision dec
// gives c's path to the audit log (LabelRecord): proved by its image
// (why is empty), or the read label, and why it was not proved.
func (fc *fileChannel) auditLabel(dec decide.Decision, c staging.Change, why string) {
	if fc.d.audit == nil {
		return
	}
	rec := LabelRecord{Type: "label", Time: time.Now().UTC(), Run: fc.st.RunID(), Seq: dec.Seq, Op: c.Op.EventOp(),
		Path: c.Path, Basis: LabelBasisImage, Unproved: why}
	if why != "" {
		rec.Basis = LabelBasisRead
	}
	if lb, ok := fc.d.engine.LocationLabel(c.Path); ok {
		rec.Label = &lb
		rec.LevelName = fc.d.engine.Policy().LevelName(lb.Level)
	}
	fc.d.auditRecord(rec)
}

// fieldValueOf returns the value of ev's first field named name.
func fieldValueOf(ev *decide.Event, name string) (string, bool) {
	for _, f := range ev.Fields {
		if f.Name == name {
			return f.Value, true
		}
	}
	return "", false
}

// testStage calls the in-package tests' hook at a stage of the commit
// point.
func (fc *fileChannel) testStage(stage string) {
	if h := fc.d.cfg.hooks; h != nil && h.commitStage != nil {
		h.commitStage(stage)
	}
}

// markLost marks every staged change to be decided again from the
// staging layer: file events were lost or malformed since the last commit
// point.
func (fc *fileChannel) markLost(changes []staging.Change) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for _, c := range changes {
		if c.Refused == "" {
			fc.lost[c.Path] = true
		}
	}
	fc.d.log.Info("file events were lost or malformed: the staged changes are decided again from the staging layer", "changes", len(changes))
}

// lostToDecide reports whether c was staged when events were lost and is
// to be decided again now from the staging layer (the caller forgets the
// mark once it is).
//
// A change whose decision is still held (in an open scope, or a question
// open to the oracle) keeps its mark until that decision is final: it is
// not asked about a second time meanwhile, and it is not committed before
// it is decided again. A refused one is aborted anyway. A removal or a
// new directory (nothing but its path, no content, mode or target to
// have missed) whose operation on that path was decided is not decided
// again: the staging layer's event is the one already decided (an
// operator's answer about a mkdir stands).
func (fc *fileChannel) lostToDecide(c staging.Change, state *pathState) bool {
	fc.mu.Lock()
	marked := fc.lost[c.Path]
	fc.mu.Unlock()
	if !marked {
		return false
	}
	switch fc.verdictOf(state) {
	case decide.Defer:
		return false
	case decide.Refuse:
		fc.dropLost(c.Path) // aborted, never committed
		return false
	}
	switch c.Op {
	case staging.OpMkdir, staging.OpRmdir, staging.OpUnlink:
		fc.mu.Lock()
		decided := state.ops[c.Op.EventOp()] && (c.Op != staging.OpMkdir || !state.ops["file:setxattr"])
		fc.mu.Unlock()
		if decided {
			fc.dropLost(c.Path)
			return false
		}
	}
	return true
}

// dropLost forgets path's loss mark: it is being decided from the staging
// layer.
func (fc *fileChannel) dropLost(path string) {
	fc.mu.Lock()
	delete(fc.lost, path)
	fc.mu.Unlock()
}

// noteStaged binds the decision just taken on c from the staging layer
// to the entry it saw: c as scanned (Stager.Event read the same digest).
func (fc *fileChannel) noteStaged(c staging.Change) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if ps := fc.paths[c.Path]; ps != nil {
		ps.staged, ps.digest, ps.size = true, c.Digest, c.Size
	}
}

// decidedAs reports whether ps's decisions saw the staged entry c: the
// path's last decision from the staging layer saw c's digest. Records
// alone never vouch for an entry with content, mode, attributes or a
// target: a file assembled from several writes has no single record that
// shows it, the bytes a shared mapping stores have no record at all, and
// a write whose system call had not returned at the commit point's second
// Sync has its bytes in the scan but its record after the verdicts. A
// removal, or a new directory, whose operation was decided on the path is
// that decision (nothing but its path to see) unless a user.* attribute
// was set on it: the staging layer's event shows the attributes' values,
// the traced setxattr only their names.
func (fc *fileChannel) decidedAs(ps *pathState, c staging.Change) bool {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	switch c.Op {
	case staging.OpUnlink, staging.OpRmdir, staging.OpMkdir:
		if ps.ops[c.Op.EventOp()] && (c.Op != staging.OpMkdir || !ps.ops["file:setxattr"]) {
			return true
		}
	}
	return ps.staged && ps.digest == c.Digest && ps.size == c.Size
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
		if commit && r.Reason == staging.ReasonChanged {
			// Not what was decided (written since the scan): nothing of
			// it went to W; it stays staged and is decided again, on its
			// new content, at the next commit point.
			fc.unseen[r.Path] = true
			fc.d.log.Info("staged change written since its decision: decided again at the next commit point", "path", r.Path, "op", r.Op.String())
			continue
		}
		fc.refuseLocked(r.String())
	}
	digests := make(map[string][32]byte, len(changes))
	for _, c := range changes {
		digests[c.Path] = c.Digest
	}
	for _, cf := range res.Conflicts {
		refused[cf.Path] = true // not in W: stays staged
		fc.conflictLocked(cf, digests[cf.Path])
	}
	for _, c := range changes {
		if refused[c.Path] {
			continue
		}
		delete(fc.paths, c.Path)
		if !commit {
			fc.images.aborted(c.Path)
		}
		if commit {
			fc.committed = append(fc.committed, c.Path)
			fc.commits++
		} else {
			fc.aborted = append(fc.aborted, c.Path)
			fc.aborts++
		}
	}
}

// refuseLocked records a staging refusal once; it reports whether it is
// new.
func (fc *fileChannel) refuseLocked(r string) bool {
	if fc.refusedSeen[r] {
		return false
	}
	fc.refusedSeen[r] = true
	fc.refusals = append(fc.refusals, r)
	return true
}

// conflictLocked records a conflict (once per staged version of its
// path): for the summary, the status and the audit log.
func (fc *fileChannel) conflictLocked(cf staging.Conflict, digest [32]byte) {
	if d, ok := fc.conflicted[cf.Path]; ok && d == digest {
		return
	}
	fc.conflicted[cf.Path] = digest
	fc.conflicts = append(fc.conflicts, cf)
	fc.d.log.Warn("conflict: not committed, the working directory keeps the user's version", "path", cf.Path, "op", cf.Op.String(), "reason", cf.Reason, "kept", cf.Kept)
	if fc.d.audit != nil {
		rec := struct {
			Type   string    `json:"type"`
			Time   time.Time `json:"time"`
			Run    string    `json:"run"`
			Op     string    `json:"op"`
			Path   string    `json:"path"`
			Reason string    `json:"reason"`
			Kept   string    `json:"kept,omitempty"`
		}{"conflict", time.Now().UTC(), fc.st.RunID(), cf.Op.EventOp(), cf.Path, cf.Reason, cf.Kept}
		fc.d.auditRecord(rec)
	}
}

// endRun ends the staging's run: a change released but not in W (its
// commit failed, or it was still being committed) is kept for the user as
// a conflict; what else is staged (refused, or undecided at the end) is
// discarded; the next run starts from a fresh base. When this fails the
// layers stay and the next run resumes them.
func (fc *fileChannel) endRun(ctx context.Context) {
	cfs, err := fc.st.Finish(ctx, func(c staging.Change) bool {
		ps := fc.state(c.Path)
		return ps != nil && fc.verdictOf(ps) == decide.Release && fc.decidedAs(ps, c)
	})
	fc.mu.Lock()
	for _, cf := range cfs {
		fc.conflictLocked(cf, [32]byte{1})
	}
	fc.mu.Unlock()
	if err != nil {
		fc.d.log.Error("end the staging run: its layers stay, the next run resumes them", "err", err)
	}
}

// conflictList returns the conflicts found so far.
func (fc *fileChannel) conflictList() []staging.Conflict {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return append([]staging.Conflict(nil), fc.conflicts...)
}

// migrateIndex moves the label index of the layout before W's state
// lived apart (in the layer directory) to the state directory, so that
// no committed label is forgotten by an upgrade.
func migrateIndex(layerDir, stateDir string) error {
	if layerDir == stateDir {
		return nil
	}
	old := filepath.Join(layerDir, "index")
	b, err := os.ReadFile(old)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("staging: migrate the label index: %w", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "index")); err == nil {
		return nil
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return fmt.Errorf("staging: migrate the label index: %w", err)
	}
	tmp := filepath.Join(stateDir, "index.migrate")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("staging: migrate the label index: %w", err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(stateDir, "index"))
	}
	if err != nil {
		return fmt.Errorf("staging: migrate the label index: %w", err)
	}
	return os.Remove(old)
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
	c := FileCounters{Events: fc.events, Unattributed: fc.unattributed, Committed: fc.commits, Aborted: fc.aborts, Refused: uint64(len(fc.refusals)),
		Run: fc.st.RunID(), State: fc.d.cfg.WorkStateDir, Labels: fc.st.Labels().Len()}
	for _, cf := range fc.conflicts {
		c.Conflicts = append(c.Conflicts, ConflictStatus{Path: cf.Path, Op: cf.Op.EventOp(), Reason: cf.Reason, Kept: cf.Kept})
	}
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
	fc.aliases.close()
	if fc.cg != nil {
		_ = fc.cg.Kill()
		_ = fc.cg.Remove()
	}
	err := fc.st.Unmount()
	if err == nil {
		// A finished run leaves nothing beside W (its layers are
		// discarded); an unfinished one keeps them for the next run.
		err = fc.st.Discard()
		if def := filepath.Join(filepath.Dir(fc.d.cfg.Workdir), ".carbd"); filepath.Dir(fc.d.cfg.StagingDir) == def {
			_ = os.Remove(def) // only if empty
		}
	}
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
