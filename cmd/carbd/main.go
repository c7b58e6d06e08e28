// Command carbd is the enforcement layer for AI agents in sandboxes: the
// daemon (carbd run), the operator CLI, and the offline replay,
// calibration and evaluation commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// command is one subcommand. Each lives in its own file and registers
// itself from init, so adding one touches no shared list.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what a subcommand gets from main: its streams and logger.
type env struct {
	stdout, stderr io.Writer
	log            *slog.Logger
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("carbd: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

// exitError carries an exit status through run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// errUsage marks a command-line mistake: exit status 2.
var errUsage = errors.New("usage")

func main() {
	// A re-executed carbd that is a sandbox's init never returns from here.
	netns.Init()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr,
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "carbd: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := c.run(ctx, e, args[1:])
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "carbd %s: %v\n", c.name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "carbd %s: %v\n", c.name, err)
		return 1
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: carbd COMMAND [FLAGS] [ARGS]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'carbd COMMAND -h' for a command's flags.")
}

// newFlagSet returns a FlagSet for a subcommand that reports errors
// instead of exiting, writing its usage to the command's stderr.
func newFlagSet(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("carbd "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: carbd %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}
