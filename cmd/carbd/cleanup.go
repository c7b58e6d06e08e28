package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/carbd/carbd/internal/demo"
	"github.com/carbd/carbd/pkg/daemon"
)

func init() {
	register(&command{name: "cleanup", summary: "list (and with --remove, remove) what crashed runs left on the host", run: runCleanup})
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error {
	*s = append(*s, v)
	return nil
}

// cleanupReport is carbd cleanup --json.
type cleanupReport struct {
	Sandboxes []*daemon.SandboxLeftovers `json:"sandboxes"`
	Shared    []daemon.HostResource      `json:"shared"`
	Removed   []string                   `json:"removed,omitempty"`
	Failures  []daemon.RemovalFailure    `json:"failures,omitempty"`
	// Stale counts the stale sandboxes left (after --remove: those not
	// removed).
	Stale int `json:"stale"`
}

func runCleanup(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "cleanup", "[--json] [--remove] [--id ID]... [--state-dir DIR]...")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	remove := fs.Bool("remove", false, "remove the stale sandboxes' resources (never a live one's, never a working directory's state)")
	var ids, stateDirs stringList
	fs.Var(&ids, "id", "only the sandbox `id` (repeatable)")
	fs.Var(&stateDirs, "state-dir", "a run's state `directory` (repeatable; default "+daemon.DefaultStateDir+")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (netfilter, BPF pins, cgroups, mounts)")
	}
	opt := daemon.CleanupOptions{StateDirs: stateDirs, IDs: ids}
	h, scanErr := daemon.ScanHost(opt)
	if h == nil {
		return scanErr
	}
	rep := cleanupReport{}
	// Demo worlds (carbd demo) belong to no sandbox id: only without --id.
	withDemo := len(ids) == 0
	if *remove && withDemo {
		if _, err := demo.RemoveStaleWorlds(); err != nil {
			rep.Failures = append(rep.Failures, daemon.RemovalFailure{ID: "demo", Resource: "demo world", Err: err.Error()})
		}
	}
	if *remove {
		for _, s := range h.Sandboxes {
			if s.State == "live" || s.State == "ended" && !hasLockFile(s) {
				continue
			}
			fails := daemon.RemoveLeftovers(s)
			rep.Failures = append(rep.Failures, fails...)
			if len(fails) == 0 && s.State == "stale" {
				rep.Removed = append(rep.Removed, s.ID)
			}
		}
		// What is left is what the kernel shows now.
		if h, scanErr = daemon.ScanHost(opt); h == nil {
			return scanErr
		}
	}
	rep.Sandboxes, rep.Shared, rep.Stale = h.Sandboxes, h.Shared, len(h.Stale())
	if withDemo {
		w, err := demo.Worlds()
		if err != nil {
			scanErr = errors.Join(scanErr, err)
		}
		for _, l := range w.Links {
			rep.Shared = append(rep.Shared, daemon.HostResource{Kind: "demo-world-link", Name: l, Live: w.Live})
		}
		for _, n := range w.Namespaces {
			rep.Shared = append(rep.Shared, daemon.HostResource{Kind: "demo-world-netns", Name: "/run/netns/" + n, Live: w.Live})
		}
		if !w.Live && len(w.Links)+len(w.Namespaces) > 0 {
			rep.Stale++
		}
	}
	if rep.Sandboxes == nil {
		rep.Sandboxes = []*daemon.SandboxLeftovers{}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writeCleanup(e.stdout, rep, *remove)
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(e.stderr, "carbd cleanup: sandbox %s: %s: %s\n", f.ID, f.Resource, f.Err)
	}
	if scanErr != nil {
		fmt.Fprintf(e.stderr, "carbd cleanup: %v\n", scanErr)
	}
	if rep.Stale > 0 || len(rep.Failures) > 0 || scanErr != nil {
		return exitError{1}
	}
	return nil
}

func writeCleanup(w io.Writer, rep cleanupReport, removed bool) {
	ended := 0
	for _, s := range rep.Sandboxes {
		if s.State == "ended" && len(s.Recovery) == 0 && !hasKeptOnly(s) {
			ended++
			continue
		}
		switch s.State {
		case "live":
			fmt.Fprintf(w, "sandbox %s: live (carbd pid %d)\n", s.ID, s.Pid)
		case "stale":
			fmt.Fprintf(w, "sandbox %s: stale (no carbd holds its id)\n", s.ID)
		default:
			fmt.Fprintf(w, "sandbox %s: ended\n", s.ID)
		}
		for _, r := range s.Resources {
			note := ""
			if r.Kept {
				note = " (kept: the run's decision log)"
			}
			fmt.Fprintf(w, "  %-16s %s%s\n", r.Kind, r.Name, note)
		}
		for _, r := range s.Recovery {
			if gone, ok := strings.CutPrefix(r.Command, "none: "); ok {
				fmt.Fprintf(w, "  unfinished run %s of %s: %s; its state is kept in %s\n", r.Run, r.Workdir, gone, r.StateDir)
				continue
			}
			fmt.Fprintf(w, "  needs recovery: run carbd in %s again: %s\n", r.Workdir, r.Command)
			fmt.Fprintf(w, "    its last run %s (started %s) did not finish", r.Run, r.Started.Format("2006-01-02 15:04:05Z07:00"))
			if r.Staging != "" {
				fmt.Fprintf(w, "; staged layers and journal in %s", r.Staging)
			}
			fmt.Fprintf(w, "; labels in %s\n", r.StateDir)
		}
	}
	if ended > 0 {
		fmt.Fprintf(w, "%d ended sandbox ids have only their lock file under %s", ended, daemon.IndexDir)
		if !removed {
			fmt.Fprint(w, " (removed with --remove)")
		}
		fmt.Fprintln(w)
	}
	live := 0
	for _, r := range rep.Shared {
		if r.Live && r.Kind == daemon.ResTracerSlot {
			live++
		}
	}
	slots := 0
	for _, r := range rep.Shared {
		switch {
		case r.Kind == daemon.ResTracerSlot:
			slots++
		case r.Live:
			fmt.Fprintf(w, "%-16s %s (a demo is running)\n", r.Kind, r.Name)
		default:
			fmt.Fprintf(w, "%-16s %s (stale: no demo is running)\n", r.Kind, r.Name)
		}
	}
	if slots > 0 {
		fmt.Fprintf(w, "shared file tracer: %d slots, %d live (a stale slot is reclaimed by the next run's tracer)\n", slots, live)
	}
	for _, id := range rep.Removed {
		fmt.Fprintf(w, "removed: sandbox %s\n", id)
	}
	if rep.Stale == 0 && len(rep.Failures) == 0 {
		fmt.Fprintln(w, "nothing stale")
	}
}

// hasKeptOnly says whether an ended sandbox still has something to show
// besides its lock file (its state directory).
func hasKeptOnly(s *daemon.SandboxLeftovers) bool {
	for _, r := range s.Resources {
		if r.Kind != daemon.ResIDLock {
			return true
		}
	}
	return false
}

func hasLockFile(s *daemon.SandboxLeftovers) bool {
	for _, r := range s.Resources {
		if r.Kind == daemon.ResIDLock {
			return true
		}
	}
	return false
}
