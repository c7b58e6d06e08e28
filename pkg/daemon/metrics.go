package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics exports a sandbox's status as Prometheus metrics: a collector
// that reads the status on every scrape, so the numbers are never stale
// and nothing is counted twice.
type metrics struct {
	d *daemon
}

// The metric families: each sums meaningfully over its labels (final
// verdicts; scope outcomes; the loop's verdicts by reason; file changes
// by outcome), and what is not a part of a whole has a family of its own.
var (
	mBuild     = prometheus.NewDesc("carbd_build_info", "The carbd build: module version, VCS revision and Go version (always 1).", []string{"version", "revision", "goversion"}, nil)
	mStart     = prometheus.NewDesc("carbd_sandbox_start_time_seconds", "Unix time the sandbox started.", []string{"sandbox"}, nil)
	mDecisions = prometheus.NewDesc("carbd_decisions_total", "Effects by final verdict (released or refused).", []string{"sandbox", "verdict"}, nil)
	mDeferred  = prometheus.NewDesc("carbd_deferred_total", "Effects the policy deferred: held in a scope or asked about (the operator, a language model) before they were sent.", []string{"sandbox"}, nil)
	mScopes    = prometheus.NewDesc("carbd_scopes_total", "Speculative scopes by outcome.", []string{"sandbox", "outcome"}, nil)
	mHeld      = prometheus.NewDesc("carbd_held_effects", "Effects held in the open scope or waiting for the operator.", []string{"sandbox"}, nil)
	mLedger    = prometheus.NewDesc("carbd_ledger_score", "G-CARB gate score of the latest proposal.", []string{"sandbox"}, nil)
	mLambda    = prometheus.NewDesc("carbd_ledger_lambda", "Calibrated ledger stop threshold.", []string{"sandbox"}, nil)
	mDatapath  = prometheus.NewDesc("carbd_datapath_packets_total", "Packets the TC program handled, by reason.", []string{"sandbox", "reason"}, nil)
	mQueued    = prometheus.NewDesc("carbd_queue_packets_total", "Packets the verdict loop received.", []string{"sandbox"}, nil)
	mVerdicts  = prometheus.NewDesc("carbd_queue_verdicts_total", "Verdicts of the verdict loop by reason (accept-*, drop-*).", []string{"sandbox", "reason"}, nil)
	mOverflow  = prometheus.NewDesc("carbd_queue_overflow_drops_total", "Packets dropped before the verdict loop saw them (fail closed), by where.", []string{"sandbox", "where"}, nil)
	mFileEv    = prometheus.NewDesc("carbd_file_events_total", "File operations the tracer reported.", []string{"sandbox"}, nil)
	mFileLost  = prometheus.NewDesc("carbd_file_events_lost_total", "File events lost in the ring buffer (every sensitive file then counts as read).", []string{"sandbox"}, nil)
	mFileUnatt = prometheus.NewDesc("carbd_file_unattributed_reads_total", "Reads the tracer could not attribute (every sensitive file then counts as read).", []string{"sandbox"}, nil)
	mFileChg   = prometheus.NewDesc("carbd_file_changes_total", "Staged changes of the working directory by outcome.", []string{"sandbox", "outcome"}, nil)
)

func (m metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mBuild, mStart, mDecisions, mDeferred, mScopes, mHeld, mLedger, mLambda, mDatapath,
		mQueued, mVerdicts, mOverflow, mFileEv, mFileLost, mFileUnatt, mFileChg} {
		ch <- d
	}
}

func (m metrics) Collect(ch chan<- prometheus.Metric) {
	s := m.d.Status()
	id := s.ID
	c := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{id}, labels...)...)
	}
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, id)
	}
	v, rev, gov := buildInfo()
	ch <- prometheus.MustNewConstMetric(mBuild, prometheus.GaugeValue, 1, v, rev, gov)
	g(mStart, float64(s.Started.UnixNano())/1e9)
	c(mDecisions, s.Decisions.Released, "released")
	c(mDecisions, s.Decisions.Refused, "refused")
	c(mDeferred, s.Decisions.Deferred)
	c(mScopes, s.Decisions.Committed, "committed")
	c(mScopes, s.Decisions.Aborted, "aborted")
	g(mHeld, float64(len(s.Held)))
	if s.Ledger != nil {
		g(mLedger, s.Ledger.Score)
		g(mLambda, s.Ledger.Lambda)
	}
	for r, v := range s.Datapath {
		c(mDatapath, v, r)
	}
	c(mQueued, s.Queue.Queued)
	for r, v := range s.Queue.Verdicts {
		c(mVerdicts, v, r)
	}
	c(mOverflow, s.Queue.KernelDropped, "kernel_queue")
	c(mOverflow, s.Queue.SocketDropped, "socket")
	c(mFileEv, s.Files.Events)
	c(mFileLost, s.Files.Lost)
	c(mFileUnatt, s.Files.Unattributed)
	c(mFileChg, s.Files.Committed, "committed")
	c(mFileChg, s.Files.Aborted, "aborted")
	c(mFileChg, s.Files.Refused, "refused")
}

// buildInfo labels carbd_build_info from the binary's build information.
func buildInfo() (version, revision, goversion string) {
	version, goversion = "(unknown)", runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	version = bi.Main.Version
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" {
			revision = st.Value
		}
	}
	return
}

// registry is the sandbox's metrics registry.
func (d *daemon) registry() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	return reg, reg.Register(metrics{d: d})
}

// writeTextfile writes the metrics for node_exporter's textfile collector
// (carbd_<id>.prom in dir), atomically: written aside, then renamed.
func (d *daemon) writeTextfile(dir string) error {
	reg, err := d.registry()
	if err != nil {
		return err
	}
	name := filepath.Join(dir, "carbd_"+d.cfg.ID+".prom")
	return prometheus.WriteToTextfile(name, reg)
}

// textfileLoop rewrites the textfile every interval until ctx ends, and a
// last time then, so the file keeps the run's final counts.
func (d *daemon) textfileLoop(ctx context.Context, dir string, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := d.writeTextfile(dir); err != nil {
			return fmt.Errorf("metrics textfile: %w", err)
		}
		select {
		case <-ctx.Done():
			return d.writeTextfile(dir)
		case <-t.C:
		}
	}
}

// serveMetrics serves /metrics on addr until the returned stop is
// called, as the component metrics-server of sup: a server that stops
// serving before then ends the run.
func serveMetrics(ctx context.Context, addr string, d *daemon, sup *supervisor) (func() error, error) {
	reg, err := d.registry()
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	sup.Go(&wg, sctx, "metrics-server", func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { srv.Close() })
		defer stop()
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics: serve %s: %w", addr, err)
		}
		return nil
	})
	return func() error {
		cancel()
		err := srv.Close()
		wg.Wait()
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}, nil
}
