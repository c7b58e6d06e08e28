package intercept

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// keyLines parses an NSS key log into "LABEL client_random" -> secret.
func keyLines(t *testing.T, b []byte) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || len(f[1]) != 64 {
			t.Fatalf("key log line %q is not in the NSS format", l)
		}
		m[f[0]+" "+f[1]] = f[2]
	}
	return m
}

// TestKeyLog: the proxy's key log holds the secrets of both legs, equal
// to those the client and the world logged themselves; its client-leg
// key log (for the capture on the sandbox's link) exactly the client's.
func TestKeyLog(t *testing.T) {
	w := newWorld(t)
	var mu sync.Mutex
	var proxyLog, clientLeg bytes.Buffer
	tp := newTestProxy(t, w, func(c *Config) {
		c.KeyLog = lockedWriter{&mu, &proxyLog}
		c.ClientKeyLog = lockedWriter{&mu, &clientLeg}
	})
	var clientLog bytes.Buffer
	for _, h2 := range []bool{false, true} {
		c := goClient(tp, h2)
		c.Transport.(*http.Transport).TLSClientConfig.KeyLogWriter = &clientLog
		if r := do(t, c, "GET", tp.url("/hello"), ""); r.status != 200 {
			t.Fatalf("%+v", r)
		}
		c.CloseIdleConnections()
	}
	mu.Lock()
	proxy := keyLines(t, proxyLog.Bytes())
	leg := keyLines(t, clientLeg.Bytes())
	mu.Unlock()
	w.mu.Lock()
	world := keyLines(t, w.keyLog.Bytes())
	w.mu.Unlock()
	client := keyLines(t, clientLog.Bytes())
	for name, logged := range map[string]map[string]string{"client": client, "world": world} {
		if len(logged) < 8 { // TLS 1.3: 4 secrets per connection, 2 connections
			t.Fatalf("%s logged %d secrets", name, len(logged))
		}
		for k, v := range logged {
			if proxy[k] != v {
				t.Errorf("%s's secret %s missing from the proxy's key log", name, k)
			}
		}
	}
	for k, v := range client {
		if leg[k] != v {
			t.Errorf("the client's secret %s missing from the client-leg key log", k)
		}
	}
	if len(leg) != len(client) {
		t.Errorf("client-leg key log has %d secrets, the client logged %d", len(leg), len(client))
	}
	if len(proxy) != len(client)+len(world) {
		t.Errorf("proxy logged %d secrets, client %d, world %d", len(proxy), len(client), len(world))
	}
}

// TestUpgradeTunnel: an Upgrade request is one effect covering the rest
// of the connection: released, the tunnel carries both ways; refused,
// the client gets the 403 and the connection closes.
func TestUpgradeTunnel(t *testing.T) {
	w := newWorld(t)
	tp := newTestProxy(t, w, nil)
	dial := func() (*tls.Conn, *bufio.Reader) {
		conn, err := tls.Dial("tcp", tp.addr.String(), &tls.Config{ServerName: "localhost", RootCAs: tp.ca.Pool(), NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn, bufio.NewReader(conn)
	}
	conn, br := dial()
	io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nhello\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "again\n")
	for _, want := range []string{"HELLO\n", "AGAIN\n"} {
		if l, err := br.ReadString('\n'); l != want {
			t.Fatalf("tunnel read %q, %v; want %q", l, err, want)
		}
	}
	reqs := tp.dec.seen()
	if len(reqs) != 1 || !reqs[0].Open || reqs[0].Event.Op != "http:GET" {
		t.Fatalf("decider saw %+v", reqs)
	}
	if !reqs[0].Event.Opaque {
		t.Errorf("a tunnel decided as a request whose content is seen; want opaque (it carries what carbd does not see)")
	}
	conn, br = dial()
	io.WriteString(conn, "GET /ws?token="+secret+" HTTP/1.1\r\nHost: localhost\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\nleak\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 403 {
		t.Fatalf("refused upgrade: %v %v", resp, err)
	}
	if rest, _ := io.ReadAll(resp.Body); !strings.Contains(string(rest), "sensitive value") {
		t.Errorf("refused upgrade body %q", rest)
	}
	if _, err := br.ReadByte(); err == nil {
		t.Error("the connection stayed open after a refused tunnel")
	}
	if n := w.bytesWith("leak"); n != 0 || w.bytesWith(secret) != 0 {
		t.Error("bytes of the refused tunnel reached the world")
	}
}
