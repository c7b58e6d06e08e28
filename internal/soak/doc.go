// Package soak is carbd's soak harness: many consecutive `carbd run`
// sessions (the real binary, the netns backend) in one git working
// directory, each running a scripted coding agent (sh, python3, git,
// curl; no model) while a "person" edits and commits the same repository
// on the host between and during the runs. It measures what accumulates
// per run on the host and in the working directory's carbd state, and
// checks that nothing the person did is silently overwritten, every
// released agent change is in the working directory (or its conflict is
// reported), and no refused effect reaches the world or the repository.
//
// # What it needs
//
// Root, the netns backend's kernel features (see docs/network.md and
// docs/staging.md), git, python3 and curl. The test is behind the build
// tag soak, so `make test` does not run it:
//
//	go test -tags soak -count=1 -timeout 0 -v ./internal/soak -soak.runs 200
//
// It writes soak.csv (one row per run) and summary.md (growth per run
// fitted by least squares, with its standard error) to -soak.out. The
// fit and the measurements are ordinary code with their own tests.
//
// docs/soak.md has the harness's design and its latest figures.
package soak
