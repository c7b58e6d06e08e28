package netparse

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"golang.org/x/net/dns/dnsmessage"
)

var updatePcaps = flag.Bool("update-pcaps", false, "copy the captures of TestCapture into testdata/")

// TestCapture makes real traffic inside a private network namespace (curl
// against an HTTP server, dig against a DNS responder, Go's TLS client,
// ping), captures it on the namespace's loopback with tcpdump, and checks
// what the parser makes of the guest-to-world packets. With
// -update-pcaps it keeps the captures for TestReplayCaptures.
func TestCapture(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "tcpdump")
	runs := map[string]func(t *testing.T, ns string){
		"http": trafficHTTP,
		"dns":  trafficDNS,
		"tls":  trafficTLS,
		"icmp": trafficICMP,
	}
	for name, traffic := range runs {
		t.Run(name, func(t *testing.T) {
			// A loaded machine can lose packets between the kernel and
			// tcpdump; such a capture is made again.
			var path string
			for attempt := 1; ; attempt++ {
				ns := testutil.NewNetNS(t)
				path = fmt.Sprintf("%s/%s-%d.pcap", t.TempDir(), name, attempt)
				stop := startCapture(t, ns, path)
				traffic(t, ns)
				if stop() {
					break
				}
				if attempt == 3 {
					t.Fatal("three incomplete captures")
				}
			}
			captureChecks[name](t, replayPcap(t, path))
			if *updatePcaps && !t.Failed() {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile("testdata/"+name+".pcap", b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// inNS runs fn inside the namespace (see internal/netnsx); sockets fn
// creates stay in it. fn runs on its own goroutine: a t.Fatal in it marks
// the test failed and ends fn, and inNS then stops the test.
func inNS(t testing.TB, ns string, fn func()) {
	t.Helper()
	if err := netnsx.DoNamed(ns, func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}

// startCapture runs tcpdump on the namespace's loopback. stop ends it
// once the file stops growing and reports whether every packet the
// kernel passed to tcpdump was written.
func startCapture(t *testing.T, ns, path string) (stop func() bool) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, "tcpdump", "-Z", "root", "--immediate-mode", "-i", "lo", "-U", "-s", "0", "-n", "-w", path)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	ready := make(chan string, 1)
	var log strings.Builder
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "listening on") {
				ready <- sc.Text()
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case <-ready:
	case <-done:
		t.Fatalf("tcpdump exited: %s", log.String())
	case <-time.After(10 * time.Second):
		t.Fatal("tcpdump did not start")
	}
	time.Sleep(100 * time.Millisecond)
	return func() bool {
		last := int64(-1)
		for i := 0; i < 40; i++ {
			time.Sleep(250 * time.Millisecond)
			st, err := os.Stat(path)
			if err == nil && st.Size() == last {
				break
			}
			if err == nil {
				last = st.Size()
			}
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		<-done
		var captured, received, dropped int
		for _, line := range strings.Split(log.String(), "\n") {
			var n int
			if _, err := fmt.Sscanf(line, "%d packets", &n); err != nil {
				continue
			}
			switch {
			case strings.Contains(line, "captured"):
				captured = n
			case strings.Contains(line, "received by filter"):
				received = n
			case strings.Contains(line, "dropped by kernel"):
				dropped = n
			}
		}
		// On loopback the kernel hands tcpdump each packet twice (out
		// and in) and tcpdump keeps one.
		if 2*captured < received || dropped != 0 {
			t.Logf("incomplete capture: %d captured, %d received, %d dropped", captured, received, dropped)
			return false
		}
		return true
	}
}

func nsRun(t *testing.T, ns string, args ...string) string {
	t.Helper()
	return testutil.Run(t, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

func trafficHTTP(t *testing.T, ns string) {
	testutil.RequireTool(t, "curl")
	var l4, l6 net.Listener
	inNS(t, ns, func() {
		var err error
		if l4, err = net.Listen("tcp4", "127.0.0.1:8080"); err != nil {
			t.Fatal(err)
		}
		if l6, err = net.Listen("tcp6", "[::1]:8080"); err != nil {
			t.Fatal(err)
		}
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write([]byte("ok " + r.URL.Path + " " + string(rune('0'+len(b)%10))))
	})}
	go srv.Serve(l4)
	go srv.Serve(l6)
	t.Cleanup(func() { srv.Close() })
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/chunks", []byte(strings.Repeat("chunky-", 300)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/upload", []byte("upload-data:"+strings.Repeat("u", 3000)), 0o644); err != nil {
		t.Fatal(err)
	}
	curl := []string{"curl", "-sS", "--max-time", "10", "-o", "/dev/null"}
	nsRun(t, ns, append(curl, "-H", "Authorization: Bearer t0ken",
		"http://127.0.0.1:8080/hello?name=carbd", "http://127.0.0.1:8080/again")...)
	nsRun(t, ns, append(curl, "--data", "secret=42&user=agent", "http://127.0.0.1:8080/submit")...)
	nsRun(t, ns, append(curl, "-H", "Transfer-Encoding: chunked", "--data-binary", "@"+dir+"/chunks", "http://127.0.0.1:8080/chunked")...)
	nsRun(t, ns, append(curl, "-X", "PUT", "-H", "Expect: 100-continue", "--data-binary", "@"+dir+"/upload", "http://127.0.0.1:8080/upload")...)
	nsRun(t, ns, append(curl, "http://[::1]:8080/v6")...)

	// A client that writes one request in pieces (one packet each), then
	// two pipelined requests in one write.
	var conn net.Conn
	inNS(t, ns, func() {
		var err error
		if conn, err = net.Dial("tcp4", "127.0.0.1:8080"); err != nil {
			t.Fatal(err)
		}
	})
	defer conn.Close()
	conn.(*net.TCPConn).SetNoDelay(true)
	pieces := []string{"POST /split HTTP/1.1\r\nHost: 127.0", ".0.1:8080\r\nContent-Length: 15\r\n\r\n", "split-", "body-1234",
		"GET /p1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\nGET /p2 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"}
	for _, p := range pieces {
		if _, err := conn.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	for i := 0; i < 3; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// dnsAnswer answers A queries: alias.example is a CNAME of target.example.
func dnsAnswer(q []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(qs[0])
	_ = b.StartAnswers()
	name := qs[0].Name
	rh := func(n dnsmessage.Name, typ dnsmessage.Type) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: n, Type: typ, Class: dnsmessage.ClassINET, TTL: 30}
	}
	addr := [4]byte{192, 0, 2, 53}
	if strings.EqualFold(name.String(), "alias.example.") {
		target := dnsmessage.MustNewName("target.example.")
		_ = b.CNAMEResource(rh(name, dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: target})
		name, addr = target, [4]byte{192, 0, 2, 54}
	}
	if qs[0].Type == dnsmessage.TypeA {
		_ = b.AResource(rh(name, dnsmessage.TypeA), dnsmessage.AResource{A: addr})
	}
	out, _ := b.Finish()
	return out
}

func trafficDNS(t *testing.T, ns string) {
	testutil.RequireTool(t, "dig")
	var pc net.PacketConn
	var tl net.Listener
	inNS(t, ns, func() {
		var err error
		if pc, err = net.ListenPacket("udp4", "127.0.0.1:53"); err != nil {
			t.Fatal(err)
		}
		if tl, err = net.Listen("tcp4", "127.0.0.1:53"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { pc.Close(); tl.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if a := dnsAnswer(buf[:n]); a != nil {
				pc.WriteTo(a, from)
			}
		}
	}()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var l [2]byte
				for {
					if _, err := io.ReadFull(c, l[:]); err != nil {
						return
					}
					q := make([]byte, binary.BigEndian.Uint16(l[:]))
					if _, err := io.ReadFull(c, q); err != nil {
						return
					}
					a := dnsAnswer(q)
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			}()
		}
	}()
	dig := []string{"dig", "@127.0.0.1", "+tries=1", "+time=3"}
	nsRun(t, ns, append(dig, "exfil-test.example", "A")...)
	nsRun(t, ns, append(dig, "alias.example", "A")...)
	nsRun(t, ns, append(dig, "+tcp", "tcp-test.example", "AAAA")...)
}

func selfSigned(t *testing.T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "secure.example"},
		DNSNames: []string{"secure.example"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func trafficTLS(t *testing.T, ns string) {
	var l net.Listener
	var conn net.Conn
	inNS(t, ns, func() {
		var err error
		if l, err = net.Listen("tcp4", "127.0.0.1:8443"); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { l.Close() })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hi")) }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, NextProtos: []string{"h2", "http/1.1"}}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close() })
	inNS(t, ns, func() {
		var err error
		if conn, err = net.Dial("tcp4", "127.0.0.1:8443"); err != nil {
			t.Fatal(err)
		}
	})
	tc := tls.Client(conn, &tls.Config{ServerName: "secure.example", InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
	defer tc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	// Application data after the handshake (HTTP/2 preface, encrypted).
	if _, err := tc.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
}

func trafficICMP(t *testing.T, ns string) {
	testutil.RequireTool(t, "ping")
	nsRun(t, ns, "ping", "-c", "1", "-W", "2", "-p", "736563726574", "127.0.0.1")
	nsRun(t, ns, "ping", "-6", "-c", "1", "-W", "2", "::1")
}
