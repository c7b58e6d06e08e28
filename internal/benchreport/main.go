// Command benchreport runs carbd's benchmarks and writes a Markdown report
// (docs/bench-report.md) with each figure beside its goal and with ratios
// against baselines measured in the same run (`make bench`).
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/carbd/carbd/internal/benchstat"
)

// suite is one `go test -bench` invocation.
type suite struct {
	Title string
	Pkg   string
	Bench string // -bench regexp
	Root  bool   // needs root; skipped (and said so) otherwise
	// Tags are go test build tags, given only when Needs (if set) finds
	// what they need on the machine; otherwise the suite runs without
	// them and the report says why.
	Tags  string
	Needs func() error
	// CarbdEnv names the environment variable through which the suite's
	// benchmarks take a carbd binary (else each builds its own): built
	// once for every suite that sets it.
	CarbdEnv string
	// Benchtime is this suite's go test -benchtime (-benchtime given to
	// benchreport overrides it); empty: go test's 1s.
	Benchtime string
	// Ratios compare two benchmarks of the same run: Name / Base on Metric.
	Ratios []ratio
	Goals  []goal
}

type ratio struct {
	Label, Name, Base, Metric string
}

type goal struct {
	Name, Metric, Text string
	OK                 func(v float64) bool
}

// result is one benchmark's metrics, the median over -count runs.
type result map[string]float64

var lineRE = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func parse(r io.Reader) map[string][]result {
	out := map[string][]result{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		res := result{}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			res[f[i+1]] = v
		}
		out[m[1]] = append(out[m[1]], res)
	}
	return out
}

func median(rs []result) result {
	out := result{}
	keys := map[string]bool{}
	for _, r := range rs {
		for k := range r {
			keys[k] = true
		}
	}
	for k := range keys {
		var vs []float64
		for _, r := range rs {
			if v, ok := r[k]; ok {
				vs = append(vs, v)
			}
		}
		out[k] = benchstat.Median(vs)
	}
	return out
}

func main() {
	os.Exit(report())
}

// report runs the suites and writes the report; it returns the exit
// status (1 when a suite failed or the report could not be written), its
// temporary binaries removed.
func report() int {
	outPath := flag.String("o", "docs/bench-report.md", "report `file`")
	count := flag.Int("count", 3, "runs per benchmark (the report takes the median)")
	benchtime := flag.String("benchtime", "", "go test -benchtime for every suite (default: each suite's own, else go test's)")
	only := flag.String("only", "", "run only suites whose title contains one of these `words` (comma-separated)")
	flag.Parse()
	begin := time.Now()
	bins, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		return 1
	}
	defer os.RemoveAll(bins)
	builds := map[string]string{} // package and tags -> test binary
	carbd := ""                   // the carbd binary of CarbdEnv suites, once built
	var b, summary bytes.Buffer
	failed := false
	var buildTotal, runTotal time.Duration
	for _, s := range suites {
		if !selected(s.Title, *only) {
			continue
		}
		fmt.Fprintf(&b, "## %s\n\n", s.Title)
		if s.Root && os.Geteuid() != 0 {
			fmt.Fprintf(&b, "Skipped: needs root.\n\n")
			continue
		}
		tags := ""
		if s.Tags != "" {
			if err := needs(s); err != nil {
				fmt.Fprintf(&b, "Run without `-tags %s`: %v.\n\n", s.Tags, err)
			} else {
				tags = s.Tags
			}
		}
		bt := s.Benchtime
		if *benchtime != "" {
			bt = *benchtime
		}
		// The command as go test would run it (what the report shows);
		// the run builds the package's test binary once and runs it.
		args := []string{"test", "-run=^$", "-bench=" + s.Bench, "-benchmem", "-count=" + strconv.Itoa(*count)}
		if tags != "" {
			args = append(args, "-tags="+tags)
		}
		args = append(args, s.Pkg)
		if bt != "" {
			args = append(args, "-benchtime="+bt)
		}
		var build time.Duration
		key := s.Pkg + " " + tags
		bin, ok := builds[key]
		if !ok {
			bin = filepath.Join(bins, fmt.Sprintf("%d.test", len(builds)))
			t0 := time.Now()
			if err := buildTest(s.Pkg, tags, bin); err != nil {
				fmt.Fprintf(&b, "**Failed**: build %s: %v\n\n", s.Pkg, err)
				failed = true
				continue
			}
			build = time.Since(t0)
			builds[key] = bin
		}
		var env []string
		if s.CarbdEnv != "" {
			if carbd == "" {
				t0 := time.Now()
				bin, err := buildCarbd()
				build += time.Since(t0)
				if err != nil {
					fmt.Fprintf(&b, "**Failed**: build carbd: %v\n\n", err)
					failed = true
					continue
				}
				defer os.RemoveAll(filepath.Dir(bin))
				carbd = bin
			}
			env = append(env, s.CarbdEnv+"="+carbd)
		}
		targs := []string{"-test.run=^$", "-test.bench=" + s.Bench, "-test.benchmem", "-test.count=" + strconv.Itoa(*count)}
		if bt != "" {
			targs = append(targs, "-test.benchtime="+bt)
		}
		fmt.Fprintf(os.Stderr, "benchreport: go %s\n", strings.Join(args, " "))
		out, wall, run, err := runTest(bin, s.Pkg, targs, env)
		buildTotal += build
		runTotal += run
		fmt.Fprintf(&summary, "| %s | %.0f | %.0f | %.0f | %s |\n", s.Title, build.Seconds(), run.Seconds(), (build + run).Seconds(), longest(wall))
		if err != nil {
			fmt.Fprintf(&b, "**Failed**: `go %s`: %v\n\n", strings.Join(args, " "), err)
			failed = true
			continue
		}
		runs := parse(bytes.NewReader(out))
		res := map[string]result{}
		names := make([]string, 0, len(runs))
		for n, rs := range runs {
			res[n] = median(rs)
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(&b, "`go %s`\n\nWall time %s (build %s, run %s). A benchmark's wall time is the time from the previous result line to each of its own, summed over the runs: its set-up, the harness's sizing runs and the measured ones. Spread: (max − min) / median of ns/op over the runs.\n\n| benchmark | wall | spread | figures |\n|---|---|---|---|\n",
			strings.Join(args, " "), secs(build+run), secs(build), secs(run))
		for _, n := range names {
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", strings.TrimPrefix(n, "Benchmark"), secs(wall[n]), spread(runs[n], "ns/op"), render(res[n]))
		}
		b.WriteString("\n")
		for _, r := range s.Ratios {
			num, okN := res[r.Name][r.Metric]
			den, okD := res[r.Base][r.Metric]
			if !okN || !okD || den == 0 {
				fmt.Fprintf(&b, "- %s: not measured (%s or %s missing)\n", r.Label, r.Name, r.Base)
				continue
			}
			fmt.Fprintf(&b, "- %s: **%.2f×** (%s %s / %s %s)\n", r.Label, num/den, strings.TrimPrefix(r.Name, "Benchmark"), fmtv(num, r.Metric), strings.TrimPrefix(r.Base, "Benchmark"), fmtv(den, r.Metric))
		}
		for _, g := range s.Goals {
			v, ok := res[g.Name][g.Metric]
			if !ok {
				fmt.Fprintf(&b, "- goal %s: not measured\n", g.Text)
				continue
			}
			mark := "met"
			if !g.OK(v) {
				mark = "NOT met"
			}
			fmt.Fprintf(&b, "- goal %s: %s %s — %s (runs: %s)\n", g.Text, fmtv(v, g.Metric), g.Metric, mark, values(runs[g.Name], g.Metric))
		}
		b.WriteString("\n")
	}
	var doc bytes.Buffer
	fmt.Fprintf(&doc, "# carbd benchmark report\n\nGenerated by `make bench` on %s: %s/%s, %d CPUs, %s, kernel %s. Each figure is the median of %d runs; ratios compare benchmarks measured in the same run.\n\n",
		begin.UTC().Format("2006-01-02 15:04 UTC"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), kernel(), *count)
	fmt.Fprintf(&doc, "## Where the time goes\n\n%s in all (goal: under 15 minutes): test binaries built in %s, benchmarks run in %s. A package's test binary is built once for all its suites.\n\n| suite | build s | run s | wall s | longest benchmark |\n|---|---|---|---|---|\n",
		secs(time.Since(begin)), secs(buildTotal), secs(runTotal))
	doc.Write(summary.Bytes())
	doc.WriteString("\n")
	doc.Write(b.Bytes())
	if err := os.WriteFile(*outPath, doc.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s in %s\n", *outPath, secs(time.Since(begin)))
	if failed {
		return 1
	}
	return 0
}

// selected says whether a suite's title contains one of only's
// comma-separated words (any title when only is empty).
func selected(title, only string) bool {
	if only == "" {
		return true
	}
	for _, w := range strings.Split(only, ",") {
		if w != "" && strings.Contains(title, w) {
			return true
		}
	}
	return false
}

// buildTest builds pkg's test binary into bin (go vet's checks, which go
// test runs before testing, are left to make check).
func buildTest(pkg, tags, bin string) error {
	args := []string{"test", "-c", "-vet=off", "-o", bin}
	if tags != "" {
		args = append(args, "-tags="+tags)
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// buildCarbd builds ./cmd/carbd (static, as make build does) into a new
// directory under /var/lib: a sandbox sees /tmp as its own tmpfs, the
// rest of the host read-only.
func buildCarbd() (string, error) {
	dir, err := os.MkdirTemp("/var/lib", "carbd-benchreport-")
	if err != nil {
		return "", fmt.Errorf("build carbd: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build carbd: %w", err)
	}
	bin := filepath.Join(dir, "carbd")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/carbd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build ./cmd/carbd: %w", err)
	}
	return bin, nil
}

// runTest runs a test binary in its package's directory (as go test
// does), copies its output to stderr and returns it with each
// benchmark's wall time: the time from the previous result line (or the
// start) to each of the benchmark's result lines, summed.
func runTest(bin, pkg string, args, env []string) (out []byte, wall map[string]time.Duration, run time.Duration, err error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, 0, fmt.Errorf("run %s: %w", bin, err)
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, nil, 0, fmt.Errorf("run %s: %w", bin, err)
	}
	var buf bytes.Buffer
	wall = stamp(stdout, io.MultiWriter(&buf, os.Stderr), t0, time.Now)
	err = cmd.Wait()
	run = time.Since(t0)
	return buf.Bytes(), wall, run, err
}

// stamp copies r's lines to w and gives each benchmark result line's
// name the time since the previous result line (from start for the
// first), summed per name, until r ends.
func stamp(r io.Reader, w io.Writer, start time.Time, now func() time.Time) map[string]time.Duration {
	wall := map[string]time.Duration{}
	prev := start
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(w, line)
		m := lineRE.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		t := now()
		wall[m[1]] += t.Sub(prev)
		prev = t
	}
	return wall
}

// spread is (max - min) / median of metric over rs, as a percentage; ""
// with fewer than two values.
func spread(rs []result, metric string) string {
	var vs []float64
	for _, r := range rs {
		if v, ok := r[metric]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) < 2 {
		return ""
	}
	sort.Float64s(vs)
	med := vs[len(vs)/2]
	if med == 0 {
		return ""
	}
	return strconv.FormatFloat((vs[len(vs)-1]-vs[0])/med*100, 'f', 0, 64) + " %"
}

// values lists metric's value in each of rs, in run order.
func values(rs []result, metric string) string {
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		if v, ok := r[metric]; ok {
			parts = append(parts, fmtv(v, metric))
		}
	}
	return strings.Join(parts, ", ")
}

// longest names the benchmark with the most wall time, with its time.
func longest(wall map[string]time.Duration) string {
	name := ""
	for n, d := range wall {
		if name == "" || d > wall[name] || d == wall[name] && n < name {
			name = n
		}
	}
	if name == "" {
		return ""
	}
	return strings.TrimPrefix(name, "Benchmark") + " (" + secs(wall[name]) + ")"
}

// secs renders a duration in seconds for the report.
func secs(d time.Duration) string {
	if d < 10*time.Second {
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 0, 64) + " s"
}

func render(r result) string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmtv(r[k], k)+" "+k)
	}
	return strings.Join(parts, ", ")
}

func fmtv(v float64, metric string) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
}

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
