package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/carbd/carbd/pkg/daemon"
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

func runAudit(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit", "--pcap FILE [--sandbox ID]")
	out := fs.String("pcap", "", "write the pcapng to `file`")
	id := fs.String("sandbox", "", "the sandbox (needed when several run)")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("%w: --pcap is required", errUsage)
	}
	cs, err := clients(*stateDir, *id)
	if err != nil {
		return err
	}
	if len(cs) != 1 {
		return fmt.Errorf("%w: %d sandboxes are running: name one with --sandbox", errUsage, len(cs))
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := cs[0].Do(daemon.Request{Cmd: "audit"}, f); err != nil {
		return err
	}
	return f.Close()
}
