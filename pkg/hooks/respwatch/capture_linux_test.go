package respwatch

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/hooks/capture"
)

var updatePcaps = flag.Bool("update-pcaps", false, "keep the capture of TestCaptureReal as testdata/responses.pcapng")

// TestCaptureReal makes real traffic between a guest namespace and a
// "world" namespace joined by a veth pair: curl (keep-alive, chunked,
// gzip, a 300 kB body, IPv6, TLS, a redirect with a cookie) and Go's
// HTTP client pipelining two requests, against Go's net/http server. It
// captures the world side of the veth with pkg/hooks/capture (as the
// daemon does on the host side of the sandbox's interface), feeds the
// frames to a Watcher through capture.WithFrameFunc, and checks the
// events. With -update-pcaps it keeps the capture for the unprivileged
// replay tests.
func TestCaptureReal(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "curl")
	world, guestNS := testutil.NewNetNS(t), testutil.NewNetNS(t)
	hostIf, guestIf := testutil.UniqueName("rwh"), testutil.UniqueName("rwg")
	testutil.Run(t, "ip", "-n", world, "link", "add", hostIf, "type", "veth", "peer", "name", guestIf, "netns", guestNS)
	testutil.Run(t, "ip", "-n", world, "addr", "add", worldAddr4+"/24", "dev", hostIf)
	testutil.Run(t, "ip", "-n", world, "addr", "add", worldAddr6+"/64", "dev", hostIf, "nodad")
	testutil.Run(t, "ip", "-n", guestNS, "addr", "add", guestAddr4+"/24", "dev", guestIf)
	testutil.Run(t, "ip", "-n", guestNS, "addr", "add", guestAddr6+"/64", "dev", guestIf, "nodad")
	testutil.Run(t, "ip", "-n", world, "link", "set", hostIf, "up")
	testutil.Run(t, "ip", "-n", guestNS, "link", "set", guestIf, "up")

	// The world: Go's HTTP server, plain and TLS.
	var l4, l6, lt net.Listener
	inNS(t, world, func() {
		var err error
		if l4, err = net.Listen("tcp4", worldAddr4+":8080"); err != nil {
			t.Fatal(err)
		}
		if l6, err = net.Listen("tcp6", "["+worldAddr6+"]:8080"); err != nil {
			t.Fatal(err)
		}
		if lt, err = net.Listen("tcp4", worldAddr4+":8443"); err != nil {
			t.Fatal(err)
		}
	})
	h := worldHandler()
	for _, l := range []net.Listener{l4, l6} {
		srv := &http.Server{Handler: h}
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
	}
	ts := httptest.NewUnstartedServer(h)
	ts.Listener.Close()
	ts.Listener = lt
	ts.StartTLS()
	t.Cleanup(ts.Close)

	// A loaded machine can make the kernel drop frames before the
	// capture reads them; the watcher then reports the response they
	// belonged to as opaque (ErrLost), which is right but not what this
	// test checks: such a run is made again.
	for attempt := 1; ; attempt++ {
		lost := captureOnce(t, hostIf, world, guestNS, attempt == 3)
		if !lost || attempt == 3 {
			break
		}
		t.Logf("attempt %d lost frames in the kernel; again", attempt)
	}
}

// captureOnce runs the traffic once under a capture and checks the
// events. It reports whether the capture lost frames; with final, a loss
// fails the test.
func captureOnce(t *testing.T, hostIf, world, guestNS string, final bool) bool {
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var rec recorder
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, rec.emit) }()
	stop := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { stop() })
	// snaplen 0 takes the capture's default, as the daemon does.
	c, err := capture.Start(hostIf, "/run/netns/"+world, 0, 64<<20, capture.WithFrameFunc(w.Record), capture.WithReadBuffer(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	resolve := "web.test:8080:" + worldAddr4
	curl := func(args ...string) {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", guestNS, "curl", "-sS", "-o", "/dev/null", "--resolve", resolve}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
	}
	curl("http://web.test:8080/page", "http://web.test:8080/chunked") // one kept-alive connection
	curl("--compressed", "http://web.test:8080/gzip")
	curl("http://web.test:8080/big")
	curl("http://web.test:8080/cookie")
	curl("-g", "http://["+worldAddr6+"]:8080/page")
	curl("-k", "--resolve", "secure.test:8443:"+worldAddr4, "https://secure.test:8443/page")
	pipeline(t, guestNS)

	// Wait until the watcher has taken every frame, then stop it so that
	// nothing is in progress.
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, _ := c.Records()
		if st := w.Stats(); st.Frames >= uint64(len(recs)) && len(rec.get()) >= len(realExpect) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs, dropped := c.Records()
	if dropped != 0 || w.Stats().Dropped != 0 {
		t.Fatalf("capture dropped %d frames, watcher %d", dropped, w.Stats().Dropped)
	}
	t.Logf("%d frames, stats %+v", len(recs), w.Stats())
	if w.Stats().LostBytes > 0 && !final {
		return true
	}
	checkReal(t, rec.get(), w.Stats())
	var max int
	for _, r := range recs {
		max = maxInt(max, r.OrigLen)
	}
	t.Logf("largest frame %d bytes", max)
	if *updatePcaps && !t.Failed() {
		var buf bytes.Buffer
		if err := c.WritePcapng(&buf, nil); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("testdata/responses.pcapng", buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return false
}

func maxInt(a, b int) int { return max(a, b) }

// worldHandler serves the test pages.
func worldHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprint(w, pageBody)
	})
	mux.HandleFunc("/chunked", func(w http.ResponseWriter, r *http.Request) {
		for _, p := range strings.SplitAfter(chunkedBody, "\n") {
			fmt.Fprint(w, p)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/gzip", func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			http.Error(w, "gzip only", http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, gzipBody)
		zw.Close()
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(bigBody)))
		fmt.Fprint(w, bigBody)
	})
	mux.HandleFunc("/cookie", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3ss10n-t0k3n-42", Path: "/"})
		http.Redirect(w, r, "/page", http.StatusFound)
	})
	mux.HandleFunc("/p/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "pipelined "+strings.TrimPrefix(r.URL.Path, "/p/"))
	})
	return mux
}

// pipeline sends two requests at once on one connection from the guest
// and reads both responses.
func pipeline(t *testing.T, ns string) {
	t.Helper()
	var conn net.Conn
	inNS(t, ns, func() {
		var err error
		if conn, err = net.DialTimeout("tcp4", worldAddr4+":8080", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte("GET /p/one HTTP/1.1\r\nHost: web.test:8080\r\n\r\nGET /p/two HTTP/1.1\r\nHost: web.test:8080\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for i := 0; i < 2; i++ {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
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
