package intercept

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// framed feeds stream to a fresh framer, cut at the given offsets, and
// renders the effects it returns.
func framed(t *testing.T, stream []byte, cuts []int) []string {
	fr, err := newH1Framer(netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("[2001:db8::1]:443"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	at := 0
	var next int64
	for i := 0; i <= len(cuts); i++ {
		end := len(stream)
		if i < len(cuts) {
			end = cuts[i]
		}
		effs, err := fr.feed(stream[at:end], i == len(cuts))
		at = end
		for _, e := range effs {
			if e.continueHead {
				out = append(out, "100-continue")
				continue
			}
			// Effects follow each other: each starts where the previous
			// one ended (blank lines before a request excepted).
			if e.start < next {
				t.Fatalf("effect at %d overlaps the previous one (ended at %d)", e.start, next)
			}
			if !e.open {
				if e.end <= e.start {
					t.Fatalf("empty effect [%d, %d)", e.start, e.end)
				}
				next = e.end
			}
			if e.ev.Dest == nil || e.ev.Dest.Port != 443 {
				t.Fatalf("event destination %+v", e.ev.Dest)
			}
			out = append(out, fmt.Sprintf("%d-%d open=%v http=%v big=%v %s %s %d", e.start, e.end, e.open, e.http, e.oversized, e.ev.Op, e.ev.Obj, len(e.ev.Fields)))
		}
		if err != nil {
			out = append(out, "error")
			break
		}
	}
	if next > int64(len(stream)) && !strings.Contains(fmt.Sprint(out), "big=true") {
		t.Fatalf("effects end at %d past the stream's %d bytes", next, len(stream))
	}
	return out
}

// FuzzH1Framing feeds arbitrary client streams through the HTTP/1 framing
// adapter (netparse's RequestStream, 100-continue merging, events), whole and cut at
// arbitrary points: effects never overlap nor pass the stream's end, and
// where they are is the same however the stream was cut.
func FuzzH1Framing(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST /x?k=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"), uint16(7), uint16(40))
	f.Add([]byte("POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /n HTTP/1.1\r\nHost: a\r\n\r\n"), uint16(60), uint16(61))
	f.Add([]byte("PUT /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi"), uint16(70), uint16(71))
	f.Add([]byte("GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nraw bytes"), uint16(3), uint16(90))
	f.Add([]byte("\x16\x03\x01not http"), uint16(1), uint16(2))
	f.Fuzz(func(t *testing.T, stream []byte, c1, c2 uint16) {
		if len(stream) > 1<<16 {
			return
		}
		whole := framed(t, stream, nil)
		a, b := int(c1)%(len(stream)+1), int(c2)%(len(stream)+1)
		if a > b {
			a, b = b, a
		}
		cut := framed(t, stream, []int{a, b})
		if fmt.Sprint(whole) != fmt.Sprint(cut) {
			t.Fatalf("cut at %d and %d:\n%q\nwhole:\n%q", a, b, cut, whole)
		}
	})
}

// TestSegmenterRoundTrip: netparse's decoder reads back what the
// segmenter wrote, for both families.
func TestSegmenterRoundTrip(t *testing.T) {
	for _, pair := range [][2]string{{"10.0.0.2:40000", "192.0.2.1:443"}, {"[fd00::2]:40000", "[2001:db8::1]:8443"}, {"10.0.0.2:1", "[2001:db8::1]:443"}} {
		sg := newSegmenter(netip.MustParseAddrPort(pair[0]), netip.MustParseAddrPort(pair[1]))
		fr := sg.frame(true, 12345, 678, tcpACK|tcpPSH, []byte("payload"))
		p, err := netparse.NewDecoder(false).Decode(fr[14:])
		if err != nil {
			t.Fatalf("%v: %v", pair, err)
		}
		if p.SrcAddrPort() != sg.client || p.DstAddrPort() != sg.server || p.Seq != 12345 || string(p.Payload) != "payload" {
			t.Errorf("%v: decoded %v -> %v seq %d %q", pair, p.SrcAddrPort(), p.DstAddrPort(), p.Seq, p.Payload)
		}
	}
}
