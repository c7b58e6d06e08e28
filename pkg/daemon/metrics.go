package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
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

var (
	mDecisions = prometheus.NewDesc("carbd_decisions_total", "Decisions on effects by final verdict.", []string{"sandbox", "verdict"}, nil)
	mScopes    = prometheus.NewDesc("carbd_scopes_total", "Speculative scopes by outcome.", []string{"sandbox", "outcome"}, nil)
	mHeld      = prometheus.NewDesc("carbd_held_effects", "Effects held in the open scope or waiting for the operator.", []string{"sandbox"}, nil)
	mLedger    = prometheus.NewDesc("carbd_ledger_score", "G-CARB gate score of the latest proposal.", []string{"sandbox"}, nil)
	mLambda    = prometheus.NewDesc("carbd_ledger_lambda", "Calibrated ledger stop threshold.", []string{"sandbox"}, nil)
	mDatapath  = prometheus.NewDesc("carbd_datapath_packets_total", "Packets the TC program handled, by reason.", []string{"sandbox", "reason"}, nil)
	mQueue     = prometheus.NewDesc("carbd_queue_packets_total", "Packets of the verdict loop by outcome.", []string{"sandbox", "outcome"}, nil)
	mVerdicts  = prometheus.NewDesc("carbd_queue_verdicts_total", "Verdicts of the verdict loop by reason (accept-*, drop-*).", []string{"sandbox", "reason"}, nil)
	mFiles     = prometheus.NewDesc("carbd_file_total", "File channel counters.", []string{"sandbox", "what"}, nil)
	mUp        = prometheus.NewDesc("carbd_up_seconds", "Seconds since the sandbox started.", []string{"sandbox"}, nil)
)

func (m metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{mDecisions, mScopes, mHeld, mLedger, mLambda, mDatapath, mQueue, mVerdicts, mFiles, mUp} {
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
	c(mDecisions, s.Decisions.Released, "released")
	c(mDecisions, s.Decisions.Refused, "refused")
	c(mDecisions, s.Decisions.Deferred, "deferred")
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
	c(mQueue, s.Queue.Queued, "queued")
	c(mQueue, s.Queue.Accepted, "accepted")
	c(mQueue, s.Queue.Dropped, "dropped")
	c(mQueue, s.Queue.KernelDropped, "kernel_queue_dropped")
	c(mQueue, s.Queue.SocketDropped, "socket_dropped")
	for r, v := range s.Queue.Verdicts {
		c(mVerdicts, v, r)
	}
	c(mFiles, s.Files.Events, "events")
	c(mFiles, s.Files.Lost, "ringbuf_lost")
	c(mFiles, s.Files.Unattributed, "unattributed_reads")
	c(mFiles, s.Files.Committed, "committed")
	c(mFiles, s.Files.Aborted, "aborted")
	c(mFiles, s.Files.Refused, "refused")
	g(mUp, time.Since(s.Started).Seconds())
}

// serveMetrics serves /metrics on addr until ctx ends.
func serveMetrics(ctx context.Context, addr string, d *daemon) (func() error, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(metrics{d: d}); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return func() error {
		err := srv.Close()
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}, nil
}
