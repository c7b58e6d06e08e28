package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/decide"
)

func init() {
	register(&command{name: "watch", summary: "answer the operator's questions as they arrive (y/n, Y/N for the run)", run: runWatch})
}

// runWatch shows each question of the operator oracle as it arrives and
// reads the answer from a line of input: y or n answers it, Y or N
// answers the same operation on the same target for the rest of the run,
// s skips it, q quits. Plain lines, so it works over ssh and from a pipe.
func runWatch(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "watch", "[--sandbox ID] [--interval D]")
	id := fs.String("sandbox", "", "only this sandbox")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "carbd's state `directory`")
	interval := fs.Duration("interval", 500*time.Millisecond, "how often to look for new questions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- strings.TrimSpace(sc.Text()):
			case <-ctx.Done():
				return
			}
		}
	}()
	seen := map[string]bool{}
	fmt.Fprintln(e.stdout, "watching for questions (y/n: answer, Y/N: for the run, s: skip, q: quit)")
	for {
		q, c, ok, err := nextQuestion(e, *stateDir, *id, seen)
		if err != nil {
			return err
		}
		if !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(*interval):
				continue
			}
		}
		fmt.Fprintf(e.stdout, "\n%s #%d %s %s\n    %s\n    refused at %s unless answered\n[y/n/Y/N/s/q] ",
			c.ID(), q.ID, q.Op, q.Obj, q.Justification, q.Deadline.Format("15:04:05"))
		ans, withdrawn, done := waitAnswer(ctx, c, q.ID, lines, *interval)
		if done {
			return nil
		}
		if withdrawn != nil {
			fmt.Fprintf(e.stdout, "\n%s #%d withdrawn at %s: its client is gone (%s); nothing was released\n",
				c.ID(), q.ID, withdrawn.At.Local().Format("15:04:05"), withdrawn.Reason)
			continue
		}
		req := daemon.Request{ID: q.ID, Justification: "answered with carbd watch"}
		switch ans {
		case "y", "yes":
			req.Cmd = "approve"
		case "n", "no":
			req.Cmd = "deny"
		case "Y":
			req.Cmd, req.ForRun = "approve", true
		case "N":
			req.Cmd, req.ForRun = "deny", true
		case "q":
			return nil
		default:
			fmt.Fprintln(e.stdout, "skipped")
			continue
		}
		if _, err := c.Do(req, nil); err != nil {
			fmt.Fprintf(e.stdout, "%s #%d: %v\n", c.ID(), q.ID, err)
			continue
		}
		fmt.Fprintf(e.stdout, "%s #%d %sd\n", c.ID(), q.ID, req.Cmd)
	}
}

// waitAnswer waits for the answer to question id of c's sandbox, and
// looks every interval whether the question was withdrawn meanwhile (no
// client waits for it any more). done: stop watching.
func waitAnswer(ctx context.Context, c daemon.Client, id uint64, lines <-chan string, interval time.Duration) (ans string, withdrawn *decide.Withdrawn, done bool) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "", nil, true
		case l, more := <-lines:
			return l, nil, !more
		case <-t.C:
			resp, err := c.Do(daemon.Request{Cmd: "held"}, nil)
			if err != nil {
				continue // the next question's lookup reports it
			}
			for _, w := range resp.Withdrawn {
				if w.ID == id {
					return "", &w, false
				}
			}
		}
	}
}

// stdin is where watch reads its answers (tests replace it).
var stdin io.Reader = os.Stdin

// nextQuestion returns the oldest question not shown yet.
func nextQuestion(e *env, stateDir, id string, seen map[string]bool) (daemon.HeldEffect, daemon.Client, bool, error) {
	cs, err := clients(stateDir, id)
	if err != nil {
		return daemon.HeldEffect{}, daemon.Client{}, false, err
	}
	for _, c := range cs {
		resp, err := c.Do(daemon.Request{Cmd: "held"}, nil)
		if skipDead(e, "watch", id, c, err) {
			continue
		}
		if err != nil {
			return daemon.HeldEffect{}, daemon.Client{}, false, fmt.Errorf("sandbox %s: %w", c.ID(), err)
		}
		for _, h := range resp.Held {
			k := fmt.Sprintf("%s/%d", c.ID(), h.ID)
			if h.Pending && !seen[k] {
				seen[k] = true
				return h, c, true, nil
			}
		}
	}
	return daemon.HeldEffect{}, daemon.Client{}, false, nil
}
