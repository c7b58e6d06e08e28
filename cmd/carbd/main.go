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
	"strings"
	"syscall"

	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// command is one subcommand. Each lives in its own file and registers
// itself from init, so adding one touches no shared list.
type command struct {
	name    string
	summary string
	// forms are the command's own subcommands (policy check, eval
	// agentdojo), for help, completions and the man page; formsOptional
	// when the command alone is a form too (calib --fields).
	forms         []form
	formsOptional bool
	run           func(ctx context.Context, env *env, args []string) error
}

type form struct{ name, summary string }

// formNames lists a command's forms for messages: "check or show".
func (c *command) formNames() string {
	names := make([]string, len(c.forms))
	for i, f := range c.forms {
		names[i] = f.name
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// formsHelp writes a command's forms.
func (c *command) formsHelp(w io.Writer) {
	fmt.Fprintf(w, "usage: carbd %s FORM [FLAGS] [ARGS]\n\n%s\n\nforms:\n", c.name, c.summary)
	for _, f := range c.forms {
		fmt.Fprintf(w, "  %-10s %s\n", f.name, f.summary)
	}
	fmt.Fprintf(w, "\nRun 'carbd %s FORM --help' for a form's flags.\n", c.name)
}

// env is what a subcommand gets from main: its streams and logger.
type env struct {
	stdout, stderr io.Writer
	log            *slog.Logger
	// fs is the flag set the command parsed its arguments with, and
	// synopsis its usage line: main prints its help on -h (to stdout)
	// and its hint on a usage error.
	fs       *flag.FlagSet
	synopsis string
	// misused is set when the flag set reported a usage mistake.
	misused bool
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

// run is carbd's command line: help on stdout with status 0, usage
// mistakes on stderr (the error first, then where help is) with status
// 2, other errors with status 1.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr,
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "carbd: a command is required")
		fmt.Fprintln(stderr, "Run 'carbd --help' for the commands.")
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		// carbd help CMD [FORM] is carbd CMD [FORM] --help.
		args = append(args[1:len(args):len(args)], "--help")
	case "-version", "--version":
		args = []string{"version"}
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "carbd: unknown command %q\n", args[0])
		if s := suggest(args[0]); s != "" {
			fmt.Fprintf(stderr, "Did you mean 'carbd %s'?\n", s)
		}
		fmt.Fprintln(stderr, "Run 'carbd --help' for the commands.")
		return 2
	}
	var err error
	switch {
	case len(c.forms) > 0 && !c.formsOptional && len(args) == 1:
		err = fmt.Errorf("%w: a subcommand is required (%s)", errUsage, c.formNames())
	case len(c.forms) > 0 && !c.formsOptional && isHelp(args[1]):
		c.formsHelp(stdout)
		return 0
	default:
		err = c.run(ctx, e, args[1:])
	}
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		e.help(stdout)
		return 0
	case errors.Is(err, errUsage) || e.misused:
		name := c.name
		if e.fs != nil {
			name = strings.TrimPrefix(e.fs.Name(), "carbd ")
		}
		fmt.Fprintf(stderr, "carbd %s: %s\n", name, strings.TrimPrefix(err.Error(), "usage: "))
		fmt.Fprintf(stderr, "Run 'carbd %s --help' for its flags.\n", name)
		return 2
	default:
		fmt.Fprintf(stderr, "carbd %s: %v\n", c.name, err)
		return 1
	}
}

func isHelp(a string) bool {
	return a == "-h" || a == "-help" || a == "--help" || a == "help"
}

// suggest returns the command nearest to a mistyped name, if one is near.
func suggest(name string) string {
	best, bestD := "", 3
	for n := range commands {
		if d := editDistance(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: carbd COMMAND [FLAGS] [ARGS]\n\ncommands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'carbd COMMAND --help' for a command's flags, 'carbd --version' for the build.")
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newFlagSet returns a FlagSet for a subcommand that reports errors
// instead of exiting. It prints nothing itself: main prints the help on
// -h/--help (stdout) and a one-line hint after a usage error (stderr). A
// command may still call fs.Usage() to mark its own usage error.
func newFlagSet(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("carbd "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() { e.misused = true }
	e.fs, e.synopsis = fs, synopsis
	return fs
}

// help writes the parsed command's usage and flags.
func (e *env) help(w io.Writer) {
	if e.fs == nil {
		usage(w)
		return
	}
	fmt.Fprintf(w, "usage: %s %s\n", e.fs.Name(), e.synopsis)
	n := 0
	e.fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		e.fs.SetOutput(w)
		e.fs.PrintDefaults()
		e.fs.SetOutput(io.Discard)
	}
}

// noArgs refuses positional arguments to a command that takes none.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	return nil
}
