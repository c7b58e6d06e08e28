package intercept

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// clientHelloBytes is a real ClientHello record for sni, as crypto/tls
// sends it.
func clientHelloBytes(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		tls.Client(a, &tls.Config{ServerName: sni}).Handshake() //nolint:errcheck // ends when b closes
		a.Close()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// randomBytes is n bytes of a seeded stream (a chunking or ordering
// fault shows as a mismatch).
func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed+1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestFrontPassRelay: a passed connection carries large streams both
// ways byte for byte, the ClientHello first, and each side's half-close
// reaches the other while the other way goes on: the server ends its
// side first (the client still reads all of it, then sends more, which
// the server reads), then the client ends its own. Passed reports the
// bytes each way. The server is raw TCP, so every byte is checked.
func TestFrontPassRelay(t *testing.T) {
	hello := clientHelloBytes(t, "relay.test")
	down, up := randomBytes(9<<20+123, 1), randomBytes(3<<20+45, 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		srvErr <- func() error {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			defer c.Close()
			got := make([]byte, len(hello))
			if _, err := io.ReadFull(c, got); err != nil {
				return fmt.Errorf("server: the hello: %w", err)
			}
			if !bytes.Equal(got, hello) {
				return errors.New("server: the first bytes are not the client's hello")
			}
			if _, err := c.Write(down); err != nil {
				return fmt.Errorf("server: write: %w", err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				return err
			}
			rest, err := io.ReadAll(c)
			if err != nil {
				return fmt.Errorf("server: read after its own end: %w", err)
			}
			if !bytes.Equal(rest, up) {
				return fmt.Errorf("server: read %d bytes after the hello, not the %d the client sent", len(rest), len(up))
			}
			return nil
		}()
	}()
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	tf := newTestFront(t, tp, ln.Addr().(*net.TCPAddr).AddrPort(), func(*Hello) Route { return RoutePass }, nil)
	c, err := net.Dial("tcp", tf.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c) // to the server's half-close
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, down) {
		t.Fatalf("the client read %d bytes, the server sent %d: not the same bytes", len(got), len(down))
	}
	if _, err := c.Write(up); err != nil {
		t.Fatalf("the client's write after the server's end: %v", err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-srvErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not see the client's end")
	}
	var passed []string
	waitUntil(t, 5*time.Second, "the pass-through's end", func() bool {
		_, _, passed = tf.report()
		return len(passed) == 1
	})
	if want := fmt.Sprintf("relay.test %d %d <nil>", len(hello)+len(up), len(down)); passed[0] != want {
		t.Errorf("Passed reported %q, want %q", passed[0], want)
	}
}

// TestRelayCheck: relay hands every chunk to check before it writes it;
// the chunk check refuses is not written, and relay reports the step.
func TestRelayCheck(t *testing.T) {
	src, feed := net.Pipe()
	dst, sink := net.Pipe()
	defer src.Close()
	defer dst.Close()
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(sink)
		got <- b
	}()
	checks := 0
	refused := errors.New("refused")
	done := make(chan struct{})
	var (
		n    int64
		step relayStep
		rerr error
	)
	go func() {
		defer close(done)
		n, step, rerr = relay(dst, src, func() error {
			if checks++; checks == 3 {
				return refused
			}
			return nil
		})
		dst.Close()
	}()
	for _, s := range []string{"one ", "two ", "three"} {
		if _, err := feed.Write([]byte(s)); err != nil {
			break // relay stopped reading: the refused chunk
		}
	}
	feed.Close()
	<-done
	if b := <-got; string(b) != "one two " || n != 8 {
		t.Errorf("relay wrote %q (counted %d), want the two chunks before the refused one", b, n)
	}
	if step != stepCheck || !errors.Is(rerr, refused) {
		t.Errorf("relay ended at step %d with %v, want the check's refusal", step, rerr)
	}
}
