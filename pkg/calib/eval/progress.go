package eval

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// PlannedSplits is how many splits Evaluate runs for n pipelines under
// cfg: per pipeline cfg.Splits, with a frontier FrontierSplits per
// budget of each sweep, and with LOPO LOPOSplits. A frontier budget
// under a pipeline's ledger floor stops after its first splits fail;
// Meter counts it as done when the next stage reports.
func PlannedSplits(cfg Config, n int) int {
	if err := cfg.setDefaults(); err != nil {
		return 0
	}
	per := cfg.Splits
	if len(cfg.Frontier) > 0 {
		per += 2 * len(cfg.Frontier) * cfg.FrontierSplits // the CRC and the ledger sweeps
	}
	if cfg.LOPO {
		per += cfg.LOPOSplits // leave-one-pipeline-out, each pipeline left out once
	}
	return n * per
}

// MeterOptions configure a Meter.
type MeterOptions struct {
	// Every is the least time between two lines (default 1 s); the last
	// split always prints.
	Every time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Rewrite ends each line with a carriage return, so that a terminal
	// shows one line that changes, and Finish ends it with a newline;
	// otherwise every line ends with a newline.
	Rewrite bool
}

// Meter turns the per-stage reports of Config.Progress into one overall
// line: "eval: 812/1800 splits, 45 %, ETA 1m10s (pipeline: stage)". The
// stages of an evaluation run one after the other, so when a new stage
// reports, the one before counts as done in full (a frontier budget
// skipped at the ledger floor stops early). A Meter is safe for
// concurrent use.
type Meter struct {
	mu    sync.Mutex
	w     io.Writer
	opt   MeterOptions
	total int
	start time.Time
	last  time.Time // when the last line was written; zero before the first
	// cur is the stage reporting now, with its done and total splits;
	// before counts the splits of the stages before it.
	cur             string
	curDone, curTot int
	before          int
	pending         bool // a report not yet written
}

// NewMeter returns a Meter of total splits (PlannedSplits) writing to w.
func NewMeter(w io.Writer, total int, opt MeterOptions) *Meter {
	if opt.Every <= 0 {
		opt.Every = time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	return &Meter{w: w, opt: opt, total: total, start: opt.Now()}
}

// Update records that done of total splits of a pipeline's stage are
// complete; it has the signature of Config.Progress.
func (m *Meter) Update(pipeline, stage string, done, total int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := pipeline + ": " + stage
	if key != m.cur {
		if m.cur != "" {
			m.before += m.curTot
		}
		m.cur, m.curTot, m.curDone = key, total, 0
	}
	m.curDone = max(m.curDone, done) // workers report out of order
	m.pending = true
	now := m.opt.Now()
	if m.last.IsZero() || now.Sub(m.last) >= m.opt.Every || m.overall() >= m.total {
		m.write(now)
	}
}

// overall is the splits done so far.
func (m *Meter) overall() int {
	return min(m.before+m.curDone, m.total)
}

// Line is the progress line as of now.
func (m *Meter) Line() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.line(m.opt.Now())
}

func (m *Meter) line(now time.Time) string {
	done := m.overall()
	s := fmt.Sprintf("eval: %d/%d splits", done, m.total)
	if m.total > 0 {
		s += fmt.Sprintf(", %d %%", 100*done/m.total)
	}
	if el := now.Sub(m.start); done > 0 && done < m.total && el > 0 {
		eta := time.Duration(float64(el) * float64(m.total-done) / float64(done))
		s += ", ETA " + eta.Round(time.Second).String()
	}
	if m.cur != "" {
		s += " (" + m.cur + ")"
	}
	return s
}

func (m *Meter) write(now time.Time) {
	l := m.line(now)
	if m.opt.Rewrite {
		fmt.Fprint(m.w, "\r"+l+"\033[K")
	} else {
		fmt.Fprintln(m.w, l)
	}
	m.last, m.pending = now, false
}

// Finish writes the last report if it was not written and, when
// rewriting, ends the line.
func (m *Meter) Finish() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending {
		m.write(m.opt.Now())
	}
	if m.opt.Rewrite && !m.last.IsZero() {
		fmt.Fprintln(m.w)
	}
}
