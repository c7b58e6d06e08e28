package demo

import (
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// carbd cleanup's view of demo worlds: a world namespace left by a demo
// is listed; it is live (not removed) while a demo holds the world lock,
// and removed once none does.
func TestStaleWorlds(t *testing.T) {
	testutil.RequireRoot(t)
	// Wait for any demo of another test, then hold the lock as a running
	// demo does.
	unlock, err := lockWorld(func() {})
	if err != nil {
		t.Fatal(err)
	}
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	ns := "carbd-demo-" + testutil.UniqueName("t")
	testutil.Run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })

	w, err := Worlds()
	if err != nil {
		t.Fatal(err)
	}
	if !w.Live || !slices.Contains(w.Namespaces, ns) {
		t.Fatalf("with the world lock held: %+v; want %s listed, live", w, ns)
	}
	if removed, err := RemoveStaleWorlds(); err != nil || removed {
		t.Fatalf("removal while a demo holds the lock: removed %v, %v", removed, err)
	}
	if _, err := os.Stat("/run/netns/" + ns); err != nil {
		t.Fatalf("the live world's namespace: %v", err)
	}
	unlock()
	locked = false

	if w, err = Worlds(); err != nil {
		t.Fatal(err)
	}
	if w.Live || !slices.Contains(w.Namespaces, ns) {
		t.Fatalf("with no demo: %+v; want %s listed, stale", w, ns)
	}
	if removed, err := RemoveStaleWorlds(); err != nil || !removed {
		t.Fatalf("removal with no demo: removed %v, %v", removed, err)
	}
	if _, err := os.Stat("/run/netns/" + ns); !os.IsNotExist(err) {
		t.Errorf("the stale world's namespace after removal: %v", err)
	}
}
