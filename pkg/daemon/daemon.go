package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/sandbox/netns"
	"github.com/carbd/carbd/pkg/staging"
)

// DefaultStateDir holds carbd's per-sandbox state: sockets, the audit log,
// the sandbox index locks.
const DefaultStateDir = "/run/carbd"

// DefaultWorkStateRoot holds the state of each working directory that
// outlives runs, restarts and reboots (docs/staging.md): its committed
// labels, the conflicts kept for its user. One directory per working
// directory, named by WorkStateID.
const DefaultWorkStateRoot = "/var/lib/carbd/w"

// Config configures one `carbd run`.
type Config struct {
	// ID names the sandbox: 1-11 of [a-z0-9-]. Empty: derived from the
	// working directory, so a restart after a crash finds its state.
	ID       string
	StateDir string // default DefaultStateDir
	// StagingDir holds the overlay layers and the journal; it must be on
	// the working directory's filesystem. Empty: <parent of W>/.carbd/<id>.
	StagingDir string
	// WorkStateDir is the working directory's state that outlives runs,
	// restarts and reboots: the committed labels and created-path index,
	// the pending labels and the conflicts kept for the user. Empty:
	// DefaultWorkStateRoot/<WorkStateID(W)>. Never visible in the sandbox.
	WorkStateDir string

	PolicyPath string
	Policy     *decide.Policy
	Workdir    string
	Task       string
	Backend    string // netns (default), qemu, cloud-hypervisor
	Oracle     decide.Oracle
	// Operator is set when the oracle is the operator (carbd approve/deny).
	Operator    *decide.Operator
	Calibration *calib.Artifact
	Argv        []string
	// Env is NAME=VALUE for the agent's environment besides carbd's own
	// (carbd run --env): handed to the sandbox through a pipe, never an
	// argument. Their values are credentials: bind them to the Policy
	// with decide.Policy.WithCredentials.
	Env []string
	// Binds are extra bind mounts into the sandbox (tools, the agent's
	// program); read-only unless marked writable.
	Binds []netns.Bind
	// Intercept configures the TLS interception of the guest's HTTPS
	// (netns backend; docs/interception.md).
	Intercept InterceptConfig
	// UID and GID the sandbox's root maps to; default: the owner of W.
	UID, GID int
	// DNS: upstream resolvers for the sandbox's resolver, and static
	// names (offline hosts, the demo).
	Upstream []netip.AddrPort
	Hosts    map[string][]netip.Addr
	// HoldTimeout bounds how long a packet waits for a decision.
	HoldTimeout time.Duration
	// AuditPath gets the JSON-lines decision log (also kept in the
	// sandbox's state directory).
	AuditPath string
	// AuditLogMaxBytes: a run that finds the decision log of the
	// sandbox's state directory this big starts it afresh, the previous
	// one kept as audit.jsonl.1 (0: DefaultAuditLogMaxBytes; negative:
	// never).
	AuditLogMaxBytes int64
	// Pcap, when set, is the file the run's pcapng audit is streamed to
	// (mode 0600); empty: <WorkStateDir>/runs/<run>/audit.pcapng.
	Pcap string
	// PcapMaxBytes caps that file (0: DefaultPcapMaxBytes; negative: no
	// cap).
	PcapMaxBytes int64
	// Metrics, when set, is the address Prometheus metrics are served on.
	Metrics string
	// MetricsTextfile, when set, is a directory (node_exporter's textfile
	// collector) where carbd_<id>.prom is rewritten every few seconds and
	// a last time when the run ends: the run's final counts outlive it.
	MetricsTextfile string
	Stdin           io.Reader
	Stdout          io.Writer
	Stderr          io.Writer
	Log             *slog.Logger

	// FileRingBytes is the size of the file tracer's ring buffer (see
	// fileev.Config.RingBytes): 0 means fileev.DefaultRingBytes. A small
	// ring loses events under a burst of writes; the staged changes are
	// then decided from the staging layer (docs/file-events.md).
	FileRingBytes int

	// StagedContentLimit bounds the staged content one decision is shown
	// (staging.Config.ContentLimit: a staged file's new content or
	// changed region, and the sum of its user.* attribute values): 0
	// means staging.DefaultContentLimit (32 MiB). A change with more to
	// show is not decided: it stays staged, reported, never committed
	// (docs/staging.md). The bound is what one decision may hold in
	// memory; from MinStagedContentLimit to MaxStagedContentLimit.
	StagedContentLimit int

	// VM configures the qemu and cloud-hypervisor backends.
	VM VMConfig

	// hooks are in-package tests' view of the running daemon.
	hooks *testHooks
}

// testHooks let an in-package test reach the running daemon: started is
// called when the setup is done, failing when a component's failure is
// ending the run (the sandbox is stopped, the operator socket still
// answers), commitStage at the commit point's stages ("scan": before the
// staging layer is scanned; "sync": before the tracer is drained after
// the scan; "done": at its end), fileRecord with each traced record
// before it is handled (valid during the call only).
type testHooks struct {
	started     func(*daemon)
	failing     func(*daemon)
	commitStage func(stage string)
	fileRecord  func(*fileev.Record)
}

// Summary is what `carbd run` prints when the sandbox ends.
type Summary struct {
	ID           string
	ExitCode     int
	Released     []decide.Decision
	Refused      []decide.Decision
	Held         []decide.Decision // still held when the run ended (then refused)
	Committed    []string
	Aborted      []string
	FileRefusals []string
	// Conflicts are staged changes not committed because the user changed
	// the path in the working directory under the agent (or released
	// changes not committed when the run ended): the user's version is in
	// W, the agent's is kept at Conflict.Kept.
	Conflicts []staging.Conflict
	Stats     decide.Stats
	Stopped   bool
	// Failed is the component whose failure ended the run (nil: the
	// command ended, or carbd was stopped). The effects held then were
	// refused; staged changes stay staged for the next run.
	Failed *ComponentError
}

// WorkStateID names a working directory's state: a digest of its absolute
// path, device and inode, so a directory removed and made again at the
// same path, or another filesystem mounted there, does not inherit the
// labels of the one before.
func WorkStateID(workdir string) (string, error) {
	abs, err := filepath.Abs(workdir)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return "", fmt.Errorf("working directory %s: %w", abs, err)
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", filepath.Clean(abs), st.Dev, st.Ino))
	return hex.EncodeToString(h[:10]), nil
}

// DefaultID derives a sandbox id from the working directory.
func DefaultID(workdir string) string {
	h := sha256.Sum256([]byte(filepath.Clean(workdir)))
	return "w" + hex.EncodeToString(h[:5])
}

func (c *Config) validate() error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("carbd run needs root (BPF, netfilter, namespaces, overlayfs mounts)"))
	}
	if c.Policy == nil {
		errs = append(errs, errors.New("no policy"))
	}
	if len(c.Argv) == 0 {
		errs = append(errs, errors.New("no command to run (carbd run ... -- COMMAND)"))
	}
	workOK := false // one error about a missing working directory, not three
	if c.Workdir == "" {
		errs = append(errs, errors.New("no working directory (--workdir)"))
	} else if abs, err := filepath.Abs(c.Workdir); err != nil {
		errs = append(errs, err)
	} else if st, err := os.Stat(abs); err != nil {
		errs = append(errs, fmt.Errorf("working directory %s: %w", abs, errors.Unwrap(err)))
	} else if !st.IsDir() {
		errs = append(errs, fmt.Errorf("working directory %s is not a directory", abs))
	} else {
		workOK = true
		c.Workdir = abs
		if c.UID == 0 && c.GID == 0 {
			sys := st.Sys().(*syscall.Stat_t)
			c.UID, c.GID = int(sys.Uid), int(sys.Gid)
		}
	}
	if workOK && (c.UID == 0 || c.GID == 0) {
		errs = append(errs, fmt.Errorf("the working directory belongs to root: the sandbox's root must map to an unprivileged user; chown it to one, or pass --uid/--gid"))
	}
	if c.Backend == "" {
		c.Backend = "netns"
	}
	if _, ok := backends[c.Backend]; c.Backend != "netns" && !ok {
		errs = append(errs, fmt.Errorf("unknown backend %q (want netns, qemu or cloud-hypervisor)", c.Backend))
	}
	if c.ID == "" {
		c.ID = DefaultID(c.Workdir)
	}
	if err := netns.CheckID(c.ID); err != nil {
		// Before anything is created from it: the id names directories.
		errs = append(errs, err)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.StagingDir == "" && c.Workdir != "" {
		c.StagingDir = filepath.Join(filepath.Dir(c.Workdir), ".carbd", c.ID)
	}
	if c.WorkStateDir == "" && workOK {
		if id, err := WorkStateID(c.Workdir); err != nil {
			errs = append(errs, err)
		} else {
			c.WorkStateDir = filepath.Join(DefaultWorkStateRoot, id)
		}
	}
	if c.Oracle == nil {
		c.Oracle = decide.Strict{}
	}
	if c.HoldTimeout == 0 {
		c.HoldTimeout = 10 * time.Second
	}
	if n, pg := c.FileRingBytes, os.Getpagesize(); n < 0 || n > 0 && (n&(n-1) != 0 || n%pg != 0) {
		errs = append(errs, fmt.Errorf("file ring size %d: want 0 or a power of two multiple of the page size (%d)", n, pg))
	}
	if n := c.StagedContentLimit; n != 0 && (n < MinStagedContentLimit || n > MaxStagedContentLimit) {
		errs = append(errs, fmt.Errorf("staged content limit %d: want 0 (%d) or from %d (a user.* attribute's largest value, shown whole) to %d (the largest staged file)",
			n, staging.DefaultContentLimit, MinStagedContentLimit, MaxStagedContentLimit))
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(c.Stderr, nil))
	}
	return errors.Join(errs...)
}

// daemon is one running sandbox.
type daemon struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	dir     string // StateDir/sandboxes/<id>
	engine  *decide.Engine
	net     *netChannel
	files   *fileChannel
	open    openFlows // revoke.go
	sandbox sandboxProc
	audit   io.Writer // the audit log (safe for concurrent use)
	// sup runs the long-running components; the first failure ends the
	// run closed.
	sup *supervisor

	mu        sync.Mutex // guards the fields below
	decisions map[uint64]*decide.Decision
	final     map[uint64]*decide.Decision
	held      map[uint64]*decide.Decision // deferred, no final verdict yet
	exiting   bool

	// stopping is cancelled when carbd is told to stop (SIGTERM): every
	// question to the oracle, pending or new, fails then, which refuses
	// (see stoppableOracle).
	stopping context.Context
	stop     context.CancelFunc
	// exited is cancelled (decide.ErrClientGone) when the sandbox's
	// command exits: no client waits for a network effect any more
	// (sandboxExited).
	exited       context.Context
	exitedCancel context.CancelCauseFunc

	viewMu    sync.Mutex    // guards the fields below
	view      engineView    // the engine's state as of the latest refresh
	viewDone  chan struct{} // closed when the refresh in flight ends; nil when none
	viewDirty bool          // a decision was recorded since the last refresh began
	refresher bool          // the background refresher runs

	closers []func() error // teardown, run in reverse

	// noticeHook, when set (by a VM backend, before the verdict loop
	// starts), also gets every abort notice; it must not block.
	noticeHook func(text string)

	// runWake wakes the run loop (wakeRun): something happened that its
	// commit point, the status view or the ledger gate may act on.
	// runBusy: wakeRun was called since the loop's last tick; shared: a
	// writable shared mapping of the working directory was traced.
	runWake chan struct{}
	runBusy atomic.Bool
	shared  atomic.Bool
}

// sandboxProc is a running sandbox backend.
type sandboxProc interface {
	Pid() int
	Wait() (int, error)
	Signal(os.Signal) error
	Kill() error
}

// pauser is a sandbox that a ledger stop pauses rather than kills (a
// VM: frozen for inspection, stopped at teardown). Pause ends Wait.
type pauser interface {
	Pause() error
}

// Run runs the command in a sandbox until it exits or ctx ends, and
// returns its exit status and the summary.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d := &daemon{cfg: cfg, log: cfg.Log.With("sandbox", cfg.ID), started: time.Now(),
		decisions: map[uint64]*decide.Decision{}, final: map[uint64]*decide.Decision{}, held: map[uint64]*decide.Decision{},
		runWake: make(chan struct{}, 1)}
	d.stopping, d.stop = context.WithCancel(context.Background())
	defer d.stop()
	d.exited, d.exitedCancel = context.WithCancelCause(context.Background())
	defer d.exitedCancel(nil)
	// A failing component refuses every question to the oracle at once
	// (as a stop does); the run loop then stops the sandbox.
	d.sup = newSupervisor(d.log, func(*ComponentError) { d.stop() })
	defer d.teardown()
	defer d.sup.end() // before the teardown: components it stops are not failing
	if err := d.setup(ctx); err != nil {
		return nil, err
	}
	// The start-up's peak (the kernel's BTF decoded for the file
	// tracer's programs, above all) is garbage now, and the runtime
	// would keep its pages for minutes: hand them back, so that an idle
	// sandbox costs its live heap, not its start's peak (docs/scale.md).
	go debug.FreeOSMemory()
	if h := cfg.hooks; h != nil && h.started != nil {
		h.started(d)
	}
	return d.run(ctx)
}

func (d *daemon) onClose(f func() error) { d.closers = append(d.closers, f) }

func (d *daemon) teardown() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		if err := d.closers[i](); err != nil {
			d.log.Warn("teardown", "err", err)
		}
	}
	d.closers = nil
}

func (d *daemon) setup(ctx context.Context) error {
	d.dir = filepath.Join(d.cfg.StateDir, "sandboxes", d.cfg.ID)
	if err := os.MkdirAll(d.dir, 0o711); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	if err := os.Chmod(d.cfg.StateDir, 0o711); err != nil {
		return err
	}
	if err := searchable(d.dir); err != nil {
		return err
	}
	unlock, index, err := claimIndex(d.cfg.StateDir, d.cfg.ID)
	if err != nil {
		return err
	}
	d.onClose(unlock)

	// The decision engine and its audit log.
	auditF, err := openAuditLog(d.dir, d.cfg.AuditLogMaxBytes)
	if err != nil {
		return err
	}
	d.onClose(auditF.Close)
	var audit io.Writer = auditF
	if d.cfg.AuditPath != "" {
		f, err := os.OpenFile(d.cfg.AuditPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		d.onClose(f.Close)
		audit = io.MultiWriter(auditF, f)
	}
	// The file channel first: recover the journal, mount the merged view,
	// and load the labels earlier runs committed, which every read of
	// their paths carries (decide.Options.LocationLabel).
	fc, err := openFileChannel(d)
	if err != nil {
		return err
	}
	d.files = fc
	d.onClose(fc.close)
	labels := fc.st.Labels()
	d.audit = &lockedWriter{w: audit}
	opt := decide.Options{Oracle: stoppableOracle{Oracle: coveringOracle{Oracle: d.cfg.Oracle, d: d}, stopping: d.stopping}, Audit: d.audit, OracleTimeout: 5 * time.Minute,
		LocationLabel: labels.Get, LocationLabelsUnder: labels.Under}
	if a := d.cfg.Calibration; a != nil {
		c := a.Engine()
		opt.Calibration = &c
	}
	// A credential goes to a bound host only at an address the sandbox's
	// resolver gave for it (or over intercepted, verified HTTPS).
	pol := d.cfg.Policy.WithNameCheck(func(host string, addr netip.Addr) bool { return d.net != nil && d.net.resolved(host, addr) })
	d.engine = decide.New(pol, opt)
	d.engine.Task(d.cfg.Task)

	// The network channel and the sandbox.
	nc, err := startNetChannel(ctx, d, index) // sets d.net
	if err != nil {
		return err
	}
	d.onClose(nc.close)

	// The operator socket.
	l, err := listenOperator(filepath.Join(d.dir, "operator.sock"))
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	octx, ocancel := context.WithCancel(context.WithoutCancel(ctx))
	d.sup.Go(&wg, octx, "operator-socket", func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { l.Close() })
		defer stop()
		return serveOperator(l, d, &wg)
	})
	d.onClose(func() error { ocancel(); l.Close(); wg.Wait(); return nil })
	if d.cfg.Metrics != "" {
		stop, err := serveMetrics(ctx, d.cfg.Metrics, d, d.sup)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		d.onClose(stop)
	}
	if dir := d.cfg.MetricsTextfile; dir != "" {
		if err := d.writeTextfile(dir); err != nil {
			return fmt.Errorf("metrics textfile: %w", err)
		}
		tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		var wg sync.WaitGroup
		var last error
		d.sup.Go(&wg, tctx, "metrics-textfile", func(ctx context.Context) error {
			err := d.textfileLoop(ctx, dir, 5*time.Second)
			if tctx.Err() != nil {
				last = err // the last write, at the end of the run
			}
			return err
		})
		d.onClose(func() error { cancel(); wg.Wait(); return last })
	}
	return nil
}

// The run loop's commit point runs commitEvery after a file record or a
// decision (so a traced write reaches its commit point within
// commitEvery, as it always did), and every commitEvery while changes may
// come untraced: tracing off, a scope open, a writable shared mapping of
// the working directory (its stores make no system call). Otherwise the
// loop sleeps, and runs it every idleCommitEvery only, for what the tracer
// does not report at all (a write through io_uring, say): an idle
// sandbox does not wake its carbd twice a second.
const (
	commitEvery     = 500 * time.Millisecond
	idleCommitEvery = 5 * time.Second
)

// wakeRun tells the run loop that a file record or a decision came: its
// next commit point is at most commitEvery away. It never blocks.
func (d *daemon) wakeRun() {
	d.runBusy.Store(true)
	select {
	case d.runWake <- struct{}{}:
	default:
	}
}

// fileRecordSeen wakes the run loop for a record of the file tracer, and
// notes a writable shared mapping of the working directory.
func (d *daemon) fileRecordSeen(r *fileev.Record) {
	if r.Op == fileev.OpMmap {
		if _, ok := unseenWrite(r); ok {
			d.shared.Store(true)
		}
	}
	d.wakeRun()
}

// nextCommitPoint is the delay before the run loop's next tick.
func (d *daemon) nextCommitPoint() time.Duration {
	busy := d.runBusy.Swap(false)
	if busy || d.shared.Load() || d.files == nil || d.files.tracer == nil || d.engine.ScopeOpen() != 0 {
		return commitEvery
	}
	return idleCommitEvery
}

// run waits for the sandbox and resolves what it did.
func (d *daemon) run(ctx context.Context) (*Summary, error) {
	done := make(chan struct{})
	var code int
	var werr error
	go func() {
		code, werr = d.sandbox.Wait()
		close(done)
	}()
	stopOnce := sync.Once{}
	ticker := time.NewTimer(commitEvery)
	armed := commitEvery
	defer ticker.Stop()
	stop := ctx.Done()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-d.sup.Failed():
			break loop
		case <-stop:
			stop = nil // a closed channel is always ready: handle it once
			// Nobody waits for an oracle's answer any more: what is
			// deferred is refused (fail closed) and the run ends now,
			// not at the operator's deadline.
			d.stop()
			stopOnce.Do(func() {
				d.log.Info("stopping the sandbox")
				_ = d.sandbox.Signal(syscall.SIGTERM)
				go func() {
					select {
					case <-done:
					case <-time.After(3 * time.Second):
						_ = d.sandbox.Kill()
					}
				}()
			})
		case <-d.runWake:
			if armed != commitEvery {
				armed = commitEvery
				ticker.Reset(commitEvery)
			}
		case <-ticker.C:
			armed = d.nextCommitPoint()
			ticker.Reset(armed)
			// Keep the status's view of the engine fresh while the
			// engine is free (it is not while the oracle is asked).
			d.refreshView()
			if d.engine.ScopeOpen() == 0 {
				d.files.commitPoint(ctx)
			}
			if _, stopped := d.engine.Stopped(); stopped {
				stopOnce.Do(func() {
					if p, ok := d.sandbox.(pauser); ok {
						d.log.Warn("the ledger gate stopped the episode: pausing the sandbox")
						if err := p.Pause(); err == nil {
							return
						}
					}
					d.log.Warn("the ledger gate stopped the episode: stopping the sandbox")
					_ = d.sandbox.Kill()
				})
			}
		}
	}
	if cf := d.sup.Err(); cf != nil {
		return d.failed(cf, done, &code), cf
	}
	if werr != nil {
		return nil, fmt.Errorf("sandbox: %w", werr)
	}
	d.mu.Lock()
	d.exiting = true
	d.mu.Unlock()
	d.sandboxExited()
	// End of the task: a commit point proposes the staged changes nobody
	// decided yet (after a restart: everything the crashed run left
	// staged), the open scope resolves, and the last commit point commits
	// what was released and aborts what was refused. Proposing can hold a
	// change in a scope again: resolve until none is open (bounded; what
	// is still held then stays staged).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	d.files.commitPoint(fctx)
	for range 4 {
		if d.sup.Err() != nil {
			break
		}
		r := d.engine.Finish(fctx)
		if r == nil {
			break
		}
		d.applyResolution(r)
		d.files.commitPoint(fctx)
	}
	if cf := d.sup.Err(); cf != nil {
		// A component failed while the run ended: what is held is
		// refused, what is staged stays staged.
		return d.failed(cf, done, &code), cf
	}
	// The run is over: what was released but is not in W is kept for the
	// user, the rest staged is discarded, and the next run starts from a
	// fresh base (W as it is then).
	d.files.endRun(fctx)
	return d.summary(code), nil
}

// failed ends a run a component's failure cut short, closed: the sandbox
// is killed (nothing it does can be seen to any more), every held effect
// is refused, and the staging is left as a crash leaves it: staged
// changes are neither committed nor aborted, and the next run on the
// working directory resumes them. done is closed when the sandbox's Wait
// has returned, with its exit status in *code.
func (d *daemon) failed(cf *ComponentError, done <-chan struct{}, code *int) *Summary {
	d.mu.Lock()
	d.exiting = true
	d.mu.Unlock()
	if d.sandbox != nil {
		_ = d.sandbox.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			d.log.Warn("the sandbox did not end after SIGKILL; tearing down")
		}
	}
	d.refuseHeld(cf)
	if h := d.cfg.hooks; h != nil && h.failing != nil {
		h.failing(d)
	}
	exit := -1 // the sandbox did not end
	select {
	case <-done:
		exit = *code
	default:
	}
	s := d.summary(exit)
	s.Failed = cf
	return s
}

// refuseHeld refuses every effect still held, because cf failed: their
// packets are dropped (with a reset where the verdict loop sends one),
// intercepted requests get their notice, and the audit log records each
// refusal. The engine's scope is not resolved: resolving could release
// what the policy admitted into it.
func (d *daemon) refuseHeld(cf *ComponentError) {
	d.mu.Lock()
	var held []decide.Decision
	for _, dec := range d.held {
		held = append(held, *dec)
	}
	d.mu.Unlock()
	if len(held) == 0 {
		return
	}
	sortDecisions(held)
	r := &decide.Resolution{Trigger: "component " + cf.Component + " failed", Time: time.Now()}
	for _, dec := range held {
		r.Effects = append(r.Effects, failedDecision(dec, cf))
	}
	r.Notice = decide.AbortNotice(r.Effects)
	for _, e := range r.Effects {
		d.record(e)
		d.auditFailed(e)
	}
	if r.Notice != "" {
		d.notify(r.Notice)
	}
	if d.net != nil {
		d.net.applyResolution(r)
	}
}

// auditFailed writes the refusal of an effect because a component failed
// to the audit log (the engine did not decide it: it is not in the
// engine's records).
func (d *daemon) auditFailed(dec decide.Decision) {
	if d.audit == nil {
		return
	}
	rec := struct {
		Type          string    `json:"type"`
		Time          time.Time `json:"time"`
		Seq           uint64    `json:"seq"`
		Verdict       string    `json:"verdict"`
		Code          string    `json:"code"`
		Justification string    `json:"justification"`
	}{"decision", time.Now().UTC(), dec.Seq, dec.Verdict.String(), dec.Reason.Code, dec.Justification}
	d.auditRecord(rec)
}

// auditRecord writes one record of carbd's own (not the engine's) to the
// audit log as a JSON line; a failure is logged. No audit log: nothing.
func (d *daemon) auditRecord(rec any) {
	if d.audit == nil {
		return
	}
	b, err := json.Marshal(rec)
	if err == nil {
		_, err = d.audit.Write(append(b, '\n'))
	}
	if err != nil {
		d.log.Error("audit log", "err", err)
	}
}

// stoppableOracle is the configured oracle, except that once carbd is
// stopping every question fails at once (the engine then refuses what it
// asked about): a SIGTERM must not wait for an operator's deadline.
type stoppableOracle struct {
	decide.Oracle
	stopping context.Context
}

func (o stoppableOracle) Decide(ctx context.Context, v *decide.View) ([]decide.OracleAnswer, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(o.stopping, func() { cancel(errors.New("carbd is stopping")) })()
	answers, err := o.Oracle.Decide(ctx, v)
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return answers, err
}

// resolveAfter is how long a held request waits before its scope is
// resolved. A packet-level hold cannot hand the agent a stub response
// (that needs a terminating proxy), so its client is blocked: the scope
// resolves promptly rather than at the end of the task.
const resolveAfter = 300 * time.Millisecond

// resolveSoon resolves scope after resolveAfter if it is still open.
func (d *daemon) resolveSoon(scope uint64) {
	if scope == 0 {
		return
	}
	time.AfterFunc(resolveAfter, func() {
		if d.engine.ScopeOpen() != scope {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), d.oracleWait()+time.Minute)
		defer cancel()
		if r := d.engine.Resolve(ctx, fmt.Sprintf("held request waiting (%s)", resolveAfter)); r != nil {
			d.applyResolution(r)
		}
	})
}

// oracleWait is how long the oracle may take.
func (d *daemon) oracleWait() time.Duration {
	if d.cfg.Operator != nil {
		return d.cfg.Operator.Timeout
	}
	return 5 * time.Minute
}

// hiddenPaths are the host directories the sandbox must not see: the
// state of working directories (labels, conflicts) and the staging
// layers and journal, this one's and (at the default places) those of
// other working directories.
func (d *daemon) hiddenPaths() []string {
	hide := []string{d.cfg.WorkStateDir, d.cfg.StagingDir, DefaultWorkStateRoot, DefaultCADir}
	if c := d.cfg.Intercept.CADir; c != "" {
		hide = append(hide, c)
	}
	if def := filepath.Join(filepath.Dir(d.cfg.Workdir), ".carbd"); filepath.Dir(d.cfg.StagingDir) == def {
		hide = append(hide, def)
	}
	var out []string
	for _, h := range hide {
		// Never a directory that holds the working directory or a bind.
		ok := h != "" && !within(d.cfg.Workdir, h)
		for _, b := range d.cfg.Binds {
			ok = ok && !within(b.Source, h) && !within(b.Target, h)
		}
		if ok {
			out = append(out, h)
		}
	}
	return out
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	p, dir = filepath.Clean(p), filepath.Clean(dir)
	return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/"
}

// searchable checks that the sandbox's unprivileged user can reach dir
// (the merged view and the control directory live under it).
func searchable(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("the sandbox's user cannot reach %s: %s is not searchable by others (mode %#o); use a state directory whose ancestors are (--state-dir)", dir, p, st.Mode().Perm())
		}
		if p == "/" {
			return nil
		}
	}
}

// record keeps a decision for the summary and the status.
func (d *daemon) record(dec decide.Decision) {
	defer d.wakeRun()
	defer d.kickView()
	d.mu.Lock()
	defer d.mu.Unlock()
	cp := dec
	d.decisions[dec.Seq] = &cp
	if dec.Verdict != decide.Defer {
		d.final[dec.Seq] = &cp
		delete(d.held, dec.Seq)
	} else if _, done := d.final[dec.Seq]; !done {
		// (A scope can resolve before its effect's first decision is
		// recorded: then the final verdict is already in.)
		d.held[dec.Seq] = &cp
	}
}

// applyResolution records the final verdicts of a resolved scope and
// hands them to the channels.
func (d *daemon) applyResolution(r *decide.Resolution) {
	if cf := d.sup.Err(); cf != nil {
		// Nothing held is released after a failure.
		fr := failedResolution(r, cf)
		for i, e := range fr.Effects {
			if r.Effects[i].Verdict != decide.Refuse {
				d.auditFailed(e)
			}
		}
		r = fr
	}
	for _, e := range r.Effects {
		d.record(e)
		if d.files != nil {
			d.files.note(e)
		}
	}
	// The notice first: an agent that sees its send refused looks for
	// why at once (the demo's agent reads the notices file as soon as
	// curl fails), so the notice must exist before the refusal is
	// visible.
	if r.Notice != "" {
		d.notify(r.Notice)
	}
	if d.net != nil {
		d.net.applyResolution(r)
	}
}

// notify delivers an abort notice to the agent: the file the control
// directory exposes inside the sandbox, and the VM backends' control
// channel (noticeHook).
func (d *daemon) notify(text string) {
	if d.noticeHook != nil {
		d.noticeHook(text)
	}
	f, err := os.OpenFile(filepath.Join(d.dir, "agent", "notices"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		d.log.Warn("abort notice", "err", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\n\n", text)
}

func (d *daemon) summary(code int) *Summary {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &Summary{ID: d.cfg.ID, ExitCode: code, Stats: d.engine.Stats()}
	_, s.Stopped = d.engine.Stopped()
	for _, dec := range d.decisions {
		if f, ok := d.final[dec.Seq]; ok {
			switch f.Verdict {
			case decide.Release:
				s.Released = append(s.Released, *f)
			case decide.Refuse:
				s.Refused = append(s.Refused, *f)
			}
		} else {
			s.Held = append(s.Held, *dec)
		}
	}
	sortDecisions(s.Released)
	sortDecisions(s.Refused)
	sortDecisions(s.Held)
	if d.files != nil {
		s.Committed, s.Aborted, s.FileRefusals = d.files.outcome()
		s.Conflicts = d.files.conflictList()
	}
	return s
}

// summaryListMax bounds each list of the summary: the first ones, then
// how many more (the audit log has every decision).
const summaryListMax = 20

// WriteSummary prints the summary for a terminal: the counts, then at
// most summaryListMax entries of each list (refused first), each list's
// remainder as a count. The audit log has every decision.
func (s *Summary) WriteSummary(w io.Writer) {
	if f := s.Failed; f != nil {
		fmt.Fprintf(w, "\ncarbd: %v\n  the run ended closed: the sandbox was stopped, held effects refused, staged changes kept staged for the next run", oneLine(f.Error(), 400))
	}
	fmt.Fprintf(w, "\ncarbd: sandbox %s exited with status %d", s.ID, s.ExitCode)
	if s.Failed != nil {
		fmt.Fprint(w, " (killed: a component failed)")
	}
	if s.Stopped {
		fmt.Fprint(w, " (stopped by the ledger gate)")
	}
	fmt.Fprintf(w, "\n  released %d, refused %d, held %d", len(s.Released), len(s.Refused), len(s.Held))
	if n := len(s.Committed) + len(s.Aborted) + len(s.Conflicts); n > 0 {
		fmt.Fprintf(w, "; files: committed %d, aborted %d, conflicts %d", len(s.Committed), len(s.Aborted), len(s.Conflicts))
	}
	fmt.Fprintln(w)
	more := func(n int, what string) {
		if n > summaryListMax {
			fmt.Fprintf(w, "  ... and %d more %s (the audit log has them all)\n", n-summaryListMax, what)
		}
	}
	for _, d := range firstN(s.Refused) {
		fmt.Fprintf(w, "  REFUSED  #%d %s\n           %s\n", d.Seq, effectLine(d), oneLine(d.Justification, 300))
	}
	more(len(s.Refused), "refused")
	for _, d := range firstN(s.Held) {
		fmt.Fprintf(w, "  HELD     #%d %s\n", d.Seq, effectLine(d))
	}
	more(len(s.Held), "held")
	for _, d := range firstN(s.Released) {
		fmt.Fprintf(w, "  released #%d %s\n", d.Seq, effectLine(d))
	}
	more(len(s.Released), "released")
	names := func(what string, l []string) {
		if len(l) == 0 {
			return
		}
		fmt.Fprintf(w, "  %s: %s", what, strings.Join(firstN(l), ", "))
		if len(l) > summaryListMax {
			fmt.Fprintf(w, " and %d more", len(l)-summaryListMax)
		}
		fmt.Fprintln(w)
	}
	names("committed to the working directory", s.Committed)
	names("aborted (never reached the working directory)", s.Aborted)
	for _, r := range firstN(s.FileRefusals) {
		fmt.Fprintf(w, "  staging refused: %s\n", r)
	}
	more(len(s.FileRefusals), "staging refusals")
	for _, c := range firstN(s.Conflicts) {
		fmt.Fprintf(w, "  CONFLICT %s\n", c)
	}
	more(len(s.Conflicts), "conflicts")
	if len(s.Conflicts) > 0 {
		fmt.Fprintf(w, "  (the working directory keeps the user's version of each conflict; see docs/operator.md, \"Conflicts\")\n")
	}
}

func firstN[T any](l []T) []T {
	if len(l) > summaryListMax {
		return l[:summaryListMax]
	}
	return l
}

func effectLine(d decide.Decision) string {
	if d.Event == nil {
		return ""
	}
	return oneLine(d.Event.Summary(), 140)
}

// lockedWriter serialises writes of the audit log.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
