//go:build !linux

package netnsx

import (
	"errors"
	"path/filepath"
)

// RunDir is where ip-netns(8) keeps named namespaces.
const RunDir = "/run/netns"

// Do runs fn in place when path is empty; network namespaces exist only
// on Linux.
func Do(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return errors.New("netnsx: network namespaces need linux")
}

// DoNamed runs fn inside the named namespace under RunDir.
func DoNamed(name string, fn func() error) error {
	return Do(filepath.Join(RunDir, name), fn)
}
