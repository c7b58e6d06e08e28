package netparse

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// streamRequests frames stream with a RequestStream written in parts cut
// at the given offsets, and describes the effects as segKey does.
func streamRequests(t testing.TB, port uint16, stream []byte, cuts []int) []string {
	s, err := NewRequestStream(segConfig())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	drain := func() {
		for {
			r := s.Next()
			if r == nil {
				return
			}
			r.Proto, r.Family = ProtoTCP, 4
			r.Src = netip.MustParseAddrPort("10.0.0.2:40000")
			r.Dst = netip.AddrPortFrom(netip.MustParseAddr("10.0.0.9"), port)
			out = append(out, effectString(&r.Effect, r.Start, r.End))
		}
	}
	at := 0
	for _, end := range append(cuts, len(stream)) {
		if end <= at || end > len(stream) {
			continue
		}
		b := stream[at:end]
		for len(b) > 0 {
			n, err := s.Write(b)
			if err != nil && !errors.Is(err, ErrStreamBuffer) {
				t.Fatalf("write: %v", err)
			}
			b = b[n:]
			drain()
		}
		at = end
	}
	s.Close()
	drain()
	if s.Written() != int64(len(stream)) {
		t.Fatalf("written %d of %d bytes", s.Written(), len(stream))
	}
	return out
}

// httpCorpus is the HTTP part of the segmentation corpus.
func httpCorpus(tb testing.TB) (out []struct {
	name   string
	port   uint16
	stream []byte
}) {
	for _, tc := range segCorpus(tb) {
		if tc.port != 53 && tc.stream[0] != 22 {
			out = append(out, tc)
		}
	}
	return out
}

// TestRequestStream: the stream framer gives the packet parser's effects,
// byte ranges included, however its writes are cut.
func TestRequestStream(t *testing.T) {
	for _, tc := range httpCorpus(t) {
		t.Run(tc.name, func(t *testing.T) {
			want := wholeEffects(t, tc.port, tc.stream)
			if got := streamRequests(t, tc.port, tc.stream, nil); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("one write:\nstream: %q\npackets: %q", got, want)
			}
			rng := rand.New(rand.NewPCG(3, 9))
			for range 40 {
				var cuts []int
				for at := 0; at < len(tc.stream); at += 1 + rng.IntN(40) {
					cuts = append(cuts, at)
				}
				if got := streamRequests(t, tc.port, tc.stream, cuts); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("cuts %v:\nstream: %q\npackets: %q", cuts, got, want)
				}
			}
		})
	}
}

// TestRequestStreamSkip: an oversized Content-Length body is covered by
// its request; the stream skips its rest and frames what follows.
func TestRequestStreamSkip(t *testing.T) {
	s, err := NewRequestStream(Config{MaxHeaderBytes: 1024, MaxBodyBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	head := "POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n"
	s.Write([]byte(head + "0123456789abcdefXYZ"))
	r := s.Next()
	if r == nil || r.Span != SpanBytes || r.Start != 0 || r.End != int64(len(head)+100) || !errors.Is(r.Opaque, ErrOversized) || string(r.HTTP.Body) != "0123456789abcdef" {
		t.Fatalf("oversized request: %+v", r)
	}
	if s.Next() != nil {
		t.Fatal("a second effect inside the body")
	}
	body := make([]byte, 100-19)
	s.Write(body)
	s.Write([]byte(getA))
	r = s.Next()
	if r == nil || r.Start != int64(len(head)+100) || r.End != r.Start+int64(len(getA)) || string(r.HTTP.Method) != "GET" {
		t.Fatalf("request after the skipped body: %+v", r)
	}
}

// FuzzRequestStream: any stream, any cuts: the effects of the packet
// parser.
func FuzzRequestStream(f *testing.F) {
	for _, tc := range httpCorpus(f) {
		f.Add(tc.stream, []byte{5, 17, 2, 200})
	}
	window := newParser(f, segConfig()).window()
	f.Fuzz(func(t *testing.T, stream, cutBytes []byte) {
		if len(stream) == 0 || len(stream) > window || len(stream) > 0 && (stream[0] == 22) {
			return
		}
		var cuts []int
		at := 0
		for _, c := range cutBytes {
			at += 1 + int(c)
			cuts = append(cuts, at)
		}
		want := wholeEffects(t, 80, stream)
		if got := streamRequests(t, 80, stream, cuts); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("cuts %v:\nstream: %q\npackets: %q", cuts, got, want)
		}
	})
}
