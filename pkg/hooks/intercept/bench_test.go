package intercept

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkKeepAlive: small GETs on kept-alive connections, through the
// proxy (with a decider that releases everything) and directly to the
// world over TLS. "seq" is one client, one request at a time: ns/op is
// the per-request latency, p50/p99 its distribution; "par" runs
// GOMAXPROCS clients for requests per second.
func BenchmarkKeepAlive(b *testing.B) {
	w := newWorld(b)
	tp := newTestProxy(b, w, nil)
	worldPool := newPoolFromFile(b, w.caFile)
	mitm, mitmPool := mitmdump(b, w)
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "http1", true: "h2"}[h2]
		for _, via := range []string{"direct", "proxy", "mitmdump"} {
			url, roots := fmt.Sprintf("https://localhost:%d/bench", w.addr.Port()), worldPool
			switch via {
			case "proxy":
				url, roots = tp.url("/bench"), tp.ca.Pool()
			case "mitmdump":
				url, roots = mitm+"/bench", mitmPool
			}
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: h2, MaxIdleConnsPerHost: 64}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			c := &http.Client{Transport: tr}
			get := func() {
				resp, err := c.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			b.Run(proto+"/"+via+"/seq", func(b *testing.B) {
				get() // the connection is set up outside the measurement
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for b.Loop() {
					t0 := time.Now()
					get()
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			})
			b.Run(proto+"/"+via+"/par", func(b *testing.B) {
				get()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						get()
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			})
			tr.CloseIdleConnections()
		}
	}
}

// BenchmarkDownload: one 16 MiB response per op on a kept-alive
// connection, through the proxy and directly (MB/s).
func BenchmarkDownload(b *testing.B) {
	const size = 16 << 20
	w := newWorld(b)
	tp := newTestProxy(b, w, nil)
	worldPool := newPoolFromFile(b, w.caFile)
	mitm, mitmPool := mitmdump(b, w)
	for _, h2 := range []bool{false, true} {
		proto := map[bool]string{false: "http1", true: "h2"}[h2]
		for _, via := range []string{"direct", "proxy", "mitmdump"} {
			url, roots := fmt.Sprintf("https://localhost:%d/big?n=%d", w.addr.Port(), size), worldPool
			switch via {
			case "proxy":
				url, roots = tp.url(fmt.Sprintf("/big?n=%d", size)), tp.ca.Pool()
			case "mitmdump":
				url, roots = fmt.Sprintf("%s/big?n=%d", mitm, size), mitmPool
			}
			tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: h2}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			c := &http.Client{Transport: tr}
			b.Run(proto+"/"+via, func(b *testing.B) {
				b.SetBytes(size)
				for b.Loop() {
					resp, err := c.Get(url)
					if err != nil {
						b.Fatal(err)
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if n != size {
						b.Fatalf("got %d bytes", n)
					}
				}
			})
			tr.CloseIdleConnections()
		}
	}
}

// BenchmarkHandshake: one new TLS connection per request (keep-alive
// off), through the proxy (two handshakes, a leaf from the cache) and
// directly: handshakes per second.
func BenchmarkHandshake(b *testing.B) {
	w := newWorld(b)
	tp := newTestProxy(b, w, nil)
	worldPool := newPoolFromFile(b, w.caFile)
	mitm, mitmPool := mitmdump(b, w)
	for _, via := range []string{"direct", "proxy", "mitmdump"} {
		url, roots := fmt.Sprintf("https://localhost:%d/bench", w.addr.Port()), worldPool
		switch via {
		case "proxy":
			url, roots = tp.url("/bench"), tp.ca.Pool()
		case "mitmdump":
			url, roots = mitm+"/bench", mitmPool
		}
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true,
			TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
		c := &http.Client{Transport: tr}
		b.Run(via, func(b *testing.B) {
			for b.Loop() {
				resp, err := c.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "conn/s")
		})
	}
}
