package soak

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// summarise renders the growth per run of every column of rows (run 0,
// the baseline before the first run, is left out of the fit) as a
// Markdown table: value at the first and last run, slope ± standard
// error, and whether it grows (slope > 3 s.e.).
func summarise(rows []Row) string {
	var runs []Row
	for _, r := range rows {
		if r["run"] >= 1 {
			runs = append(runs, r)
		}
	}
	var b strings.Builder
	if len(runs) < 3 {
		return "fewer than three runs: no fit\n"
	}
	first, last := runs[0], runs[len(runs)-1]
	fmt.Fprintf(&b, "runs %g to %g\n\n", first["run"], last["run"])
	fmt.Fprintf(&b, "| resource | run %g | run %g | growth per run ± s.e. | grows |\n|---|---:|---:|---:|---|\n", first["run"], last["run"])
	set := map[string]bool{}
	for _, r := range runs {
		for k := range r {
			set[k] = true
		}
	}
	var cols []string
	for k := range set {
		if k != "run" {
			cols = append(cols, k)
		}
	}
	sort.Strings(cols)
	x := make([]float64, len(runs))
	for i, r := range runs {
		x[i] = r["run"]
	}
	for _, c := range cols {
		y := make([]float64, len(runs))
		for i, r := range runs {
			y[i] = r[c]
		}
		f, err := LinearFit(x, y)
		if err != nil {
			continue
		}
		grows := ""
		if f.Grows() {
			grows = "**yes**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s ± %s | %s |\n", c, num(first[c]), num(last[c]), num(f.Slope), num(f.SlopeSE), grows)
	}
	return b.String()
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v == math.Trunc(v) && math.Abs(v) < 1e12:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// summaryCounts reads carbd run's summary line "released 112, refused 3,
// held 0; files: committed 20, aborted 0, conflicts 6".
func summaryCounts(out string) map[string]float64 {
	m := map[string]float64{}
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "released ") {
			continue
		}
		for _, part := range strings.FieldsFunc(l, func(r rune) bool { return r == ',' || r == ';' }) {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(part), "files:"))
			if len(f) == 2 {
				if v, err := strconv.ParseFloat(f[1], 64); err == nil {
					m[f[0]] = v
				}
			}
		}
		break
	}
	return m
}
