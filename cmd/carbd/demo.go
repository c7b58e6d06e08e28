package main

import (
	"context"

	"github.com/carbd/carbd/internal/demo"
)

func init() {
	register(&command{name: "demo", summary: "run the demo: an injected agent tries to leak a key; carbd stops it", run: runDemo})
}

func runDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "demo", "[--keep]")
	keep := fs.Bool("keep", false, "keep the demo's working directory for inspection")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	res, err := demo.Run(ctx, demo.Options{Out: e.stdout, Keep: *keep})
	if err != nil {
		return err
	}
	res.Cleanup()
	return nil
}
