package staging

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/testutil"
)

// BenchmarkFileCycle measures one 4 KiB create/write/fsync/read/unlink
// cycle on the staged merged view M, on a plain overlayfs (default
// options, lower = the directory itself), on ext4 (the test's temporary
// directory) and on tmpfs, in the same run. (The eBPF file tracing adds
// its cost on top of "staged"; it is measured with the tracer.)
func BenchmarkFileCycle(b *testing.B) {
	testutil.RequireRoot(b)
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i)
	}
	run := func(b *testing.B, dir string) {
		buf := make([]byte, 4096)
		p := filepath.Join(dir, "bench")
		b.SetBytes(4096)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := unix.Write(fd, data); err != nil {
				b.Fatal(err)
			}
			if err := unix.Fsync(fd); err != nil {
				b.Fatal(err)
			}
			if n, err := unix.Pread(fd, buf, 0); err != nil || n != len(buf) {
				b.Fatal(n, err)
			}
			unix.Close(fd)
			if err := unix.Unlink(p); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("staged", func(b *testing.B) {
		base := b.TempDir()
		w := filepath.Join(base, "w")
		must(b, os.Mkdir(w, 0o755))
		st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
		must(b, err)
		defer st.Close()
		must(b, st.Mount())
		defer st.Unmount()
		run(b, st.Layout().Merged)
	})
	b.Run("overlay", func(b *testing.B) {
		base := b.TempDir()
		for _, d := range []string{"lower", "upper", "work", "merged"} {
			must(b, os.Mkdir(filepath.Join(base, d), 0o755))
		}
		m := filepath.Join(base, "merged")
		must(b, unix.Mount("overlay", m, "overlay", 0, fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work", base, base, base)))
		defer unix.Unmount(m, unix.MNT_DETACH)
		run(b, m)
	})
	b.Run("ext4", func(b *testing.B) {
		run(b, b.TempDir())
	})
	b.Run("tmpfs", func(b *testing.B) {
		d := b.TempDir()
		must(b, unix.Mount("tmpfs", d, "tmpfs", 0, "size=16m"))
		defer unix.Unmount(d, unix.MNT_DETACH)
		run(b, d)
	})
}

// BenchmarkCommit measures commit throughput: each iteration stages
// files through M (not timed) and commits them (timed).
func BenchmarkCommit(b *testing.B) {
	testutil.RequireRoot(b)
	for _, tc := range []struct {
		files, size int
	}{{1000, 4 << 10}, {4, 16 << 20}} {
		b.Run(fmt.Sprintf("%dx%dKiB", tc.files, tc.size>>10), func(b *testing.B) {
			base := b.TempDir()
			w := filepath.Join(base, "w")
			must(b, os.Mkdir(w, 0o755))
			st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
			must(b, err)
			defer st.Close()
			must(b, st.Mount())
			defer st.Unmount()
			data := make([]byte, tc.size)
			for i := range data {
				data[i] = byte(i * 7)
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				dir := filepath.Join(st.Layout().Merged, "it"+strconv.Itoa(i))
				must(b, os.Mkdir(dir, 0o755))
				for f := 0; f < tc.files; f++ {
					must(b, os.WriteFile(filepath.Join(dir, strconv.Itoa(f)), data, 0o644))
				}
				b.StartTimer()
				res, err := st.Commit(ctx, nil)
				if err != nil || res.Applied != tc.files+1 {
					b.Fatalf("commit: %v %+v", err, res)
				}
			}
			b.StopTimer()
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(tc.files*b.N)/secs, "files/s")
			b.ReportMetric(float64(tc.files*tc.size*b.N)/secs/1e6, "MB/s")
		})
	}
}

// BenchmarkScan measures the time and memory of scanning a scope with
// many staged files. CARBD_BENCH_SCAN_FILES sets the count (default
// 20000; the figure is 1000000).
func BenchmarkScan(b *testing.B) {
	testutil.RequireRoot(b)
	n := 20000
	if v := os.Getenv("CARBD_BENCH_SCAN_FILES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CARBD_BENCH_SCAN_FILES=%q: %v", v, err)
		}
	}
	base := b.TempDir()
	w := filepath.Join(base, "w")
	must(b, os.Mkdir(w, 0o755))
	st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s")})
	must(b, err)
	defer st.Close()
	// The staged files are written straight into U before mounting:
	// to the scan they are what a guest's new files are.
	up := st.Layout().Upper
	for i := 0; i < n; i++ {
		dir := filepath.Join(up, "d"+strconv.Itoa(i/1000))
		if i%1000 == 0 {
			must(b, os.Mkdir(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), []byte("staged file number "+strconv.Itoa(i)), 0o644))
	}
	must(b, st.Mount())
	defer st.Unmount()
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	ctx := context.Background()
	var peak uint64
	runtime.GC()
	metrics.Read(sample)
	baseHeap := sample[0].Value.Uint64()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		count := 0
		err := st.Scan(ctx, func(c Change) error {
			count++
			if count%1000 == 0 {
				metrics.Read(sample)
				if h := sample[0].Value.Uint64(); h > peak {
					peak = h
				}
			}
			return nil
		})
		if err != nil || count != n+(n+999)/1000 {
			b.Fatalf("scan: %v, %d changes", err, count)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n), "files")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/file")
	b.ReportMetric(float64(peak-min(peak, baseHeap))/1e6, "peak-heap-MB")
}

// BenchmarkOpenBase measures building the frozen base B (the hard-link
// farm of W) at session start, for a W of CARBD_BENCH_BASE_FILES files
// (default 20000) in directories of 1000.
func BenchmarkOpenBase(b *testing.B) {
	testutil.RequireRoot(b)
	n := 20000
	if v := os.Getenv("CARBD_BENCH_BASE_FILES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CARBD_BENCH_BASE_FILES=%q: %v", v, err)
		}
	}
	base := b.TempDir()
	w := filepath.Join(base, "w")
	must(b, os.Mkdir(w, 0o755))
	for i := 0; i < n; i++ {
		dir := filepath.Join(w, "d"+strconv.Itoa(i/1000))
		if i%1000 == 0 {
			must(b, os.Mkdir(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), []byte("x"), 0o644))
	}
	unix.Sync() // W is on disk before a session starts
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := Open(Config{WorkDir: w, StateDir: filepath.Join(base, "s"+strconv.Itoa(i))})
		if err != nil {
			b.Fatal(err)
		}
		st.Close()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/file")
}

// BenchmarkNextRun measures what a new run costs at its start: the
// finished run's layers discarded and a fresh base with its stamps built,
// for a W of CARBD_BENCH_BASE_FILES files (default 20000).
func BenchmarkNextRun(b *testing.B) {
	testutil.RequireRoot(b)
	n := 20000
	if v := os.Getenv("CARBD_BENCH_BASE_FILES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("CARBD_BENCH_BASE_FILES=%q: %v", v, err)
		}
	}
	base := b.TempDir()
	w := filepath.Join(base, "w")
	must(b, os.Mkdir(w, 0o755))
	for i := 0; i < n; i++ {
		dir := filepath.Join(w, "d"+strconv.Itoa(i/1000))
		if i%1000 == 0 {
			must(b, os.Mkdir(dir, 0o755))
		}
		must(b, os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), []byte("x"), 0o644))
	}
	cfg := Config{WorkDir: w, StateDir: filepath.Join(base, "state"), LayerDir: filepath.Join(base, "layers")}
	st, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	unix.Sync()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := st.Finish(context.Background(), nil); err != nil {
			b.Fatal(err)
		}
		st.Close()
		if st, err = Open(cfg); err != nil {
			b.Fatal(err)
		}
		if !st.Fresh() {
			b.Fatal("not a fresh base")
		}
	}
	b.StopTimer()
	st.Close()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/file")
}
