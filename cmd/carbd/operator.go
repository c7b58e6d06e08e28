package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/hooks/capture"
)

func init() {
	register(&command{name: "status", summary: "show running sandboxes, held effects, budgets and counters", run: runStatus})
	register(&command{name: "held", summary: "list effects waiting for the operator", run: runHeld})
	register(&command{name: "approve", summary: "release a held effect (operator oracle)", run: func(_ context.Context, e *env, a []string) error { return runAnswer(e, a, true) }})
	register(&command{name: "deny", summary: "refuse a held effect (operator oracle)", run: func(_ context.Context, e *env, a []string) error { return runAnswer(e, a, false) }})
	register(&command{name: "audit", summary: "export a sandbox's traffic as pcapng with verdicts", run: runAudit})
}

func clients(stateDir, id string) ([]daemon.Client, error) {
	if id != "" {
		if c, ok := daemon.SocketOf(stateDir, id); ok {
			return []daemon.Client{c}, nil
		}
		return nil, fmt.Errorf("no running sandbox %q under %s", id, stateDir)
	}
	return daemon.Sockets(stateDir)
}

func runStatus(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "status", "[--json] [--sandbox ID]")
	asJSON := fs.Bool("json", false, "print the stable JSON form (docs/status.md)")
	id := fs.String("sandbox", "", "only this sandbox")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	cs, err := clients(*stateDir, *id)
	if err != nil {
		return err
	}
	var sts []daemon.SandboxStatus
	for _, c := range cs {
		resp, err := c.Do(daemon.Request{Cmd: "status"}, nil)
		if skipDead(e, "status", *id, c, err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", c.ID(), err)
		}
		sts = append(sts, *resp.Status)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"version": daemon.StatusVersion, "sandboxes": nonNil(sts)})
	}
	daemon.WriteText(e.stdout, sts, time.Now())
	return nil
}

// skipDead reports whether a listing goes on past a sandbox whose carbd
// is gone (its socket stays after a crash), saying so on stderr. A
// sandbox named with --sandbox is never skipped: its error is the answer.
func skipDead(e *env, cmd, named string, c daemon.Client, err error) bool {
	if named != "" || !errors.Is(err, daemon.ErrNotRunning) {
		return false
	}
	fmt.Fprintf(e.stderr, "carbd %s: sandbox %s: %v\n", cmd, c.ID(), daemon.ErrNotRunning)
	return true
}

func nonNil(s []daemon.SandboxStatus) []daemon.SandboxStatus {
	if s == nil {
		return []daemon.SandboxStatus{}
	}
	return s
}

func runHeld(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "held", "[--json] [--sandbox ID]")
	asJSON := fs.Bool("json", false, "print JSON")
	id := fs.String("sandbox", "", "only this sandbox")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	cs, err := clients(*stateDir, *id)
	if err != nil {
		return err
	}
	all := map[string][]daemon.HeldEffect{}
	for _, c := range cs {
		resp, err := c.Do(daemon.Request{Cmd: "held"}, nil)
		if skipDead(e, "held", *id, c, err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", c.ID(), err)
		}
		all[c.ID()] = resp.Held
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(all)
	}
	now := time.Now()
	n := 0
	for sid, hs := range all {
		for _, h := range hs {
			n++
			state := "held in scope"
			if h.Pending {
				state = fmt.Sprintf("waiting for the operator, refused in %s", h.Deadline.Sub(now).Round(time.Second))
			}
			fmt.Fprintf(e.stdout, "%s #%d %s %s %s (%s)\n    %s\n", sid, h.ID, h.Kind, h.Op, h.Obj, state, h.Justification)
		}
	}
	if n == 0 {
		fmt.Fprintln(e.stdout, "nothing held")
	}
	return nil
}

func runAnswer(e *env, args []string, release bool) error {
	verb := "deny"
	if release {
		verb = "approve"
	}
	fs := newFlagSet(e, verb, "[--sandbox ID] [--why TEXT] [--for-run] EFFECT-ID")
	id := fs.String("sandbox", "", "the sandbox (needed when several run)")
	why := fs.String("why", "", "justification recorded in the audit log")
	forRun := fs.Bool("for-run", false, "answer the same operation on the same target so for the rest of the run")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want one effect id, got %d arguments", errUsage, fs.NArg())
	}
	eid, err := strconv.ParseUint(fs.Arg(0), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: effect id %q is not a number", errUsage, fs.Arg(0))
	}
	cs, err := clients(*stateDir, *id)
	if err != nil {
		return err
	}
	if len(cs) != 1 {
		return fmt.Errorf("%w: %d sandboxes are running: name one with --sandbox", errUsage, len(cs))
	}
	if _, err := cs[0].Do(daemon.Request{Cmd: verb, ID: eid, Justification: *why, ForRun: *forRun}, nil); err != nil {
		return err
	}
	done := "denied"
	if release {
		done = "approved"
	}
	fmt.Fprintf(e.stdout, "effect %d %s\n", eid, done)
	return nil
}

// runAudit exports a sandbox's pcapng audit: a running sandbox's from
// its capture (over the operator socket), a finished run's from the file
// the run streamed (by run id, by sandbox id: its newest run, or by
// path), up to its last whole block (a run carbd did not finish).
func runAudit(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit", "--pcap OUT [--sandbox ID | --run RUN-ID | FILE]\n       carbd audit --list")
	out := fs.String("pcap", "", "write the pcapng to `file` (mode 0600)")
	id := fs.String("sandbox", "", "the sandbox `ID`: its capture while it runs, else its newest finished run")
	run := fs.String("run", "", "a finished run's `id` (or a unique prefix; carbd audit --list)")
	list := fs.Bool("list", false, "list the runs whose audit is kept")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	workState := fs.String("work-state-root", daemon.DefaultWorkStateRoot, "the `directory` where runs keep their audit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(1))
	}
	file := fs.Arg(0)
	if *list {
		if file != "" || *out != "" || *run != "" {
			return fmt.Errorf("%w: --list takes no other argument", errUsage)
		}
		return listRuns(e, *workState, *id)
	}
	if *out == "" {
		return fmt.Errorf("%w: --pcap is required", errUsage)
	}
	n := 0
	for _, set := range []bool{file != "", *run != "", *id != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("%w: name one of --sandbox, --run or a FILE", errUsage)
	}
	if file == "" && *run == "" {
		// A running sandbox: its capture, live.
		cs, err := clients(*stateDir, *id)
		switch {
		case err == nil && len(cs) == 1:
			if err := exportLive(cs[0], *out); !errors.Is(err, daemon.ErrNotRunning) || *id == "" {
				return err
			}
		case err == nil && len(cs) > 1:
			return fmt.Errorf("%w: %d sandboxes are running: name one with --sandbox", errUsage, len(cs))
		case *id == "":
			if err != nil {
				return err
			}
			return fmt.Errorf("no running sandbox: name a finished run with --run, --sandbox or its FILE (carbd audit --list)")
		}
	}
	if file == "" {
		info, err := daemon.FindRun(*workState, *run, *id)
		if err != nil {
			return err
		}
		file = info.Pcap
	}
	if st, err := os.Stat(file); err == nil && st.IsDir() {
		file = filepath.Join(file, "audit.pcapng")
	}
	return exportFile(e, file, *out)
}

// exportLive writes a running sandbox's capture to out.
func exportLive(c daemon.Client, out string) error {
	f, err := createPrivate(out)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := c.Do(daemon.Request{Cmd: "audit"}, f); err != nil {
		os.Remove(out)
		return err
	}
	return f.Close()
}

// exportFile copies a streamed pcapng up to its last whole block.
func exportFile(e *env, file, out string) error {
	in, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer in.Close()
	f, err := createPrivate(out)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	st, err := capture.CopyBlocks(w, bufio.NewReader(in))
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("audit: %s: %w", file, err)
	}
	if st.Truncated {
		fmt.Fprintf(e.stderr, "carbd audit: %s ends inside a block (its run did not finish): exported the %d whole blocks before it\n", file, st.Blocks)
	}
	return f.Close()
}

func createPrivate(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("audit: %w", err)
	}
	return f, nil
}

func listRuns(e *env, root, sandbox string) error {
	runs, err := daemon.ListRuns(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(e.stdout, "no runs kept")
			return nil
		}
		return err
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSANDBOX\tSTARTED\tENDED\tFRAMES\tPCAP")
	n := 0
	for _, r := range runs {
		if sandbox != "" && r.Sandbox != sandbox {
			continue
		}
		ended := "unfinished"
		if r.Finished {
			ended = r.Ended.Format(time.RFC3339)
		}
		frames := strconv.FormatUint(r.Frames, 10)
		if !r.Finished {
			frames = "-"
		} else if r.Dropped > 0 {
			frames += fmt.Sprintf(" (+%d over the cap)", r.Dropped)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Run, r.Sandbox, r.Started.Format(time.RFC3339), ended, frames, r.Pcap)
		n++
	}
	if n == 0 {
		fmt.Fprintln(e.stdout, "no runs kept")
		return nil
	}
	return tw.Flush()
}
