package staging

import (
	"bytes"
	"testing"
)

// TestRegionWriter: the bytes Event shows are cut from the stream it
// hashes, whatever the sizes of the reads that make the stream.
func TestRegionWriter(t *testing.T) {
	data := make([]byte, 1000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, tc := range []struct{ start, n, chunk int }{
		{0, 0, 10}, {0, 1000, 1000}, {0, 1000, 7}, {3, 10, 1}, {3, 10, 4}, {990, 10, 64},
		{500, 200, 256}, {999, 1, 3}, {100, 0, 50}, {0, 300, 1000},
	} {
		w := &regionWriter{buf: make([]byte, tc.n), start: int64(tc.start)}
		for off := 0; off < len(data); off += tc.chunk {
			p := data[off:min(off+tc.chunk, len(data))]
			if k, err := w.Write(p); k != len(p) || err != nil {
				t.Fatalf("%+v: Write = %d, %v", tc, k, err)
			}
		}
		if w.got != int64(tc.n) || !bytes.Equal(w.buf, data[tc.start:tc.start+tc.n]) {
			t.Errorf("%+v: kept %d bytes %v, want %v", tc, w.got, w.buf, data[tc.start:tc.start+tc.n])
		}
	}
	// A stream shorter than the region keeps what it had.
	w := &regionWriter{buf: make([]byte, 10), start: 995}
	w.Write(data)
	if w.got != 5 {
		t.Errorf("short stream: kept %d bytes, want 5", w.got)
	}
}
