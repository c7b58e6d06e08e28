package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

func init() {
	register(&command{name: "version", summary: "print the build's version (module version, VCS revision, Go)", run: runVersion})
}

// buildVersion describes the binary from its build information: the
// module version (a pseudo-version derived from the VCS when built from
// a checkout), the revision and whether the tree was modified.
func buildVersion() (version, revision string, modified bool) {
	version = "(unknown)"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return
}

func runVersion(_ context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "version", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := noArgs(fs); err != nil {
		return err
	}
	v, rev, mod := buildVersion()
	fmt.Fprintf(e.stdout, "carbd %s", v)
	if rev != "" {
		fmt.Fprintf(e.stdout, " revision %s", rev)
		if mod {
			fmt.Fprint(e.stdout, " (modified)")
		}
	}
	fmt.Fprintf(e.stdout, " %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
