//go:build linux

package fileev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
)

// Defaults of Config.
const (
	DefaultRingBytes      = 4 << 20          // ring buffer: ~3,500 path records or ~23,000 data records
	DefaultMaxContent     = 1 << 20          // content read back per record
	DefaultWakeupInterval = time.Millisecond // at most one reader wake-up per interval
)

// Mechanisms a Tracer can attach with.
const (
	MechTPBTF = "tp_btf"         // BTF-typed raw tracepoints (preferred)
	MechRawTP = "raw_tracepoint" // plain raw tracepoints
)

// Errors.
var (
	ErrClosed   = errors.New("fileev: tracer closed")
	ErrNotFound = errors.New("fileev: no such target")
)

// Config configures a Tracer.
type Config struct {
	// Root is M, the merged view of the working directory on the host.
	// Paths are reported relative to it; content is read back from it
	// (resolved inside it, as a chroot would). Required, absolute.
	Root string
	// RingBytes is the size of the BPF ring buffer: a power of two and a
	// multiple of the page size. 0 means DefaultRingBytes.
	RingBytes int
	// MaxContent bounds the content read back for one record (what a
	// read returned, what a write stored). Beyond it, Record.Content
	// holds the first MaxContent bytes and ContentTruncated is set. 0
	// means DefaultMaxContent; negative reads no content.
	//
	// The kernel side copies the first min(MaxContent, 4096) bytes of
	// the buffer of a read, pread64, write or pwrite64 of a regular file
	// on M's filesystem into its record, at the syscall's exit: such a
	// record's content is those bytes (Record.ContentCaptured), exactly
	// what was read or written, with nothing read back. Larger calls,
	// the vector forms, copies and mmaps are read back from M.
	MaxContent int
	// ReadBack turns the kernel's copy off: every record's content is
	// read back from M, as before the copy existed (for comparison).
	ReadBack bool
	// Attach forces a mechanism (MechTPBTF or MechRawTP). Empty probes:
	// tp_btf, then raw_tracepoint.
	Attach string
	// WakeupInterval batches the wake-ups of Run: the kernel side wakes
	// it at most once per interval (and when WakeupBytes wait); Run,
	// once woken, looks at the ring again an interval later for the
	// records submitted meanwhile, until a wake-up is due again. A
	// record waits unread at most about two intervals; Sync always
	// wakes Run at once. 0 means DefaultWakeupInterval; negative wakes
	// Run whenever it has caught up (the kernel's default: one wake-up
	// per record when Run keeps up).
	WakeupInterval time.Duration
	// WakeupBytes wakes Run within an interval once this many bytes of
	// records wait, so that a burst does not fill the ring. 0 means
	// RingBytes/8.
	WakeupBytes int
	// ReadGen is the sandbox's read generation, shared with its TC
	// program (pkg/hooks/tcx NewReadGen, Config.ReadGen): the kernel side
	// adds one to it after every record of a read, copy or mmap of a
	// regular file on M's filesystem, and after every loss
	// (bpf/include/carbd/read_gen.h). Nil: the tracer has a map of its own.
	ReadGen *ebpf.Map
	// PinDir is the directory on a bpf filesystem where the host's one
	// file tracer is pinned, shared by every Tracer (every carbd) that
	// names the same directory: each takes a slot of it. Empty:
	// DefaultPinDir (mounting /sys/fs/bpf if needed). See
	// docs/file-events.md, "One tracer per host".
	PinDir string
}

// Target selects processes to trace: a process by pid (and, unless
// NoFollow, every child it forks afterwards) or every process of a cgroup
// v2 and its descendants.
type Target struct {
	PID    int    // a process (thread group) id
	Cgroup string // or the path of a cgroup v2 directory, e.g. /sys/fs/cgroup/unified/sbx
	// View is where M appears in the traced processes' mount namespace:
	// "/" for virtiofsd (it pivots into M), the bind mount's target for a
	// namespace sandbox. Empty means Config.Root (same namespace).
	View     string
	NoFollow bool // PID only: do not trace children forked after Trace
}

// Stats are the loss and error counters.
type Stats struct {
	RingFull     uint64 // records the kernel could not reserve: ring buffer full
	InflightFull uint64 // syscall entries that could not be remembered
	ForkUntraced uint64 // children of a followed pid that could not be traced
	Compat       uint64 // ia32/x32 syscalls of traced processes (not decoded)
	Malformed    uint64 // records that did not decode or resolve
}

// Handler receives, in ring order, every record and the decide.Events it
// maps to (see Events). It runs on Run's goroutine: a slow handler makes
// the ring buffer fill and records be lost (and counted). r and evs are
// Run's, reused for the next record: a handler that keeps them after it
// returns copies them (*r, the Events by value; the strings and Fields
// in them are not reused and may be kept).
type Handler func(r *Record, evs []decide.Event)

type traceTarget struct {
	t     Target
	cgID  uint64
	level int
}

// Tracer traces the file syscalls of selected processes. Its methods are
// safe for concurrent use; Run is called once.
type Tracer struct {
	cfg     Config
	mech    string
	note    string // why the preferred mechanism was not used
	host    *host
	sl      *slot
	shared  *shared
	rd      *ringbuf.Reader
	root    *os.File // M, O_PATH: content reads resolve beneath it
	rootDev uint32   // kernel encoding
	rootIno uint64
	boot    func(uint64) time.Time
	ktime   func() int64

	mu      sync.Mutex // guards the fields below
	targets map[int]*traceTarget
	nextID  int
	waiters map[uint64]chan struct{}
	running bool
	closed  bool

	files fileCache // Run's open files of M, by inode
	// Run's record being handled, reused for every record (see Handler).
	raw  rawEvent
	rec  Record
	evs  []decide.Event
	last [2]string // the last path of each slot decoded: a repeated path is not copied again

	seeds    []seed // guarded by mu: process state taken by Trace, for Run
	hasSeeds atomic.Bool

	cookie    atomic.Uint64
	malformed atomic.Uint64
	acked     atomic.Uint64
}

// seed is a traced process's working directory and descriptors, read
// from /proc when Trace starts tracing it: Run's resolver starts from it,
// so descriptors opened before Trace resolve even after the process has
// exited.
type seed struct {
	pid int
	st  *procState
}

// snapshot reads pid's working directory and file descriptors from /proc.
func snapshot(pid int) (seed, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	st := &procState{fds: map[int]fdEntry{}}
	cwd, err := os.Readlink(dir + "/cwd")
	if err != nil {
		return seed{}, err
	}
	st.cwd = cwd
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		return seed{}, err
	}
	for _, ent := range ents {
		fd, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		p, err := os.Readlink(dir + "/fd/" + ent.Name())
		if err != nil || !strings.HasPrefix(p, "/") {
			continue
		}
		e := fdEntry{path: strings.TrimSuffix(p, " (deleted)")}
		var fst unix.Stat_t
		if unix.Stat(dir+"/fd/"+ent.Name(), &fst) == nil {
			e.dev, e.ino, e.known = unix.Major(fst.Dev)<<20|unix.Minor(fst.Dev), fst.Ino, true
		}
		st.fds[fd] = e
	}
	return seed{pid: pid, st: st}, nil
}

// addSeeds snapshots pids for Run. t.mu is held.
func (t *Tracer) addSeeds(pids ...int) {
	for _, pid := range pids {
		if s, err := snapshot(pid); err == nil {
			t.seeds = append(t.seeds, s)
		}
	}
	if len(t.seeds) > 0 {
		t.hasSeeds.Store(true)
	}
}

// applySeeds hands the pending snapshots to Run's resolver.
func (t *Tracer) applySeeds(res *resolver) {
	t.mu.Lock()
	seeds := t.seeds
	t.seeds = nil
	t.hasSeeds.Store(false)
	t.mu.Unlock()
	for _, s := range seeds {
		res.procs[s.pid] = s.st
	}
}

// cgroupPids lists the processes of a cgroup and its descendants.
func cgroupPids(dir string) []int {
	var pids []int
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, w := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(w); err == nil {
				pids = append(pids, n)
			}
		}
		return nil
	})
	return pids
}

// New takes a slot of the host's file tracer pinned in Config.PinDir,
// loading, attaching (probing tp_btf, then raw_tracepoint) and pinning
// it first when no live Tracer of this build has, and opens the slot's
// ring buffer. Nothing is traced until Trace. Needs root (CAP_BPF,
// CAP_PERFMON, CAP_SYS_ADMIN), BTF and a bpf filesystem.
func New(cfg Config) (_ *Tracer, err error) {
	if cfg.Root == "" || !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("fileev: config: root %q is not an absolute path", cfg.Root)
	}
	cfg.Root = filepath.Clean(cfg.Root)
	if cfg.RingBytes == 0 {
		cfg.RingBytes = DefaultRingBytes
	}
	page := os.Getpagesize()
	if cfg.RingBytes < page || cfg.RingBytes&(cfg.RingBytes-1) != 0 {
		return nil, fmt.Errorf("fileev: config: ring bytes %d is not a power of two of at least %d", cfg.RingBytes, page)
	}
	if cfg.MaxContent == 0 {
		cfg.MaxContent = DefaultMaxContent
	}
	if cfg.WakeupInterval == 0 {
		cfg.WakeupInterval = DefaultWakeupInterval
	}
	switch {
	case cfg.WakeupBytes == 0:
		cfg.WakeupBytes = cfg.RingBytes / 8
	case cfg.WakeupBytes < 0 || cfg.WakeupBytes > cfg.RingBytes:
		return nil, fmt.Errorf("fileev: config: wakeup bytes %d not within the ring's %d", cfg.WakeupBytes, cfg.RingBytes)
	}
	switch cfg.Attach {
	case "", MechTPBTF, MechRawTP:
	default:
		return nil, fmt.Errorf("fileev: config: attach %q (want %s or %s)", cfg.Attach, MechTPBTF, MechRawTP)
	}
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if !filepath.IsAbs(cfg.PinDir) {
		return nil, fmt.Errorf("fileev: config: pin dir %q is not an absolute path", cfg.PinDir)
	}
	t := &Tracer{cfg: cfg, targets: map[int]*traceTarget{}, waiters: map[uint64]chan struct{}{}}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	fd, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fileev: open root %s: %w", cfg.Root, err)
	}
	t.root = os.NewFile(uintptr(fd), cfg.Root)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fileev: stat root %s: %w", cfg.Root, err)
	}
	t.rootDev, t.rootIno = unix.Major(st.Dev)<<20|unix.Minor(st.Dev), st.Ino

	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("fileev: read monotonic clock: %w", err)
	}
	wall, mono := time.Now(), ts.Nano()
	t.boot = func(ns uint64) time.Time { return wall.Add(time.Duration(int64(ns) - mono)) }
	// The kernel's monotonic clock (bpf_ktime_get_ns) now, from Go's
	// monotonic reading: no system call.
	t.ktime = func() int64 { return mono + int64(time.Since(wall)) }

	order := []string{MechTPBTF, MechRawTP}
	if cfg.Attach != "" {
		order = []string{cfg.Attach}
	}
	dataMax := uint32(min(max(t.cfg.MaxContent, 0), dataMax))
	if t.cfg.ReadBack {
		dataMax = 0
	}
	t.host, t.sl, t.shared, t.note, err = openShared(sharedConfig{
		base:      cfg.PinDir,
		order:     order,
		ringBytes: cfg.RingBytes,
		gen:       cfg.ReadGen,
		slot: ftSlot{
			WakeupNS:    uint64(max(t.cfg.WakeupInterval, 0)),
			WakeupBytes: uint64(t.cfg.WakeupBytes),
			OwnerTgid:   uint32(os.Getpid()),
			GenDev:      t.rootDev,
			DataMax:     dataMax,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("fileev: shared tracer: %w", err)
	}
	t.mech = t.host.mech
	if t.rd, err = ringbuf.NewReader(t.sl.ring); err != nil {
		return nil, fmt.Errorf("fileev: open ring buffer: %w", err)
	}
	return t, nil
}

// detach gives the slot back (the last one out unpins the tracer). The
// fields stay set (their handles closed): Stats and Sync after Close fail
// on them.
func (t *Tracer) detach() error {
	if t.shared == nil {
		return nil
	}
	sh := t.shared
	t.shared = nil
	if err := sh.release(t.host, t.sl); err != nil {
		return fmt.Errorf("fileev: give slot %d back: %w", t.sl.n, err)
	}
	return nil
}

// Generation reads the read generation (Config.ReadGen): it moves after
// the record of every read of M is in the ring buffer, so a Sync after
// reading it returns once those reads are handled.
func (t *Tracer) Generation() (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.sl == nil {
		return 0, ErrClosed
	}
	var g uint64
	if err := t.sl.gen.Lookup(uint32(0), &g); err != nil {
		return 0, fmt.Errorf("fileev: read the read generation: %w", err)
	}
	return g, nil
}

// Mechanism says how the tracer is attached (MechTPBTF or MechRawTP) and,
// when the preferred one was refused, why.
func (t *Tracer) Mechanism() (mech, note string) { return t.mech, t.note }

// Close gives the slot back (the last Tracer of the host to close
// unpins the tracer, and the kernel detaches it) and frees the slot's
// maps. Run returns.
func (t *Tracer) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	var errs []error
	errs = append(errs, t.detach())
	if t.rd != nil {
		errs = append(errs, t.rd.Close())
	}
	if t.root != nil {
		errs = append(errs, t.root.Close())
	}
	return errors.Join(errs...)
}

// Trace starts tracing target and returns its id (Record.Target).
// Descriptors the processes opened before Trace are resolved through
// /proc when first used.
func (t *Tracer) Trace(tg Target) (int, error) {
	if (tg.PID > 0) == (tg.Cgroup != "") {
		return 0, fmt.Errorf("fileev: target: give exactly one of a pid or a cgroup")
	}
	if tg.PID == os.Getpid() {
		return 0, fmt.Errorf("fileev: target: pid %d is carbd itself (its content reads would feed back)", tg.PID)
	}
	if tg.View != "" {
		if !filepath.IsAbs(tg.View) {
			return 0, fmt.Errorf("fileev: target: view %q is not an absolute path", tg.View)
		}
		tg.View = filepath.Clean(tg.View)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, ErrClosed
	}
	id := t.nextID + 1
	tt := &traceTarget{t: tg}
	val := ftTarget{ID: uint32(id), Slot: t.sl.n, Epoch: t.sl.epoch}
	if tg.PID > 0 {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", tg.PID)); err != nil {
			return 0, fmt.Errorf("fileev: target: pid %d: %w", tg.PID, err)
		}
		if !tg.NoFollow {
			val.Flags = ftFollow
		}
		if err := t.host.pids.Update(uint32(tg.PID), val, ebpf.UpdateNoExist); err != nil {
			return 0, fmt.Errorf("fileev: trace pid %d: %w", tg.PID, err)
		}
	} else {
		cg, err := OpenCgroup(tg.Cgroup)
		if err != nil {
			return 0, err
		}
		if cg.Level < 1 || cg.Level >= maxCgroupLevel {
			return 0, fmt.Errorf("fileev: target: cgroup %s is at level %d (want 1 to %d)", tg.Cgroup, cg.Level, maxCgroupLevel-1)
		}
		tt.cgID, tt.level = cg.ID, cg.Level
		val.Level = uint32(cg.Level)
		// Under the host-wide lock: the levels are the union of every
		// slot's cgroups.
		err = t.shared.locked(func() error {
			if err := t.host.cgroups.Update(cg.ID, val, ebpf.UpdateNoExist); err != nil {
				return fmt.Errorf("fileev: trace cgroup %s: %w", tg.Cgroup, err)
			}
			if err := t.host.syncLevels(); err != nil {
				t.host.cgroups.Delete(cg.ID)
				return err
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	t.nextID = id
	t.targets[id] = tt
	// Snapshot after the BPF side traces them: a change in between shows
	// in both, and replaying it is harmless.
	if tg.PID > 0 {
		t.addSeeds(tg.PID)
	} else {
		t.addSeeds(cgroupPids(tg.Cgroup)...)
	}
	return id, nil
}

const maxCgroupLevel = 16 // FT_MAX_CGROUP_LEVEL

// Untrace stops tracing target id: the pid and every child that followed
// it, or the cgroup.
func (t *Tracer) Untrace(id int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrClosed
	}
	tt, ok := t.targets[id]
	if !ok {
		return fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	delete(t.targets, id)
	if tt.cgID != 0 {
		return t.shared.locked(func() error {
			if err := t.host.cgroups.Delete(tt.cgID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("fileev: untrace cgroup %s: %w", tt.t.Cgroup, err)
			}
			return t.host.syncLevels()
		})
	}
	n := t.sl.n
	if err := deleteWhere(t.host.pids, func(v ftTarget) bool { return v.ID == uint32(id) && v.Slot == n }, new(uint32)); err != nil {
		return fmt.Errorf("fileev: untrace %d: %w", id, err)
	}
	return nil
}

func (t *Tracer) view(id uint32) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tt, ok := t.targets[int(id)]
	if !ok {
		return "", false
	}
	return tt.t.View, true
}

// Stats reads the loss counters.
func (t *Tracer) Stats() Stats {
	var s Stats
	s.Malformed = t.malformed.Load()
	var per []uint64
	sl, h := t.sl, t.host
	if sl == nil {
		return s
	}
	for i, dst := range []*uint64{&s.RingFull, &s.InflightFull, &s.ForkUntraced, &s.Compat} {
		if err := h.counters.Lookup(sl.n*counterKeys+uint32(i), &per); err != nil {
			continue
		}
		for _, v := range per {
			*dst += v
		}
	}
	return s
}

// Lost is the number of records the kernel side could not deliver (ring
// buffer full, entry map full, untraceable child, ia32/x32 syscalls it
// does not decode). Any loss means the event stream is incomplete:
// re-scan the staged layer before committing.
func (t *Tracer) Lost() uint64 {
	s := t.Stats()
	return s.RingFull + s.InflightFull + s.ForkUntraced + s.Compat
}

// TakeRescan reports whether records were lost or malformed since the
// last call, and acknowledges them. The daemon calls it (after Sync)
// before committing: true means re-scan the upper layer instead of
// trusting the event stream.
func (t *Tracer) TakeRescan() bool {
	total := t.Lost() + t.malformed.Load()
	return t.acked.Swap(total) != total
}

// Run reads the ring buffer until ctx is done or the tracer is closed,
// resolving each record and calling h. When the loss counters grow it
// calls h with a KindLoss record. It returns nil when ctx is done and
// ErrClosed after Close.
func (t *Tracer) Run(ctx context.Context, h Handler) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	if t.running {
		t.mu.Unlock()
		return fmt.Errorf("fileev: Run called twice")
	}
	t.running = true
	t.mu.Unlock()

	defer t.files.clear()
	res := newResolver(t.cfg.Root, t.rootDev, t.rootIno, hostProc{}, t.view, t.boot)
	var lastLost uint64
	var lastCheck time.Time
	checkLoss := func() {
		lastCheck = time.Now()
		if n := t.Lost(); n > lastLost {
			lastLost = n
			h(&Record{Kind: KindLoss, Time: time.Now(), Lost: n, FD: -1}, nil)
		}
	}
	var raw ringbuf.Record
	// Run's phases (see Config.WakeupInterval): idle, asleep until a
	// wake-up; active, looking every interval for records submitted
	// without a wake-up; draining, one last look once a wake-up is due
	// again for any new record. An idle Run does not look at the loss
	// counters on a timer: a record the ring had no room for leaves the
	// ring full, which wakes Run, and every Sync (the daemon syncs
	// before each decision) looks at them before it returns.
	const (
		idle = iota
		active
		draining
	)
	phase := idle
	// An idle Run waits with no deadline: ctx's end wakes it.
	stop := context.AfterFunc(ctx, func() { _ = t.rd.Flush() })
	defer stop()
	for n := 0; ; n++ {
		if ctx.Err() != nil {
			return nil
		}
		if t.hasSeeds.Load() {
			t.applySeeds(res)
		}
		switch phase {
		case idle:
			t.rd.SetDeadline(time.Time{}) // until a record or Close
		case active:
			// The reader's epoll_wait counts whole milliseconds,
			// rounded down: without the extra one an interval of 1 ms
			// would be a 0 ms wait, and Run would spin.
			t.rd.SetDeadline(time.Now().Add(t.cfg.WakeupInterval + time.Millisecond))
		case draining:
			t.rd.SetDeadline(time.Now())
		}
		err := t.rd.ReadInto(&raw)
		switch {
		case errors.Is(err, ringbuf.ErrFlushed):
			continue // ctx is done: the loop's first check returns
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The ring is drained.
			switch {
			case phase == active && t.wakeupDue():
				phase = draining
			case phase == active:
			default:
				phase = idle
				t.files.clear()
				checkLoss()
			}
			continue
		case errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed):
			return ErrClosed
		case err != nil:
			return fmt.Errorf("fileev: read ring buffer: %w", err)
		}
		if t.cfg.WakeupInterval > 0 {
			phase = active
		}
		if t.hasSeeds.Load() {
			t.applySeeds(res)
		}
		t.handle(res, raw.RawSample, h, checkLoss)
		if raw.Remaining == 0 && phase != active {
			// Caught up and idle: hold no files of M open (they
			// would pin it against an unmount). An active Run keeps
			// them until it goes idle, a few intervals later.
			t.files.clear()
		}
		// The loss counters are a few map reads: looked at every 512
		// records, at most every 10 ms when caught up, and before a
		// Sync returns.
		if n%512 == 0 || (raw.Remaining == 0 && time.Since(lastCheck) >= 10*time.Millisecond) {
			checkLoss()
		}
	}
}

// wakeupDue reports whether the kernel side wakes Run for the next
// record: its last forced wake-up is more than an interval old, with an
// interval's margin for a record whose wake-up was decided before and
// that is still being written.
func (t *Tracer) wakeupDue() bool {
	last, err := t.sl.lastWakeup()
	if err != nil {
		return false // stay active: polling is safe
	}
	return time.Duration(t.ktime()-int64(last)) >= 2*t.cfg.WakeupInterval
}

// handle decodes, resolves and hands on one record. A sync marker is
// acknowledged after checkLoss, so that a loss before it is reported
// before Sync returns.
func (t *Tracer) handle(res *resolver, b []byte, h Handler, checkLoss func()) {
	e := &t.raw
	if err := decodeInto(e, b, &t.last); err != nil {
		t.malformed.Add(1)
		h(&Record{Kind: KindSyscall, Time: time.Now(), FD: -1, Malformed: err.Error()}, nil)
		return
	}
	if e.Kind == kMarker {
		checkLoss()
		t.mu.Lock()
		if ch, ok := t.waiters[e.Args[0]]; ok {
			close(ch)
			delete(t.waiters, e.Args[0])
		}
		t.mu.Unlock()
		return
	}
	rec := &t.rec
	res.resolveInto(rec, e)
	if rec.Malformed != "" {
		t.malformed.Add(1)
	}
	t.content(rec, e)
	clear(t.evs) // hold no content of the previous record
	t.evs = appendEvents(t.evs[:0], rec)
	h(rec, t.evs)
}

// Sync returns once Run has handled every record of the syscalls that
// returned before Sync was called: it submits a marker record behind them
// and waits for Run to read it. Without Run it waits until ctx is done.
func (t *Tracer) Sync(ctx context.Context) error {
	cookie := t.cookie.Add(1)
	ch := make(chan struct{})
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrClosed
	}
	t.waiters[cookie] = ch
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.waiters, cookie)
		t.mu.Unlock()
	}()
	for {
		ret, err := t.host.marker.Run(&ebpf.RunOptions{Context: [2]uint64{cookie, uint64(t.sl.n)}})
		if err != nil {
			return fmt.Errorf("fileev: run sync marker: %w", err)
		}
		if ret == 1 {
			break
		}
		if ret == 2 {
			return fmt.Errorf("fileev: run sync marker: slot %d has no ring buffer", t.sl.n)
		}
		// The ring is full: wait for Run to make room.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// content is what a data operation moved, bounded by MaxContent: the
// bytes the kernel copied at the syscall (e.Data) when they cover it,
// else read back from M.
func (t *Tracer) content(r *Record, e *rawEvent) {
	if t.cfg.MaxContent < 0 || r.Kind != KindSyscall || r.Ret <= 0 || r.Malformed != "" {
		return
	}
	if e.HasData && (r.Op == OpRead || r.Op == OpWrite) && r.InRoot &&
		(e.Whole || len(e.Data) >= t.cfg.MaxContent) {
		r.Content = e.Data
		r.ContentCaptured = true
		if len(r.Content) > t.cfg.MaxContent {
			r.Content = r.Content[:t.cfg.MaxContent]
		}
		r.ContentTruncated = r.Ret > int64(len(r.Content))
		return
	}
	rel, off, n, ino := r.Path, r.Offset, r.Length, r.Ino
	switch r.Op {
	case OpRead, OpWrite:
		if !r.InRoot {
			return
		}
	case OpMmap:
		if !r.InRoot || r.Mode&protRead == 0 {
			return
		}
	case OpCopy:
		switch {
		case r.InRoot && r.Path != "":
		case r.InRoot2 && r.Path2 != "":
			rel, off, ino = r.Path2, r.Offset2, 0 // Ino is the source's
		default:
			return
		}
	default:
		return
	}
	if off < 0 {
		r.ContentErr = "offset unknown"
		return
	}
	if n > int64(t.cfg.MaxContent) {
		n = int64(t.cfg.MaxContent)
		r.ContentTruncated = true
	}
	fd, err := t.files.open(int(t.root.Fd()), rel, ino)
	if err != nil {
		r.ContentErr = err.Error()
		return
	}
	// Read into a buffer of the record's own: the bytes become
	// Content without a copy.
	buf := make([]byte, n)
	got := 0
	for got < len(buf) {
		m, err := unix.Pread(fd, buf[got:], off+int64(got))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			r.ContentErr = fmt.Sprintf("read %s: %v", rel, err)
			break
		}
		if m == 0 {
			break // the file shrank since
		}
		got += m
	}
	r.Content = ownedString(buf, got)
}

// ownedString is buf[:n] as a string without a copy; buf must not be
// written again. A buffer mostly unused (the file shrank since) is
// copied instead, so a short Content does not pin a large buffer.
func ownedString(buf []byte, n int) string {
	if n == 0 {
		return ""
	}
	if 2*n < len(buf) {
		return string(buf[:n])
	}
	return unsafe.String(unsafe.SliceData(buf), n)
}

// hostProc reads /proc.
type hostProc struct{}

func (hostProc) FDPath(pid, fd int) (string, error) {
	return os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + strconv.Itoa(fd))
}

func (hostProc) Root(pid int) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/root", &st); err != nil {
		return 0, 0, err
	}
	return st.Dev, st.Ino, nil
}

func (hostProc) Cwd(pid int) (string, error) {
	return os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd")
}

func (hostProc) NSPids(pid int) ([]int, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		var out []int
		for _, w := range strings.Fields(rest) {
			if n, err := strconv.Atoi(w); err == nil {
				out = append(out, n)
			}
		}
		return out, nil
	}
	return nil, sc.Err()
}

// fileCache keeps files of M open while Run works through a burst of
// records, so content read-back is one pread. Entries are keyed by inode
// (the record says which inode the process read or wrote): a file
// renamed since is still the same file, a file replaced since is a
// different key. Run clears it whenever it has caught up. Only Run's
// goroutine uses it.
type fileCache struct {
	fds   map[uint64]int
	order []uint64
}

const fileCacheSize = 64

// open returns a descriptor for rel, resolved beneath root as a chroot
// would (a symlink in M cannot lead out of it), checked to be inode ino
// when ino is not 0. The descriptor belongs to the cache.
func (c *fileCache) open(root int, rel string, ino uint64) (int, error) {
	if fd, ok := c.fds[ino]; ok && ino != 0 {
		return fd, nil
	}
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("open %s in root: %w", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is no longer a regular file", rel)
	}
	key := st.Ino
	if ino != 0 && st.Ino != ino {
		// The record has the kernel's inode of the open file, the
		// overlay's own; stat of a file copied up from a lower file with
		// a second link (carbd's base is a hard-link farm) gives the
		// upper file's. fdinfo has the kernel's.
		if k, err := KernelIno(fd); err != nil || k != ino {
			unix.Close(fd)
			return -1, fmt.Errorf("%s was replaced since the operation", rel)
		}
		key = ino
	}
	if c.fds == nil {
		c.fds = map[uint64]int{}
	}
	if old, ok := c.fds[key]; ok {
		unix.Close(old)
	} else {
		c.order = append(c.order, key)
	}
	c.fds[key] = fd
	if len(c.order) > fileCacheSize {
		victim := c.order[0]
		c.order = c.order[1:]
		unix.Close(c.fds[victim])
		delete(c.fds, victim)
	}
	return fd, nil
}

func (c *fileCache) clear() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	clear(c.fds)
	c.order = c.order[:0]
}

// KernelIno returns the inode number of the file open at fd as the kernel
// holds it (/proc/self/fdinfo: file_inode(f)->i_ino), the number a
// Record's Ino carries. On overlayfs it can differ from what fstat
// reports: a file copied up from a lower file with more than one link
// keeps the overlay's inode number, and fstat gives the upper file's.
func KernelIno(fd int) (uint64, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "ino:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("fdinfo of descriptor %d: no ino line", fd)
}
