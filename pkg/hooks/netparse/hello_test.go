package netparse

import (
	"errors"
	"testing"
)

// TestHelloScanner: a real ClientHello fed a byte at a time is
// incomplete until its last byte, then read; a stream that is not TLS
// fails at once.
func TestHelloScanner(t *testing.T) {
	rec := realClientHello(t, "pinned.example", []string{"h2"})
	var s HelloScanner
	var ch ClientHello
	for n := 1; n < len(rec); n++ {
		if err := s.Scan(rec[:n], 1<<16, &ch); !errors.Is(err, ErrHelloIncomplete) {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
	if err := s.Scan(rec, 1<<16, &ch); err != nil || string(ch.SNI) != "pinned.example" || len(ch.ALPN) != 1 {
		t.Fatalf("%v sni %q alpn %q", err, ch.SNI, ch.ALPN)
	}
	for _, b := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {22, 3, 9}, {23, 3, 3, 0, 1, 0}} {
		var s HelloScanner
		if err := s.Scan(b, 1<<16, &ch); !errors.Is(err, ErrTLS) {
			t.Errorf("%q: %v, want ErrTLS", b, err)
		}
	}
	if err := new(HelloScanner).Scan(rec, 100, &ch); !errors.Is(err, ErrTLS) {
		t.Errorf("over the limit: %v", err)
	}
}

// FuzzHelloScanner: the scanner never panics, and a stream fed in two
// parts ends as the whole stream does.
func FuzzHelloScanner(f *testing.F) {
	rec := capturedClientHello(f)
	f.Add(rec, 7)
	f.Add(rec[:100], 50)
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0}, 3)
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		var whole, parts HelloScanner
		var ch1, ch2 ClientHello
		err1 := whole.Scan(b, 1<<16, &ch1)
		if cut > 0 && cut < len(b) {
			if err := parts.Scan(b[:cut], 1<<16, &ch2); err == nil || !errors.Is(err, ErrHelloIncomplete) {
				// Complete or failed early: the whole stream agrees.
				if (err == nil) != (err1 == nil) || errors.Is(err1, ErrHelloIncomplete) {
					t.Fatalf("prefix %d: %v, whole: %v", cut, err, err1)
				}
				return
			}
		}
		err2 := parts.Scan(b, 1<<16, &ch2)
		if (err1 == nil) != (err2 == nil) || errors.Is(err1, ErrHelloIncomplete) != errors.Is(err2, ErrHelloIncomplete) {
			t.Fatalf("whole: %v, in two parts: %v", err1, err2)
		}
		if err1 == nil && string(ch1.SNI) != string(ch2.SNI) {
			t.Fatalf("sni %q vs %q", ch1.SNI, ch2.SNI)
		}
	})
}
