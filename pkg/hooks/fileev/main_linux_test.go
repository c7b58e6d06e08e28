//go:build linux

package fileev

import (
	"os"
	"testing"
)

const helperEnv = "FILEEV_HELPER"

func TestMain(m *testing.M) {
	if script := os.Getenv(helperEnv); script != "" {
		os.Exit(runHelper(script))
	}
	os.Exit(m.Run())
}
