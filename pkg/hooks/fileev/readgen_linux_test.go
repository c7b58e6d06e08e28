//go:build linux && amd64

package fileev

import (
	"io"
	"os"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// TestReadGeneration: the kernel side moves the read generation it
// shares with the TC program (a map made by tcx.NewReadGen) once per read
// of a regular file of M, not for writes, opens or reads of a pipe; by
// the time a Sync started after reading the generation returns, the
// records of those reads have been handled.
func TestReadGeneration(t *testing.T) {
	testutil.RequireRoot(t)
	gen, err := tcx.NewReadGen()
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	root := mountOverlay(t)
	tr, col := newTracer(t, Config{Root: root, ReadGen: gen})
	h := startHelper(t, "readloop", root, nil)
	if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	read := func() uint64 {
		t.Helper()
		var g uint64
		if err := gen.Lookup(uint32(0), &g); err != nil {
			t.Fatal(err)
		}
		if tg, err := tr.Generation(); err != nil || tg != g {
			t.Fatalf("tracer reads generation %d (%v), the shared map %d", tg, err, g)
		}
		return g
	}
	g0 := read()
	// The helper creates and writes r.bin and reads its stdin (a pipe).
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.send(t, 0)
	if g := read(); g != g0 {
		t.Errorf("generation moved by %d for a create, a write and pipe reads, want 0", g-g0)
	}
	h.send(t, 25)
	g1 := read()
	if g1-g0 != 25 {
		t.Errorf("generation moved by %d for 25 reads of a file of M, want 25", g1-g0)
	}
	syncTracer(t, tr)
	n := 0
	recs, _ := col.of(h.pid)
	for _, r := range recs {
		if r.Kind == KindSyscall && r.Op == OpRead && r.Path == "r.bin" && r.Ret > 0 {
			n++
		}
	}
	if n != 25 {
		t.Errorf("%d read records handled by the Sync after the generation was read, want 25", n)
	}
}

// TestReadGenerationCountsLosses: a read whose record is lost (the ring
// is full) moves the generation too, and its loss is counted before:
// every read is in the generation, recorded or lost.
func TestReadGenerationCountsLosses(t *testing.T) {
	testutil.RequireRoot(t)
	gen, err := tcx.NewReadGen()
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	root := mountOverlay(t)
	tr, err := New(Config{Root: root, RingBytes: os.Getpagesize(), ReadGen: gen})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := startHelper(t, "readloop", root, nil)
	if _, err := tr.Trace(Target{PID: h.pid}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.send(t, 0)
	g0, err := tr.Generation()
	if err != nil {
		t.Fatal(err)
	}
	lost0 := tr.Lost()
	// Nobody reads the one-page ring: most of the records are lost.
	h.send(t, 2000)
	g1, err := tr.Generation()
	if err != nil {
		t.Fatal(err)
	}
	if lost := tr.Lost() - lost0; lost == 0 {
		t.Fatalf("no loss counted; stats %+v", tr.Stats())
	}
	if g1-g0 != 2000 {
		t.Errorf("generation moved by %d for 2000 reads (%d of them lost), want 2000", g1-g0, tr.Lost()-lost0)
	}
}
