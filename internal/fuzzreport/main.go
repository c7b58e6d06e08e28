// Command fuzzreport runs every fuzz target of the given packages for a
// fixed time each, one after the other, and writes a Markdown report:
// target, executions, new interesting inputs, corpus size, result.
//
// It is what `make fuzz-long` runs (see docs/fuzzing.md):
//
//	go run ./internal/fuzzreport -fuzztime 10m -parallel 1 -o docs/fuzzing.md ./...
//
// Each target's result is kept as JSON in -results (one file per target),
// and the report is rendered from every result there, so that runs over
// different packages can be combined (-render renders without fuzzing).
// When the output file holds the markers
// "<!-- fuzz-report:begin -->" and "<!-- fuzz-report:end -->", only the
// text between them is replaced.
//
// A run that ends with "context deadline exceeded" and no failing input is
// the Go fuzzing coordinator's known race at the -fuzztime boundary
// (golang/go#75804, fixed in Go 1.27): it is reported as "deadline race",
// with the executions it made, not as a failure. Any failing input the
// engine writes (testdata/fuzz/<target>/<hash>) is a failure.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fuzzreport:", err)
		os.Exit(1)
	}
}

// Result is one target's run.
type Result struct {
	Package     string    `json:"package"`
	Target      string    `json:"target"`
	FuzzTime    string    `json:"fuzztime"`
	Parallel    int       `json:"parallel"`
	Start       time.Time `json:"start"`
	Seconds     float64   `json:"seconds"`
	Baseline    int       `json:"baseline"`     // corpus entries at the start (seeds + cache)
	Execs       int64     `json:"execs"`        // executions
	NewInputs   int       `json:"new_inputs"`   // new interesting inputs (new coverage)
	CorpusTotal int       `json:"corpus_total"` // corpus size at the end
	Status      string    `json:"status"`       // pass, FAIL, deadline race, error
	Failing     string    `json:"failing,omitempty"`
	Detail      string    `json:"detail,omitempty"`
	GoVersion   string    `json:"go"`
}

type options struct {
	fuzztime string
	parallel int
	out      string
	results  string
	render   bool
	gocmd    string
	targets  *regexp.Regexp
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fuzzreport", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.fuzztime, "fuzztime", "10m", "time per target (go test -fuzztime)")
	fs.IntVar(&o.parallel, "parallel", 1, "fuzzing workers per target (go test -parallel)")
	fs.StringVar(&o.out, "o", "docs/fuzzing.md", "report file")
	fs.StringVar(&o.results, "results", "", "directory for per-target results (default: a fresh temporary one)")
	fs.BoolVar(&o.render, "render", false, "only render the results already in -results")
	fs.StringVar(&o.gocmd, "go", "go", "go command")
	targets := fs.String("targets", "", "only the fuzz targets whose name matches this regexp")
	if err := fs.Parse(args); err != nil {
		return err
	}
	re, err := regexp.Compile(*targets)
	if err != nil {
		return fmt.Errorf("-targets: %w", err)
	}
	o.targets = re
	if o.results == "" {
		if o.render {
			return errors.New("-render needs -results")
		}
		d, err := os.MkdirTemp("", "fuzzreport-")
		if err != nil {
			return fmt.Errorf("results directory: %w", err)
		}
		o.results = d
	}
	if err := os.MkdirAll(o.results, 0o755); err != nil {
		return fmt.Errorf("results directory: %w", err)
	}
	if !o.render {
		pkgs := fs.Args()
		if len(pkgs) == 0 {
			pkgs = []string{"./..."}
		}
		if err := fuzzAll(ctx, &o, pkgs); err != nil {
			return err
		}
	}
	return render(&o)
}

func fuzzAll(ctx context.Context, o *options, patterns []string) error {
	list, err := exec.CommandContext(ctx, o.gocmd, append([]string{"list"}, patterns...)...).Output()
	if err != nil {
		return fmt.Errorf("go list: %w", err)
	}
	for _, pkg := range strings.Fields(string(list)) {
		out, err := exec.CommandContext(ctx, o.gocmd, "test", "-list", "^Fuzz", pkg).Output()
		if err != nil {
			r := Result{Package: pkg, Target: "(list)", Status: "error", Detail: "go test -list: " + err.Error(), GoVersion: runtime.Version()}
			if err := save(o, &r); err != nil {
				return err
			}
			continue
		}
		for _, t := range strings.Fields(string(out)) {
			if !strings.HasPrefix(t, "Fuzz") || !o.targets.MatchString(t) {
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r := fuzzOne(ctx, o, pkg, t)
			fmt.Fprintf(os.Stderr, "%-50s %-28s %-14s execs %d new %d\n", pkg, t, r.Status, r.Execs, r.NewInputs)
			if err := save(o, &r); err != nil {
				return err
			}
		}
	}
	return nil
}

var (
	progressRE = regexp.MustCompile(`execs: (\d+) .*new interesting: (\d+) \(total: (\d+)\)`)
	baselineRE = regexp.MustCompile(`gathering baseline coverage: \d+/(\d+) completed`)
	failingRE  = regexp.MustCompile(`Failing input written to (\S+)`)
)

func fuzzOne(ctx context.Context, o *options, pkg, target string) Result {
	r := Result{Package: pkg, Target: target, FuzzTime: o.fuzztime, Parallel: o.parallel, Start: time.Now().UTC(), GoVersion: runtime.Version()}
	cmd := exec.CommandContext(ctx, o.gocmd, "test", "-run=^$", "-fuzz=^"+target+"$",
		"-fuzztime="+o.fuzztime, "-parallel="+strconv.Itoa(o.parallel), pkg)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := cmd.Run()
	r.Seconds = time.Since(r.Start).Seconds()
	out := buf.String()
	_ = os.WriteFile(filepath.Join(o.results, fileName(pkg, target)+".log"), buf.Bytes(), 0o644)
	parse(out, &r)
	if r.Failing != "" && strings.Contains(out, "context deadline exceeded") && replayPasses(ctx, o, pkg, target, r.Failing) {
		// The coordinator's race can also save the input a worker was
		// running when the deadline hit: it is no failure if it passes.
		r.Detail = "input " + r.Failing + " saved at the deadline passes when replayed: removed"
		r.Failing = ""
		err = errDeadlineRace
	}
	switch {
	case r.Failing != "":
		r.Status = "FAIL"
	case err == nil:
		r.Status = "pass"
	case errors.Is(err, errDeadlineRace) || strings.Contains(out, "context deadline exceeded") && !strings.Contains(out, "panic:"):
		r.Status = "deadline race"
		r.Detail = strings.TrimSpace("context deadline exceeded at the -fuzztime boundary, no failing input (golang/go#75804). " + r.Detail)
	default:
		r.Status = "error"
		r.Detail = lastLines(out, 2)
	}
	return r
}

var errDeadlineRace = errors.New("deadline race")

// replayPasses runs the saved input (a path under the package's
// directory, as the engine prints it) as a regular test; when it passes
// the file is removed.
func replayPasses(ctx context.Context, o *options, pkg, target, failing string) bool {
	name := filepath.Base(failing)
	out, err := exec.CommandContext(ctx, o.gocmd, "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		return false
	}
	dir := strings.TrimSpace(string(out))
	cmd := exec.CommandContext(ctx, o.gocmd, "test", "-count=1", "-run=^"+target+"$/^"+regexp.QuoteMeta(name)+"$", pkg)
	if cmd.Run() != nil {
		return false
	}
	_ = os.Remove(filepath.Join(dir, "testdata", "fuzz", target, name))
	return true
}

// parse reads the engine's progress lines.
func parse(out string, r *Result) {
	for _, line := range strings.Split(out, "\n") {
		if m := progressRE.FindStringSubmatch(line); m != nil {
			r.Execs, _ = strconv.ParseInt(m[1], 10, 64)
			r.NewInputs, _ = strconv.Atoi(m[2])
			r.CorpusTotal, _ = strconv.Atoi(m[3])
		}
		if m := baselineRE.FindStringSubmatch(line); m != nil {
			r.Baseline, _ = strconv.Atoi(m[1])
		}
		if m := failingRE.FindStringSubmatch(line); m != nil {
			r.Failing = m[1]
			r.Detail = lastLines(out, 12)
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func fileName(pkg, target string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(pkg) + "." + target
}

func save(o *options, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("result %s: %w", r.Target, err)
	}
	p := filepath.Join(o.results, fileName(r.Package, r.Target)+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return fmt.Errorf("result %s: %w", r.Target, err)
	}
	return nil
}

const (
	beginMark = "<!-- fuzz-report:begin -->"
	endMark   = "<!-- fuzz-report:end -->"
)

func render(o *options) error {
	files, err := filepath.Glob(filepath.Join(o.results, "*.json"))
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	var rs []Result
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("result: %w", err)
		}
		var r Result
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("result %s: %w", f, err)
		}
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool {
		if rs[i].Package != rs[j].Package {
			return rs[i].Package < rs[j].Package
		}
		return rs[i].Target < rs[j].Target
	})
	report := table(rs)
	old, err := os.ReadFile(o.out)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("report: %w", err)
	}
	text := report
	if i, j := bytes.Index(old, []byte(beginMark)), bytes.Index(old, []byte(endMark)); i >= 0 && j > i {
		text = string(old[:i+len(beginMark)]) + "\n" + report + string(old[j:])
	}
	if err := os.WriteFile(o.out, []byte(text), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

func table(rs []Result) string {
	var b strings.Builder
	times := map[string]bool{}
	var first, last time.Time
	var execs int64
	status := map[string]int{}
	for _, r := range rs {
		times[fmt.Sprintf("%s, -parallel=%d", r.FuzzTime, r.Parallel)] = true
		if first.IsZero() || r.Start.Before(first) {
			first = r.Start
		}
		if e := r.Start.Add(time.Duration(r.Seconds * float64(time.Second))); e.After(last) {
			last = e
		}
		execs += r.Execs
		status[r.Status]++
	}
	var ts []string
	for t := range times {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	var ss []string
	for s, n := range status {
		ss = append(ss, fmt.Sprintf("%d %s", n, s))
	}
	sort.Strings(ss)
	goVer := ""
	if len(rs) > 0 {
		goVer = rs[0].GoVersion
	}
	fmt.Fprintf(&b, "FUZZTIME per target: **%s**; %d targets, %s; %d executions in all; %s to %s (UTC), %s.\n\n",
		strings.Join(ts, "; "), len(rs), strings.Join(ss, ", "), execs,
		first.Format("2006-01-02 15:04"), last.Format("15:04"), goVer)
	b.WriteString("| package | target | seconds | executions | baseline corpus | new interesting | result |\n|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		res := r.Status
		if r.Failing != "" {
			res += ": " + r.Failing
		} else if r.Status == "error" {
			res += ": " + strings.ReplaceAll(strings.ReplaceAll(r.Detail, "\n", " / "), "|", "\\|")
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %d | %d | %d | %s |\n",
			strings.TrimPrefix(r.Package, "github.com/carbd/carbd/"), r.Target, r.Seconds, r.Execs, r.Baseline, r.NewInputs, res)
	}
	return b.String()
}
