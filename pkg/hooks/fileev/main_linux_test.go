//go:build linux

package fileev

import (
	"os"
	"testing"
)

const helperEnv = "FILEEV_HELPER"

func TestMain(m *testing.M) {
	if dir := os.Getenv(slotHolderEnv); dir != "" {
		os.Exit(runSlotHolder(dir))
	}
	if script := os.Getenv(helperEnv); script != "" {
		os.Exit(runHelper(script))
	}
	os.Exit(m.Run())
}
