package respwatch

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/google/go-cmp/cmp"
)

// The addresses and pages of TestCaptureReal; its capture, kept in
// testdata/responses.pcapng, is replayed here without root.
const (
	worldAddr4 = "10.79.0.1"
	guestAddr4 = "10.79.0.2"
	worldAddr6 = "fd79::1"
	guestAddr6 = "fd79::2"

	pageBody    = "<html><body><p>Invoice due. Pay to <a href=\"http://pay.evil.example/iban?to=DE44500105175407324931\">this account</a>.</p></body></html>\n"
	chunkedBody = "part one: api key sk_live_4eC39HqLyjWDarjtT1zdp7dc\npart two\npart three\n"
	redirect    = "<a href=\"/page\">Found</a>.\n\n"
)

var (
	gzipBody = strings.Repeat("compressible line with a token tok_9f8e7d6c5b4a\n", 200)
	bigBody  = func() string {
		var b strings.Builder
		for i := 0; b.Len() < 300_000; i++ {
			fmt.Fprintf(&b, "line %06d: the quick brown fox jumps over the lazy dog\n", i)
		}
		return b.String()[:300_000]
	}()
)

// realExpect is what the capture's responses must give, in order.
var realExpect = []evSummary{
	{Op: OpResponse, Obj: "http://web.test:8080/page", Source: "fetch:web.test:8080/page", Content: pageBody},
	{Op: OpResponse, Obj: "http://web.test:8080/chunked", Source: "fetch:web.test:8080/chunked", Content: chunkedBody},
	{Op: OpResponse, Obj: "http://web.test:8080/gzip", Source: "fetch:web.test:8080/gzip", Content: gzipBody},
	{Op: OpResponse, Obj: "http://web.test:8080/big", Source: "fetch:web.test:8080/big", Content: bigBody},
	{Op: OpResponseHeaders, Obj: "http://web.test:8080/cookie", Source: "fetch:web.test:8080/cookie",
		Content: "Location: /page\nSet-Cookie: session=s3ss10n-t0k3n-42; Path=/\n"},
	{Op: OpResponse, Obj: "http://web.test:8080/cookie", Source: "fetch:web.test:8080/cookie", Content: redirect},
	{Op: OpResponse, Obj: "http://[fd79::1]:8080/page", Source: "fetch:[fd79::1]:8080/page", Content: pageBody},
	{Op: OpTLS, Obj: "secure.test:8443", Source: "fetch:secure.test:8443", Opaque: true},
	{Op: OpResponse, Obj: "http://web.test:8080/p/one", Source: "fetch:web.test:8080/p/one", Content: "pipelined one"},
	{Op: OpResponse, Obj: "http://web.test:8080/p/two", Source: "fetch:web.test:8080/p/two", Content: "pipelined two"},
}

// checkReal checks the events of the real traffic.
func checkReal(t *testing.T, evs []decide.Event, st Stats) {
	t.Helper()
	got := summarize(evs)
	// Compare long contents by length and prefix in the diff.
	short := func(s []evSummary) []evSummary {
		out := append([]evSummary(nil), s...)
		for i := range out {
			if len(out[i].Content) > 200 {
				out[i].Content = fmt.Sprintf("%d bytes: %.60q... sum %d", len(out[i].Content), out[i].Content, sum(out[i].Content))
			}
		}
		return out
	}
	if d := cmp.Diff(short(realExpect), short(got)); d != "" {
		t.Fatalf("-want +got\n%s", d)
	}
	web := decide.Dest{Host: "web.test", Addr: netip.MustParseAddr(worldAddr4), Port: 8080, Proto: "tcp"}
	for _, i := range []int{0, 1, 2, 3, 5, 8, 9} {
		if evs[i].Dest == nil || *evs[i].Dest != web {
			t.Errorf("event %d dest %+v, want %+v", i, evs[i].Dest, web)
		}
	}
	if e, _ := field(&evs[2], FieldEncoding); e != "gzip" {
		t.Errorf("gzip event's encoding field %q", e)
	}
	if s, _ := field(&evs[5], FieldStatus); s != "302" {
		t.Errorf("redirect status %q", s)
	}
	if st.Desyncs != 0 || st.LostBytes != 0 || st.Opaque != 1 || st.Unpaired != 0 {
		t.Errorf("stats %+v", st)
	}
}

func sum(s string) (n int) {
	for i := 0; i < len(s); i++ {
		n = n*31 + int(s[i])
	}
	return n
}

// readPcapng reads the frames and directions of a pcapng file written by
// pkg/hooks/capture (one little-endian section, one interface, Enhanced
// Packet Blocks with epb_flags).
func readPcapng(t testing.TB, path string) []framedAt {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []framedAt
	for off := 0; off < len(b); {
		if off+12 > len(b) {
			t.Fatalf("%s: truncated block at %d", path, off)
		}
		typ := binary.LittleEndian.Uint32(b[off:])
		n := int(binary.LittleEndian.Uint32(b[off+4:]))
		if n < 12 || off+n > len(b) {
			t.Fatalf("%s: block length %d at %d", path, n, off)
		}
		blk := b[off : off+n]
		off += n
		if typ != 6 {
			continue
		}
		ts := uint64(binary.LittleEndian.Uint32(blk[12:]))<<32 | uint64(binary.LittleEndian.Uint32(blk[16:]))
		capLen := int(binary.LittleEndian.Uint32(blk[20:]))
		data := blk[28 : 28+capLen]
		f := framedAt{framed: framed{data: data}, t: time.Unix(0, int64(ts))}
		for o := 28 + (capLen+3)&^3; o+4 <= len(blk)-4; {
			code := binary.LittleEndian.Uint16(blk[o:])
			l := int(binary.LittleEndian.Uint16(blk[o+2:]))
			if code == 0 {
				break
			}
			if code == 2 && l == 4 {
				switch binary.LittleEndian.Uint32(blk[o+4:]) & 3 {
				case 1:
					f.dir = capture.Egress
				case 2:
					f.dir = capture.Ingress
				}
			}
			o += 4 + (l+3)&^3
		}
		out = append(out, f)
	}
	return out
}

type framedAt struct {
	framed
	t time.Time
}

func replay(t testing.TB, tr *Tracker, frames []framedAt) []decide.Event {
	var evs []decide.Event
	for _, f := range frames {
		evs = append(evs, tr.Feed(f.t, f.data, f.dir).Events...)
	}
	return evs
}

func TestReplayCapture(t *testing.T) {
	frames := readPcapng(t, "testdata/responses.pcapng")
	tr := newTracker(t, Config{})
	evs := replay(t, tr, frames)
	checkReal(t, evs, tr.Stats())
	if st := tr.Stats(); st.Undecoded != 0 || st.Truncated != 0 {
		t.Errorf("stats %+v", st)
	}
}

// bigFrames returns the indexes of the frames that carry /big's response.
func bigFrames(t *testing.T, frames []framedAt) []int {
	var out []int
	var p pkt
	in := false
	for i, f := range frames {
		if decodeFrame(f.data, &p) != nil || p.proto != protoTCP {
			continue
		}
		if f.dir == capture.Egress && strings.HasPrefix(string(p.payload), "GET ") {
			in = strings.HasPrefix(string(p.payload), "GET /big ")
		}
		if in && f.dir == capture.Ingress && len(p.payload) > 0 {
			out = append(out, i)
		}
	}
	if len(out) < 3 {
		t.Fatalf("the capture has %d frames of /big's response", len(out))
	}
	return out
}

// TestReplayReordered shuffles the frames of a real 300 kB response and
// repeats one, as a network that reorders and retransmits would deliver
// them. The guest's acknowledgements inside the response are left out:
// with the segments reordered, it would have acknowledged only up to the
// first hole (duplicate ACKs), never bytes it had not received.
func TestReplayReordered(t *testing.T) {
	frames := readPcapng(t, "testdata/responses.pcapng")
	idx := bigFrames(t, frames)
	first, last := idx[0], idx[len(idx)-1]
	for seed := uint64(1); seed <= 5; seed++ {
		rng := rand.New(rand.NewPCG(seed, 1))
		moved := append([]framedAt(nil), frames[:first]...)
		for _, j := range rng.Perm(len(idx)) {
			moved = append(moved, frames[idx[j]])
		}
		moved = append(moved, frames[idx[rng.IntN(len(idx))]]) // a retransmission
		for i := first; i <= last; i++ {
			if frames[i].dir != capture.Egress {
				continue
			}
			var p pkt
			if decodeFrame(frames[i].data, &p) == nil && len(p.payload) > 0 {
				t.Fatalf("frame %d: the guest sent data during the response", i)
			}
		}
		moved = append(moved, frames[last+1:]...)
		tr := newTracker(t, Config{})
		checkReal(t, replay(t, tr, moved), tr.Stats())
		if tr.Stats().OOODropped != 0 {
			t.Errorf("seed %d: %d segments dropped", seed, tr.Stats().OOODropped)
		}
	}
}

// TestReplayLoss drops one frame of the real 300 kB response (as a full
// queue would): that response is reported opaque with what came before
// the hole, everything else is unchanged.
func TestReplayLoss(t *testing.T) {
	frames := readPcapng(t, "testdata/responses.pcapng")
	idx := bigFrames(t, frames)
	drop := idx[len(idx)/2]
	lossy := append(append([]framedAt(nil), frames[:drop]...), frames[drop+1:]...)
	tr := newTracker(t, Config{})
	evs := replay(t, tr, lossy)
	if len(evs) != len(realExpect) {
		t.Fatalf("%d events: %+v", len(evs), summarize(evs))
	}
	big := evs[3]
	if !big.Opaque || big.Obj != "http://web.test:8080/big" || len(big.Content) == 0 || !strings.HasPrefix(bigBody, big.Content) || len(big.Content) >= len(bigBody) {
		t.Fatalf("/big after a loss: opaque %v, %d bytes", big.Opaque, len(big.Content))
	}
	for i, want := range realExpect {
		if i == 3 {
			continue
		}
		if got := summarize(evs[i : i+1])[0]; got != want {
			t.Errorf("event %d changed by a loss elsewhere: %+v", i, got)
		}
	}
	if tr.Stats().LostBytes == 0 {
		t.Error("no lost bytes counted")
	}
}
