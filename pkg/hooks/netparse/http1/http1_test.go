package http1

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestParseField(t *testing.T) {
	for _, c := range []struct {
		line, name, value string
		bad               bool
	}{
		{"Host: example.com", "Host", "example.com", false},
		{"X-A:\t v \t", "X-A", "v", false},
		{"X-Empty:", "X-Empty", "", false},
		{" folded: x", "", "", true},
		{"Bad Name: x", "", "", true},
		{": x", "", "", true},
		{"no colon", "", "", true},
		{"X: a\x01b", "", "", true},
		{"X: a\x7f", "", "", true},
		{"", "", "", true},
	} {
		n, v, err := ParseField(c.line)
		if (err != nil) != c.bad || !c.bad && (n != c.name || v != c.value) {
			t.Errorf("ParseField(%q) = %q %q %v", c.line, n, v, err)
		}
		bn, bv, berr := ParseField([]byte(c.line))
		if (berr != nil) != (err != nil) || string(bn) != n || string(bv) != v {
			t.Errorf("ParseField([]byte %q) differs from the string form", c.line)
		}
		if err != nil && !errors.Is(err, ErrSyntax) {
			t.Errorf("error %v does not wrap ErrSyntax", err)
		}
	}
}

func TestContentLength(t *testing.T) {
	for _, c := range []struct {
		v    string
		want int64
		bad  bool
	}{
		{"0", 0, false}, {"42", 42, false}, {"5, 5", 5, false}, {" 7 ", 7, false},
		{"5, 6", 0, true}, {"", 0, true}, {"-1", 0, true}, {"1e3", 0, true}, {"5,", 0, true},
		{"1234567890123456789", 0, true}, {"123456789012345678", 123456789012345678, false},
	} {
		got, err := ContentLength(c.v)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ContentLength(%q) = %d, %v", c.v, got, err)
		}
	}
}

func TestTransferCodings(t *testing.T) {
	for _, c := range []struct {
		v     string
		last  bool
		n     int
		empty bool
	}{
		{"chunked", true, 1, false},
		{"gzip, Chunked", true, 1, false},
		{"chunked, gzip", false, 1, false},
		{"chunked,chunked", true, 2, false},
		{"chunked,", true, 1, true},
		{"gzip;q=1, chunked;x=y", true, 1, false},
		{"", false, 0, true},
	} {
		last, n, empty := TransferCodings(c.v)
		if last != c.last || n != c.n || empty != c.empty {
			t.Errorf("TransferCodings(%q) = %v %d %v", c.v, last, n, empty)
		}
	}
	if !HasToken("keep-alive, Upgrade", "upgrade") || HasToken("upgrades", "upgrade") {
		t.Error("HasToken")
	}
}

// decodeSplit runs the decoder over body cut at the given offsets and
// returns the data, the wire length when done, and the outcome.
func decodeSplit(c Chunked, body []byte, cuts []int) (data []byte, outcome string) {
	at := 0
	for _, end := range append(cuts, len(body)) {
		if end <= at || end > len(body) {
			continue
		}
		b := body[at:end]
		for len(b) > 0 {
			n, d, st, err := c.Next(b)
			data = append(data, d...)
			b = b[n:]
			switch {
			case err != nil:
				return data, "error"
			case st == ChunkDone:
				return data, fmt.Sprintf("done wire=%d trailer@%d", c.Wire, c.TrailerAt)
			case st == ChunkOver:
				return data, fmt.Sprintf("over decoded=%d wire=%d", c.Decoded, c.Wire)
			}
		}
		at = end
	}
	return data, fmt.Sprintf("more decoded=%d wire=%d", c.Decoded, c.Wire)
}

// refChunked decodes a whole strict chunked body the plain way.
func refChunked(body []byte) (data []byte, wire int, ok bool) {
	pos := 0
	line := func() ([]byte, bool) {
		i := bytes.Index(body[pos:], []byte("\r\n"))
		if i < 0 {
			return nil, false
		}
		l := body[pos : pos+i]
		pos += i + 2
		return l, !bytes.ContainsAny(l, "\r\n")
	}
	for {
		l, good := line()
		if !good || len(l) > 1023 {
			return nil, 0, false
		}
		k := 0
		var size int64
		for k < len(l) && Unhex(l[k]) >= 0 {
			if k >= 15 {
				return nil, 0, false
			}
			size = size<<4 | int64(Unhex(l[k]))
			k++
		}
		if k == 0 || k < len(l) && l[k] != ';' {
			return nil, 0, false
		}
		for _, c := range l[k:] {
			if isCTL(c) {
				return nil, 0, false
			}
		}
		if size == 0 {
			break
		}
		if int64(len(body)-pos) < size+2 || body[pos+int(size)] != '\r' || body[pos+int(size)+1] != '\n' {
			return nil, 0, false
		}
		data = append(data, body[pos:pos+int(size)]...)
		pos += int(size) + 2
	}
	for {
		l, good := line()
		if !good {
			return nil, 0, false
		}
		if len(l) == 0 {
			return data, pos, true
		}
		if _, _, err := ParseField(l); err != nil {
			return nil, 0, false
		}
	}
}

var chunkedCases = []string{
	"5\r\nhello\r\n0\r\n\r\n",
	"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nT: v\r\nU: w\r\n\r\n",
	"5\nhello\n0\n\n",
	"5 ;x\r\nhello\r\n0\r\n\r\n",
	"5\r\nhelloXY0\r\n\r\n",
	"0\r\n folded: x\r\n\r\n",
	"fffffffffffffffff\r\n",
	"5\r\nhel",
	"0\r\nT: a\rb\r\n\r\n",
	strings.Repeat("1\r\nx\r\n", 300) + "0\r\n\r\n",
	"1;" + strings.Repeat("e", 1100) + "\r\nx\r\n0\r\n\r\n",
}

// TestChunkedSplits: every split of a body into two calls, and random
// splits into many, decode as the whole body does; strict results agree
// with the reference decoder.
func TestChunkedSplits(t *testing.T) {
	for _, lax := range []bool{false, true} {
		for _, body := range chunkedCases {
			c := Chunked{Lax: lax, MaxData: 256, MaxWire: 1500}
			wantData, want := decodeSplit(c, []byte(body), nil)
			for cut := 1; cut < len(body); cut++ {
				gotData, got := decodeSplit(c, []byte(body), []int{cut})
				if got != want || !bytes.Equal(gotData, wantData) {
					t.Fatalf("lax=%v %q cut at %d: %s %q, whole: %s %q", lax, body, cut, got, gotData, want, wantData)
				}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for range 50 {
				var cuts []int
				for at := 0; at < len(body); at += 1 + rng.IntN(8) {
					cuts = append(cuts, at)
				}
				if gotData, got := decodeSplit(c, []byte(body), cuts); got != want || !bytes.Equal(gotData, wantData) {
					t.Fatalf("lax=%v %q cuts %v: %s, whole: %s", lax, body, cuts, got, want)
				}
			}
		}
	}
}

func TestChunkedOutcomes(t *testing.T) {
	for _, c := range []struct {
		body string
		lax  bool
		want string
	}{
		{chunkedCases[0], false, "done wire=15 trailer@13"},
		{chunkedCases[2], false, "error"},
		{chunkedCases[2], true, "done wire=11 trailer@10"},
		{chunkedCases[3], false, "error"},
		{chunkedCases[3], true, "done wire=18 trailer@16"},
		{chunkedCases[4], false, "error"},
		{chunkedCases[5], true, "error"},
		{chunkedCases[6], false, "error"},
		{chunkedCases[7], false, "more decoded=3 wire=6"},
		{chunkedCases[8], false, "error"},
		{chunkedCases[9], false, "over decoded=250 wire=1501"},
		{chunkedCases[10], false, "error"},
		{"200\r\n" + strings.Repeat("d", 512) + "\r\n0\r\n\r\n", false, "over decoded=257 wire=262"},
	} {
		_, got := decodeSplit(Chunked{Lax: c.lax, MaxData: 256, MaxWire: 1500}, []byte(c.body), nil)
		if got != c.want {
			t.Errorf("%.40q lax=%v: %s, want %s", c.body, c.lax, got, c.want)
		}
	}
	// LoseData: a hole inside chunk data keeps the framing.
	c := Chunked{}
	n, _, _, _ := c.Next([]byte("a\r\n01234"))
	if in, left := c.InData(); n != 8 || !in || left != 5 || !c.LoseData(3) || c.LoseData(3) {
		t.Fatalf("LoseData: n=%d in=%v left=%d", n, in, left)
	}
	if _, got := decodeSplit(c, []byte("89\r\n0\r\n\r\n"), nil); got != "done wire=20 trailer@18" {
		t.Fatalf("after LoseData: %s", got)
	}
}

// FuzzChunked: any split decodes as the whole body; a strict decode
// agrees with the reference decoder on whole input.
func FuzzChunked(f *testing.F) {
	for _, s := range chunkedCases {
		f.Add([]byte(s), []byte{3, 1, 4, 1, 5}, false)
	}
	f.Fuzz(func(t *testing.T, body, cutSeed []byte, lax bool) {
		if len(body) > 4096 {
			return
		}
		c := Chunked{Lax: lax}
		wantData, want := decodeSplit(c, body, nil)
		var cuts []int
		at := 0
		for _, s := range cutSeed {
			at += 1 + int(s)
			cuts = append(cuts, at)
		}
		gotData, got := decodeSplit(c, body, cuts)
		if got != want || !bytes.Equal(gotData, wantData) {
			t.Fatalf("split %v: %s %q, whole: %s %q", cuts, got, gotData, want, wantData)
		}
		if lax {
			return
		}
		refData, refWire, ok := refChunked(body)
		done := strings.HasPrefix(want, "done")
		if ok && (!done || !bytes.Equal(refData, wantData) || !strings.HasPrefix(want, fmt.Sprintf("done wire=%d ", refWire))) {
			t.Fatalf("reference decodes %q (wire %d), decoder: %s %q", refData, refWire, want, wantData)
		}
		if !ok && done {
			t.Fatalf("reference refuses, decoder: %s", want)
		}
	})
}
