//go:build linux && amd64

package fileev

import (
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
)

// TestWakeupBytesOnce: with nobody reading the ring, the record that takes
// the unread bytes over Config.WakeupBytes forces a wake-up, and the
// records after it, while the bytes stay over, do not (each forced
// wake-up is a self-IPI in the traced process; a reader behind is awake
// already). The interval is an hour, so no wake-up here is the
// interval's. It fails when every record over the threshold wakes.
func TestWakeupBytesOnce(t *testing.T) {
	testutil.RequireRoot(t)
	root := mountOverlay(t)
	tr, err := New(Config{Root: root, WakeupInterval: time.Hour, WakeupBytes: 64 << 10, PinDir: testPinDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := startHelper(t, "bench-nofsync", root, nil)
	if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	h.begin(t)
	last := func() uint64 {
		t.Helper()
		v, err := tr.sl.lastWakeup()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// A cycle is five records, two of them carrying 4 KiB: ~10 KB.
	h.send(t, 1)
	before := last()
	h.send(t, 10) // over 64 KiB
	crossed := last()
	if crossed == before {
		t.Fatalf("no wake-up forced when the unread bytes crossed the threshold (last forced wake-up still %d)", before)
	}
	h.send(t, 20) // ~200 KB more, still far from full
	if after := last(); after != crossed {
		t.Errorf("records over the threshold forced wake-ups again: last at %d, crossed at %d", after, crossed)
	}
	if n := tr.Lost(); n != 0 {
		t.Errorf("%d records lost", n)
	}
}
