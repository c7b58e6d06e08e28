package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/carbd/carbd/pkg/decide"
)

func init() {
	register(&command{name: "policy", summary: "check or show policy files (policy check FILE...)", forms: []form{
		{"check", "parse and validate policy files: each one's summary, or every error as FILE:LINE:COL: FIELD: MESSAGE (exit 1 when one is invalid)"},
		{"show", "print the policy as it compiled, in canonical form"}}, run: runPolicy})
}

func runPolicy(ctx context.Context, e *env, args []string) error {
	switch args[0] {
	case "check":
		return runPolicyCheck(ctx, e, args[1:])
	case "show":
		return runPolicyShow(ctx, e, args[1:])
	}
	return fmt.Errorf("%w: unknown subcommand %q (want check or show)", errUsage, args[0])
}

func parsePolicyFlags(e *env, name, synopsis string, args []string) (*flag.FlagSet, error) {
	fs := newFlagSet(e, name, synopsis)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return fs, nil
}

// reportPolicyError writes a policy's errors to w: one located error per
// line, or the single error of a file that could not be read.
func reportPolicyError(w io.Writer, err error) {
	var list decide.PolicyErrors
	if errors.As(err, &list) {
		for _, pe := range list {
			fmt.Fprintln(w, pe.Error())
		}
		return
	}
	fmt.Fprintln(w, err.Error())
}

func runPolicyCheck(_ context.Context, e *env, args []string) error {
	fs, err := parsePolicyFlags(e, "policy check", "FILE...", args)
	if err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: no policy file given", errUsage)
	}
	bad := 0
	for i, file := range fs.Args() {
		pol, err := decide.LoadPolicy(file)
		if err != nil {
			reportPolicyError(e.stderr, err)
			bad++
			continue
		}
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		fmt.Fprint(e.stdout, pol.Summary())
	}
	if bad > 0 {
		if fs.NArg() > 1 {
			fmt.Fprintf(e.stderr, "carbd policy check: %d of %d files invalid\n", bad, fs.NArg())
		}
		return exitError{code: 1}
	}
	return nil
}

func runPolicyShow(_ context.Context, e *env, args []string) error {
	fs, err := parsePolicyFlags(e, "policy show", "FILE", args)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one policy file", errUsage)
	}
	pol, err := decide.LoadPolicy(fs.Arg(0))
	if err != nil {
		reportPolicyError(e.stderr, err)
		return exitError{code: 1}
	}
	out, err := pol.YAML()
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "# %s as compiled by carbd (canonical form)\n", fs.Arg(0))
	_, err = e.stdout.Write(out)
	return err
}
