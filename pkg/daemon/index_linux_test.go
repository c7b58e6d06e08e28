package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// Two live runs never share a sandbox id: the second would take the
// first's cgroup, pins and chains for a crashed run's and remove them.
func TestClaimIndexRefusesALiveID(t *testing.T) {
	testutil.RequireRoot(t)
	id := testutil.UniqueName("x")
	unlock, _, err := claimIndex(t.TempDir(), id)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = claimIndex(t.TempDir(), id)
	if err == nil || !strings.Contains(err.Error(), "sandbox id "+id+" is in use by another carbd") {
		t.Fatalf("second claim of %s while the first is live: %v", id, err)
	}
	other, _, err := claimIndex(t.TempDir(), id+"o")
	if err != nil {
		t.Fatalf("another id: %v", err)
	}
	if err := other(); err != nil {
		t.Fatal(err)
	}
	lockFile := filepath.Join(IndexDir, "id-"+id+".lock")
	if _, err := os.Stat(lockFile); err != nil {
		t.Fatalf("a live run's id lock: %v", err)
	}
	if err := unlock(); err != nil {
		t.Fatal(err)
	}
	// An ended run leaves no lock file (a crashed one does, for carbd
	// cleanup); one file per run was kept forever before.
	if _, err := os.Stat(lockFile); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an ended run's id lock file: %v", err)
	}
	again, _, err := claimIndex(t.TempDir(), id)
	if err != nil {
		t.Fatalf("the id once its run ended: %v", err)
	}
	if err := again(); err != nil {
		t.Fatal(err)
	}
}
