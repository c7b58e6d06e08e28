package intercept

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"testing"
	"time"
)

// BenchmarkFront measures what the Front adds, each against its
// same-run baseline, interleaved round by round:
//
//   - download-pass: a 32 MiB download over a connection passed through
//     opaque (ClientHello read, then relayed) against the same download
//     straight from the world: MB/s each, and pass/direct.
//   - handshake: a new TLS connection and one GET per op, intercepted
//     through the Front (ClientHello read, then replayed to the proxy)
//     against the proxy alone: connections/s each, and front/proxy.
func BenchmarkFront(b *testing.B) {
	w := newWorld(b)
	tp := newTestProxy(b, w, nil)
	pass := newTestFront(b, tp, w.addr, func(*Hello) Route { return RoutePass }, nil)
	icpt := newTestFront(b, tp, w.addr, func(*Hello) Route { return RouteIntercept }, nil)
	b.Run("download-pass", func(b *testing.B) {
		const size = 32 << 20
		roots := newPoolFromFile(b, w.caFile)
		direct, passed := dialClient(roots, w.addr, true), dialClient(roots, pass.addr, true)
		url := fmt.Sprintf("https://localhost/big?n=%d", size)
		var td, tp, cd, cp time.Duration
		for i := 0; b.Loop(); i++ {
			for k := range 2 {
				c, d, u := direct, &td, &cd
				if (i+k)%2 == 1 {
					c, d, u = passed, &tp, &cp
				}
				start, c0 := time.Now(), cpuTime()
				if err := get(c, url, size); err != nil {
					b.Fatal(err)
				}
				*d += time.Since(start)
				*u += cpuTime() - c0
			}
		}
		n := float64(b.N) * size / 1e6
		b.ReportMetric(n/td.Seconds(), "direct-MB/s")
		b.ReportMetric(n/tp.Seconds(), "pass-MB/s")
		b.ReportMetric(td.Seconds()/tp.Seconds(), "pass/direct")
		if cd > 0 {
			// The process's CPU time (client, world and Front) per MiB:
			// on a shared machine steadier than MB/s.
			mib := float64(b.N) * size / (1 << 20)
			b.ReportMetric(us(cd)/mib, "direct-cpu-µs/MiB")
			b.ReportMetric(us(cp)/mib, "pass-cpu-µs/MiB")
			b.ReportMetric(cp.Seconds()/cd.Seconds(), "pass/direct-cpu")
		}
	})
	b.Run("handshake", func(b *testing.B) {
		roots := tp.ca.Pool()
		front, proxy := dialClient(roots, icpt.addr, false), dialClient(roots, tp.addr, false)
		var tf, tpr []time.Duration
		for i := 0; b.Loop(); i++ {
			for k := range 2 {
				c, d := proxy, &tpr
				if (i+k)%2 == 1 {
					c, d = front, &tf
				}
				start := time.Now()
				if err := get(c, "https://localhost/hello", -1); err != nil {
					b.Fatal(err)
				}
				*d = append(*d, time.Since(start))
			}
		}
		b.ReportMetric(1/medianDur(tpr).Seconds(), "proxy-conns/s")
		b.ReportMetric(1/medianDur(tf).Seconds(), "front-conns/s")
		b.ReportMetric(medianDur(tpr).Seconds()/medianDur(tf).Seconds(), "front/proxy")
	})
}

// dialClient is an HTTP/1.1 client whose connections all go to addr.
func dialClient(roots *x509.CertPool, addr netip.AddrPort, keepAlive bool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
		DisableKeepAlives: !keepAlive,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr.String())
		},
	}}
}

func medianDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
