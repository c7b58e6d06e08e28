//go:build linux

package soak

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/hooks/fileev"
)

// Probe says what Measure looks at. Host-wide counts (rules, links,
// namespaces, mounts, BPF objects) include what other processes on the
// machine make; the *_ours columns count only what names ID or lies under
// Base.
type Probe struct {
	ID           string // the sandbox id of the runs
	Base         string // the harness's directory (working directory, state dir)
	StateDir     string // carbd run --state-dir
	WorkStateDir string // the working directory's state (/var/lib/carbd/w/<id>)
	Binary       string // the carbd binary: processes still running it are counted
	Workdir      string // the working directory
	WorldNS      string // the world's network namespace: its open TCP connections are counted
}

// Row is one measurement: column name -> value.
type Row map[string]float64

// Measure takes the host's and carbd's state now. A probe that cannot run
// (a tool missing) leaves its columns out.
func Measure(p Probe) Row {
	r := Row{}
	// The working directory's state: in total and per top-level entry.
	b, n := treeSize(p.WorkStateDir)
	r["ws_bytes"], r["ws_files"] = b, n
	if ents, err := os.ReadDir(p.WorkStateDir); err == nil {
		for _, e := range ents {
			b, n := treeSize(filepath.Join(p.WorkStateDir, e.Name()))
			r["ws_"+e.Name()+"_bytes"], r["ws_"+e.Name()+"_files"] = b, n
			if e.IsDir() {
				if sub, err := os.ReadDir(filepath.Join(p.WorkStateDir, e.Name())); err == nil {
					r["ws_"+e.Name()+"_entries"] = float64(len(sub))
				}
			}
		}
	}
	r["statedir_bytes"], r["statedir_files"] = treeSize(p.StateDir)
	if m, _ := filepath.Glob("/run/carbd*"); m != nil {
		for _, d := range m {
			col := "run_" + strings.ReplaceAll(filepath.Base(d), "-", "_")
			r[col+"_bytes"], r[col+"_files"] = treeSize(d)
		}
	}
	r["w_bytes"], r["w_files"] = treeSize(p.Workdir)
	r["w_git_objects_files"] = func() float64 { _, n := treeSize(filepath.Join(p.Workdir, ".git", "objects")); return n }()
	if p.WorldNS != "" {
		if out, err := exec.Command("ip", "netns", "exec", p.WorldNS, "ss", "-Htn", "state", "established").Output(); err == nil {
			r["world_tcp_established"] = float64(bytes.Count(out, []byte("\n")))
		}
	}
	r["var_lib_carbd_ca_files"] = func() float64 { _, n := treeSize("/var/lib/carbd/ca"); return n }()

	// bpffs: everything under carbd's pin root, and the shared file
	// tracer's slot directories (one per tracer in use).
	var pins, slots, pinsOurs float64
	_ = filepath.WalkDir("/sys/fs/bpf/carbd", func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == "/sys/fs/bpf/carbd" {
			return nil
		}
		pins++
		if d.IsDir() && strings.HasPrefix(d.Name(), "slot-") {
			slots++
		}
		if strings.Contains(path, p.ID) {
			pinsOurs++
		}
		return nil
	})
	r["bpffs_carbd_entries"], r["bpffs_tracer_slots"], r["bpffs_ours"] = pins, slots, pinsOurs
	if out, err := exec.Command("bpftool", "-j", "prog", "show").Output(); err == nil {
		var v []json.RawMessage
		if json.Unmarshal(out, &v) == nil {
			r["bpf_progs"] = float64(len(v))
		}
	}
	if out, err := exec.Command("bpftool", "-j", "map", "show").Output(); err == nil {
		var v []json.RawMessage
		if json.Unmarshal(out, &v) == nil {
			r["bpf_maps"] = float64(len(v))
		}
	}

	// Netfilter: rules and chains of each xtables flavour, nft tables.
	for _, t := range []struct{ col, cmd string }{
		{"ipt", "iptables-save"}, {"ip6t", "ip6tables-save"},
		{"iptleg", "iptables-legacy-save"}, {"ip6tleg", "ip6tables-legacy-save"},
	} {
		out, err := exec.Command(t.cmd).Output()
		if err != nil {
			continue
		}
		var rules, chains, ours float64
		for _, l := range bytes.Split(out, []byte("\n")) {
			switch {
			case bytes.HasPrefix(l, []byte("-A ")):
				rules++
			case bytes.HasPrefix(l, []byte(":")):
				chains++
			}
			if bytes.Contains(l, []byte(p.ID)) {
				ours++
			}
		}
		r[t.col+"_rules"], r[t.col+"_chains"], r[t.col+"_ours"] = rules, chains, ours
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		r["nft_tables"] = float64(bytes.Count(out, []byte("\n")))
		r["nft_tables_ours"] = float64(bytes.Count(out, []byte(p.ID)))
	}

	// cgroups named carbd* at the cgroup2 root, and anything naming ID.
	if mnt, err := fileev.Cgroup2Mount(); err == nil {
		var cg, cgOurs float64
		if ents, err := os.ReadDir(mnt); err == nil {
			for _, e := range ents {
				if e.IsDir() && strings.HasPrefix(e.Name(), "carbd") {
					cg++
					_ = filepath.WalkDir(filepath.Join(mnt, e.Name()), func(path string, d fs.DirEntry, err error) error {
						if err == nil && d.IsDir() && strings.Contains(d.Name(), p.ID) {
							cgOurs++
						}
						return nil
					})
				}
			}
		}
		r["cgroups_carbd"], r["cgroups_ours"] = cg, cgOurs
	}

	// Mounts, namespaces, links, conntrack.
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		r["mounts"] = float64(bytes.Count(b, []byte("\n")))
		var ours float64
		for _, l := range bytes.Split(b, []byte("\n")) {
			if bytes.Contains(l, []byte(p.Base)) || bytes.Contains(l, []byte(p.ID)) {
				ours++
			}
		}
		r["mounts_ours"] = ours
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		r["netns_named"] = float64(len(ents))
	}
	r["netns_all"] = countNetNS()
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		r["links"] = float64(len(ents))
		var ours float64
		for _, e := range ents {
			if strings.Contains(e.Name(), p.ID) {
				ours++
			}
		}
		r["links_ours"] = ours
	}
	r["conntrack"] = readNum("/proc/sys/net/netfilter/nf_conntrack_count")

	// Processes: carbd processes left running, and this (long-lived)
	// process's fds, threads and goroutines (the world's servers).
	r["carbd_procs"] = countProcs(p.Binary)
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		r["harness_fds"] = float64(len(ents))
	}
	r["harness_threads"] = statusField("/proc/self/status", "Threads:")
	r["harness_goroutines"] = float64(runtime.NumGoroutine())
	return r
}

// treeSize returns the bytes (apparent sizes of regular files) and the
// number of entries below dir (dir itself not counted).
func treeSize(dir string) (bytes, files float64) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if path == dir {
			if !d.IsDir() {
				if fi, err := d.Info(); err == nil {
					bytes += float64(fi.Size())
				}
				files++
			}
			return nil
		}
		files++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				bytes += float64(fi.Size())
			}
		}
		return nil
	})
	return bytes, files
}

func readNum(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil {
		return -1
	}
	return v
}

// statusField reads a number from a /proc/PID/status line ("VmHWM:  123 kB").
func statusField(path, field string) float64 {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), field)
		if !ok {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) == 0 {
			return -1
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			return -1
		}
		return v
	}
	return -1
}

// countNetNS counts the distinct network namespaces of all processes and
// the named ones (bind mounts in /run/netns).
func countNetNS() float64 {
	seen := map[string]bool{}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil {
			seen[l] = true
		}
	}
	named, _ := os.ReadDir("/run/netns")
	for _, e := range named {
		var st unix.Stat_t
		if unix.Stat(filepath.Join("/run/netns", e.Name()), &st) == nil {
			seen["net:["+strconv.FormatUint(st.Ino, 10)+"]"] = true
		}
	}
	return float64(len(seen))
}

// countProcs counts processes whose executable is bin.
func countProcs(bin string) float64 {
	if bin == "" {
		return 0
	}
	var n float64
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && (l == bin || l == bin+" (deleted)") {
			n++
		}
	}
	return n
}
