package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// World is what demo worlds have on the host (carbd cleanup): the host
// links and namespaces of worlds, and whether a demo is running (it
// holds worldLock; the world is then its own).
type World struct {
	Links, Namespaces []string
	Live              bool
}

// Worlds lists the demo worlds' resources on the host.
func Worlds() (World, error) {
	var w World
	var err error
	if w.Links, w.Namespaces, err = worldParts(); err != nil {
		return w, err
	}
	unlock, ok, err := tryWorldLock(false)
	if err != nil {
		return w, err
	}
	if ok {
		unlock()
	}
	w.Live = !ok
	return w, nil
}

// RemoveStaleWorlds removes what demo worlds left on the host unless a
// demo is running, holding worldLock as a demo's start does (a demo
// starting meanwhile waits). removed is false when a demo runs.
func RemoveStaleWorlds() (removed bool, err error) {
	unlock, ok, err := tryWorldLock(true)
	if err != nil || !ok {
		return false, err
	}
	defer unlock()
	if err := removeStaleWorlds(); err != nil {
		return false, err
	}
	return true, nil
}

// tryWorldLock takes worldLock if no demo holds it. Without create, no
// lock file means no demo ever ran here (nothing is created to look).
func tryWorldLock(create bool) (unlock func(), ok bool, err error) {
	flags := os.O_RDWR
	if create {
		if err := os.MkdirAll(filepath.Dir(worldLock), 0o755); err != nil {
			return nil, false, fmt.Errorf("demo world lock: %w", err)
		}
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(worldLock, flags, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("demo world lock: %w", err)
	}
	err = flock(f, unix.LOCK_EX|unix.LOCK_NB)
	if err == unix.EWOULDBLOCK {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("demo world lock %s: %w", worldLock, err)
	}
	return func() { f.Close() }, true, nil
}
