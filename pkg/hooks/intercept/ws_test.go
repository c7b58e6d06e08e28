package intercept

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/websocket"

	"github.com/carbd/carbd/pkg/decide"
)

// TestWebSocket: x/net/websocket's client through the proxy to its
// server: each client message is one effect; released ones are echoed,
// server messages are observed, a refused one closes the connection and
// never reaches the world.
func TestWebSocket(t *testing.T) {
	w := newWorld(t)
	var mu sync.Mutex
	var in []string
	tp := newTestProxy(t, w, func(c *Config) {
		c.Observe = func(_ *Request, ev decide.Event) {
			if ev.Op == OpWSMessage {
				mu.Lock()
				in = append(in, ev.Content)
				mu.Unlock()
			}
		}
	})
	cfg, err := websocket.NewConfig(fmt.Sprintf("wss://localhost:%d/wsecho", tp.addr.Port()), "https://localhost/")
	if err != nil {
		t.Fatal(err)
	}
	cfg.TlsConfig = &tls.Config{RootCAs: tp.ca.Pool(), ServerName: "localhost"}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for _, m := range []string{"hello", "again"} {
		if err := websocket.Message.Send(ws, m); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != strings.ToUpper(m) {
			t.Fatalf("echo of %q: %q, %v", m, got, err)
		}
	}
	if err := websocket.Message.Send(ws, "leak "+secret); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := websocket.Message.Receive(ws, &got); err == nil {
		t.Fatalf("the connection went on after a refused message: %q", got)
	}
	var msgs []string
	for _, r := range w.received() {
		if r.Method == "WS" {
			msgs = append(msgs, string(r.Body))
		}
	}
	if strings.Join(msgs, ",") != "hello,again" || w.bytesWith(secret) != 0 {
		t.Errorf("the world received messages %q", msgs)
	}
	var ops []string
	for _, r := range tp.dec.seen() {
		ops = append(ops, r.Event.Op+" "+r.Event.Content)
	}
	if want := "http:GET ,ws:message hello,ws:message again,ws:message leak " + secret; strings.Join(ops, ",") != want {
		t.Errorf("decided %q, want %q", ops, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(in, ",") != "HELLO,AGAIN" {
		t.Errorf("observed %q", in)
	}
}

// frame builds a masked client frame.
func frame(fin bool, op byte, payload []byte) []byte {
	b := []byte{op}
	if fin {
		b[0] |= 0x80
	}
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	var key [4]byte
	rand.Read(key[:])
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i&3])
	}
	return b
}

// readFrame reads one unmasked server frame.
func readFrame(t *testing.T, br *bufio.Reader) (byte, []byte) {
	t.Helper()
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		t.Fatalf("read frame: %v", err)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		io.ReadFull(br, l[:])
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		io.ReadFull(br, l[:])
		n = binary.BigEndian.Uint64(l[:])
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(br, p); err != nil {
		t.Fatalf("read frame payload: %v", err)
	}
	return h[0] & 0x0f, p
}

// readMessage reads server frames up to a data or close frame.
func readMessage(t *testing.T, br *bufio.Reader) (byte, []byte) {
	for {
		op, p := readFrame(t, br)
		if op != 0x9 && op != 0xa {
			return op, p
		}
	}
}

// TestWebSocketFrames: hand-made frames: a fragmented message with a ping
// between its fragments, a message over MaxBodyBytes (decided on its
// start, Oversized), a refused message answered with a close frame
// carrying the notice; the extension offer is stripped.
func TestWebSocketFrames(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, func(c *Config) { c.MaxBodyBytes = 1024 })
	conn, err := tls.Dial("tcp", tp.addr.String(), &tls.Config{ServerName: "localhost", RootCAs: tp.ca.Pool(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /wsecho HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nOrigin: https://localhost\r\n"+
		"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if resp.Header.Get("Sec-WebSocket-Extensions") != "" {
		t.Errorf("an extension was agreed: %q", resp.Header.Get("Sec-WebSocket-Extensions"))
	}
	var out bytes.Buffer
	out.Write(frame(false, 0x1, []byte("frag")))
	out.Write(frame(true, 0x9, []byte("ping!")))
	out.Write(frame(true, 0x0, []byte("mented")))
	conn.Write(out.Bytes())
	// x/net/websocket's server reads frame by frame: it echoes each
	// fragment; the decider saw the one message (below).
	for _, want := range []string{"FRAG", "MENTED"} {
		if op, p := readMessage(t, br); op != 1 || string(p) != want {
			t.Fatalf("fragmented echo: %d %q, want %q", op, p, want)
		}
	}
	big := strings.Repeat("b", 3000)
	conn.Write(frame(true, 0x1, []byte(big)))
	if op, p := readMessage(t, br); op != 1 || string(p) != strings.ToUpper(big) {
		t.Fatalf("big echo: %d %d bytes", op, len(p))
	}
	conn.Write(frame(true, 0x1, []byte("x "+secret)))
	op, p := readMessage(t, br)
	if op != 0x8 || len(p) < 2 || binary.BigEndian.Uint16(p) != 1008 || !strings.Contains(string(p[2:]), "carbd: refused: the request carries a sensitive value in body") {
		t.Fatalf("refusal: op %d payload %q", op, p)
	}
	var kinds []string
	for _, r := range tp.dec.seen() {
		kinds = append(kinds, fmt.Sprintf("%s %d %v", r.Event.Op, len(r.Event.Content), r.Oversized))
	}
	want := "http:GET 0 false,ws:message 10 false,ws:control 5 false,ws:message 1024 true,ws:message 13 false"
	if strings.Join(kinds, ",") != want {
		// The ping (a control frame with a payload) is decided when it
		// arrives, before the message it interrupts is complete.
		want2 := "http:GET 0 false,ws:control 5 false,ws:message 10 false,ws:message 1024 true,ws:message 13 false"
		if strings.Join(kinds, ",") != want2 {
			t.Errorf("decided %q", kinds)
		}
	}
	if w.bytesWith(secret) != 0 {
		t.Error("the refused message reached the world")
	}
}
