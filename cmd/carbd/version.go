package main

import (
	"context"
	"fmt"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the build's version", run: runVersion})
}

func runVersion(_ context.Context, e *env, _ []string) error {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	fmt.Fprintln(e.stdout, "carbd", v)
	return nil
}
