package intercept

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
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

// wsUnits feeds b to an assembler cut at cut and renders what it returns:
// the decided units (type, payload, big), and every byte it passed or
// still holds (a message in progress, bytes not parsed).
func wsUnits(t *testing.T, b []byte, masked bool, cut int) (units []string, raw []byte) {
	a := &wsAssembler{masked: masked, limit: 64}
	defer func() {
		if a.inMsg && !a.follow {
			raw = append(raw, a.raw...)
		}
		raw = append(raw, a.buf...)
	}()
	for _, part := range [][]byte{b[:cut], b[cut:]} {
		a.write(part)
		for {
			u, ok, err := a.next()
			if err != nil {
				units = append(units, "error")
				return units, raw
			}
			if !ok {
				break
			}
			raw = append(raw, u.raw...)
			if !u.follow {
				if len(u.payload) > 64 && u.typ < 8 {
					t.Fatalf("payload of %d bytes over the limit", len(u.payload))
				}
				units = append(units, fmt.Sprintf("%d %q big=%v", u.typ, u.payload, u.big))
			}
		}
	}
	return units, raw
}

// FuzzWSAssembler: arbitrary bytes through the WebSocket frame assembler,
// whole and cut anywhere: every input byte is passed or held, none twice
// (a control frame inside a fragmented message passes before it), and
// the units it returns do not depend on the cut.
func FuzzWSAssembler(f *testing.F) {
	f.Add(append(append(frame(false, 1, []byte("frag")), frame(true, 9, []byte("p"))...), frame(true, 0, []byte("ment"))...), true, uint16(5))
	f.Add(frame(true, 2, bytes.Repeat([]byte("x"), 200)), true, uint16(100))
	f.Add([]byte{0x81, 0x05, 'h', 'e', 'l', 'l', 'o', 0x88, 0x02, 0x03, 0xe8}, false, uint16(3))
	f.Add([]byte{0x81, 0x7f, 0, 0, 0, 0, 0, 1, 0, 0, 'x'}, false, uint16(10))
	f.Add([]byte("\x01\x8400000000\x89\x8100000"), true, uint16(46))
	f.Fuzz(func(t *testing.T, b []byte, masked bool, c uint16) {
		whole, rawW := wsUnits(t, b, masked, len(b))
		cut, rawC := wsUnits(t, b, masked, int(c)%(len(b)+1))
		w := fmt.Sprint(whole)
		if strings.Contains(w, "error") {
			return
		}
		for _, raw := range [][]byte{rawW, rawC} {
			got, want := slices.Clone(raw), slices.Clone(b)
			slices.Sort(got)
			slices.Sort(want)
			if !bytes.Equal(got, want) {
				t.Fatalf("%d bytes passed or held for an input of %d", len(raw), len(b))
			}
		}
		if w != fmt.Sprint(cut) && !strings.Contains(w, "big=true") {
			t.Fatalf("units depend on the cut:\n%q\n%q", whole, cut)
		}
	})
}
