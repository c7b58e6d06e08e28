package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
)

// needs reports why a suite's build tags cannot be used here, or nil.
func needs(s suite) error {
	if s.Needs == nil {
		return nil
	}
	return s.Needs()
}

// needHyperscan: the hyperscan tag builds a cgo shim over Debian's
// libhyperscan-dev (pkg/decide/match/hsbench): it needs the library's
// header, cgo and a C compiler.
func needHyperscan() error {
	if _, err := os.Stat("/usr/include/hs/hs.h"); err != nil {
		return errors.New("libhyperscan-dev is not installed (make setup installs it), so Hyperscan is not compared")
	}
	if os.Getenv("CGO_ENABLED") == "0" {
		return errors.New("CGO_ENABLED=0, so Hyperscan is not compared")
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return fmt.Errorf("no C compiler (%s) for cgo, so Hyperscan is not compared", cc)
	}
	return nil
}
