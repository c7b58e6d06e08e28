package agentdojo

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// Counts are the tallies of a set of runs.
type Counts struct {
	Runs              int
	Benign            int
	BenignUtility     int // benign runs with utility true
	InjectionAsPrompt int
	Attacked          int
	AttackedUtility   int // attacked runs with utility true
	SecurityTrue      int // attacked runs logged security true, errors included
	Succeeded         int // attacked runs whose attack succeeded (security true, no error)
	Errors            int // runs of any kind with an error recorded
	NoVersion         int // runs without a benchmark_version (read as v1.x)
	Seen              int // attacked runs whose agent read an injected text
	Detected          int // attacked runs in which a detector withheld a tool result
	WithEffects       int // attacked runs with at least one attacker effect (labels)
	Agree             int // succeeded runs with at least one attacker effect
}

func (c *Counts) add(o *Counts) {
	c.Runs += o.Runs
	c.Benign += o.Benign
	c.BenignUtility += o.BenignUtility
	c.InjectionAsPrompt += o.InjectionAsPrompt
	c.Attacked += o.Attacked
	c.AttackedUtility += o.AttackedUtility
	c.SecurityTrue += o.SecurityTrue
	c.Succeeded += o.Succeeded
	c.Errors += o.Errors
	c.NoVersion += o.NoVersion
	c.Seen += o.Seen
	c.Detected += o.Detected
	c.WithEffects += o.WithEffects
	c.Agree += o.Agree
}

// Skipped is a member of a dataset that was not read as a run.
type Skipped struct {
	Archive, Member string
	Reason          string
}

// StatsKey selects a row of Stats.
type StatsKey struct {
	Pipeline, Suite string
	Attack          string // "" for benign and injection-as-prompt runs
}

// Stats tallies runs per pipeline, suite and attack, and lists what was
// skipped. Build it with Add and AddError while iterating Dataset.Runs.
type Stats struct {
	Rows    map[StatsKey]*Counts
	Skipped []Skipped
}

// NewStats returns empty Stats.
func NewStats() *Stats { return &Stats{Rows: map[StatsKey]*Counts{}} }

// Add counts a run. The label columns use spec for the roles (nil: the
// roles are guessed; the labels do not depend on them).
func (s *Stats) Add(r *Run, spec *SuiteSpec) {
	k := StatsKey{r.Pipeline, r.Suite, r.Attack}
	c := s.Rows[k]
	if c == nil {
		c = &Counts{}
		s.Rows[k] = c
	}
	c.Runs++
	if r.Errored() {
		c.Errors++
	}
	if r.BenchmarkVersion == "" {
		c.NoVersion++
	}
	switch r.Kind {
	case Benign:
		c.Benign++
		if r.Utility {
			c.BenignUtility++
		}
	case InjectionAsPrompt:
		c.InjectionAsPrompt++
	case Attacked:
		c.Attacked++
		if r.Utility {
			c.AttackedUtility++
		}
		if r.Security {
			c.SecurityTrue++
		}
		if r.InjectionSeen() {
			c.Seen++
		}
		if r.Detected() {
			c.Detected++
		}
		effects := len(r.AttackerEffects(spec)) > 0
		if effects {
			c.WithEffects++
		}
		if r.AttackSucceeded() {
			c.Succeeded++
			if effects {
				c.Agree++
			}
		}
	}
}

// AddError records a member that was not read as a run. Errors that are
// not *RunError are recorded with an empty archive.
func (s *Stats) AddError(err error) {
	var re *RunError
	if errors.As(err, &re) {
		s.Skipped = append(s.Skipped, Skipped{Archive: re.Archive, Member: re.Member, Reason: re.Err.Error()})
		return
	}
	s.Skipped = append(s.Skipped, Skipped{Reason: err.Error()})
}

// Pipelines lists the pipelines seen, sorted.
func (s *Stats) Pipelines() []string {
	seen := map[string]bool{}
	var out []string
	for k := range s.Rows {
		if !seen[k.Pipeline] {
			seen[k.Pipeline] = true
			out = append(out, k.Pipeline)
		}
	}
	sort.Strings(out)
	return out
}

// Sum adds up the rows that match: an empty field of sel matches any
// value, and Attack "*" any attack but no benign or injection-as-prompt
// row.
func (s *Stats) Sum(sel StatsKey) Counts {
	var c Counts
	for k, v := range s.Rows {
		if sel.Pipeline != "" && sel.Pipeline != k.Pipeline || sel.Suite != "" && sel.Suite != k.Suite {
			continue
		}
		switch sel.Attack {
		case "":
		case "*":
			if k.Attack == "" {
				continue
			}
		default:
			if sel.Attack != k.Attack {
				continue
			}
		}
		c.add(v)
	}
	return c
}

func (s *Stats) keys() []StatsKey {
	ks := make([]StatsKey, 0, len(s.Rows))
	for k := range s.Rows {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		a, b := ks[i], ks[j]
		if a.Pipeline != b.Pipeline {
			return a.Pipeline < b.Pipeline
		}
		if a.Suite != b.Suite {
			return a.Suite < b.Suite
		}
		return a.Attack < b.Attack
	})
	return ks
}

// Write prints the tallies: one line per pipeline and suite, a total per
// pipeline, one line per pipeline and attack, and every skipped member
// with its reason.
func (s *Stats) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pipeline\tsuite\truns\tbenign\tinj-prompt\tattacked\tsucceeded\terrors\tno-version\t")
	row := func(p, suite string, c Counts) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", p, suite, c.Runs, c.Benign, c.InjectionAsPrompt, c.Attacked, c.Succeeded, c.Errors, c.NoVersion)
	}
	var total Counts
	for _, p := range s.Pipelines() {
		suites := map[string]bool{}
		var names []string
		for k := range s.Rows {
			if k.Pipeline == p && !suites[k.Suite] {
				suites[k.Suite] = true
				names = append(names, k.Suite)
			}
		}
		sort.Strings(names)
		for _, suite := range names {
			row(p, suite, s.Sum(StatsKey{Pipeline: p, Suite: suite}))
		}
		pc := s.Sum(StatsKey{Pipeline: p})
		row(p, "all", pc)
		total.add(&pc)
	}
	row("all", "all", total)
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pipeline\tattack\tattacked\tutility\tsecurity\tsucceeded\terrors\tinjection-read\tdetected\twith-effects\tagree\t")
	attacks := map[StatsKey]bool{}
	var aks []StatsKey
	for _, k := range s.keys() {
		if k.Attack == "" {
			continue
		}
		ak := StatsKey{Pipeline: k.Pipeline, Attack: k.Attack}
		if !attacks[ak] {
			attacks[ak] = true
			aks = append(aks, ak)
		}
	}
	for _, ak := range aks {
		c := s.Sum(ak)
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t\n", ak.Pipeline, ak.Attack, c.Attacked, c.AttackedUtility,
			c.SecurityTrue, c.Succeeded, c.Errors, c.Seen, c.Detected, c.WithEffects, c.Agree, c.Succeeded)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nskipped: %d\n", len(s.Skipped))
	for _, sk := range s.Skipped {
		if sk.Member != "" {
			fmt.Fprintf(w, "  %s: %s: %s\n", sk.Archive, sk.Member, sk.Reason)
		} else {
			fmt.Fprintf(w, "  %s: %s\n", sk.Archive, sk.Reason)
		}
	}
	return nil
}
