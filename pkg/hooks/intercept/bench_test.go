package intercept

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
)

// The interception benchmarks (issue 9) measure carbd's proxy, mitmdump
// (mitmproxy from Debian, the field's reference) and a direct TLS
// connection to the same world in the same run, interleaved, and report
// the figures directly: requests per second on kept-alive
// connections and their ratio carbd/mitmdump (HTTP/1.1 and HTTP/2), the
// latency carbd adds to a request (p50, p99), a 100 MiB download's
// throughput carbd/direct, new TLS connections per second. Without
// mitmdump the mitmdump figures (and ratios) are left out.
//
// Each benchmark op is one round of every variant; a round takes longer
// than the default -benchtime, so `go test -bench Intercept -count 5`
// runs one round per count (about 20 s each on a 2-core VM).
func BenchmarkIntercept(b *testing.B) {
	env := newBenchEnv(b)
	b.Run("h1", func(b *testing.B) { env.keepAlive(b, false) })
	b.Run("h2", func(b *testing.B) { env.keepAlive(b, true) })
	b.Run("download-h1", func(b *testing.B) { env.download(b, false) })
	b.Run("download-h2", func(b *testing.B) { env.download(b, true) })
	b.Run("handshake", env.handshake)
}

// benchEnv is a world, carbd's proxy to it and mitmdump to it.
type benchEnv struct {
	w  *world
	tp *testProxy
	// vias: direct, carbd and (when installed) mitmdump.
	vias []via
	// decided and observed count carbd's decisions and the responses it
	// reported for provenance.
	decided, observed atomic.Int64
}

// via is one way to the world: a base URL and the CA its server is
// trusted with.
type via struct {
	name, base string
	roots      *x509.CertPool
}

func newBenchEnv(b *testing.B) *benchEnv { return newBenchEnvWith(b, true) }

// newBenchEnvWith is newBenchEnv, with mitmdump or without.
func newBenchEnvWith(b *testing.B, withMitm bool) *benchEnv {
	env := &benchEnv{w: newWorld(b)}
	// The decider looks at every field as testDecider does, but keeps
	// nothing: a benchmark of millions of requests must not measure a
	// growing log.
	dec := DeciderFunc(func(_ context.Context, r *Request) Verdict {
		env.decided.Add(1)
		for _, f := range r.Event.Fields {
			if strings.Contains(f.Value, secret) {
				return Verdict{Notice: "the request carries a sensitive value in " + f.Name}
			}
		}
		return Verdict{Release: true}
	})
	env.tp = newTestProxy(b, env.w, func(c *Config) {
		c.Decider = dec
		c.Observe = func(*Request, decide.Event) { env.observed.Add(1) }
	})
	env.vias = []via{
		{"direct", fmt.Sprintf("https://localhost:%d", env.w.addr.Port()), newPoolFromFile(b, env.w.caFile)},
		{"carbd", fmt.Sprintf("https://localhost:%d", env.tp.addr.Port()), env.tp.ca.Pool()},
	}
	if !withMitm {
		return env
	}
	if base, roots := mitmdump(b, env.w); base != "" {
		env.vias = append(env.vias, via{"mitmdump", base, roots})
	} else {
		b.Log("mitmdump is not installed (apt-get install mitmproxy): its figures are left out")
	}
	return env
}

// client returns an HTTP client of v; h2 picks the protocol, keepAlive
// whether connections are reused.
func (v via) client(h2, keepAlive bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: v.roots},
		ForceAttemptHTTP2:   h2,
		MaxIdleConnsPerHost: 64,
		DisableKeepAlives:   !keepAlive,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr}
}

// get fetches url and checks the answer: status 200, want bytes (-1: any).
func get(c *http.Client, url string, want int64) error {
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	if want >= 0 && n != want {
		return fmt.Errorf("%s: %d bytes, want %d", url, n, want)
	}
	return nil
}

// rotate returns the vias in an order that changes with each round, so
// that no variant always runs first (or right after another).
func (env *benchEnv) rotate(round int) []via {
	vs := slices.Clone(env.vias)
	k := round % len(vs)
	return append(vs[k:], vs[:k]...)
}

// Phases of a keep-alive round, per variant: how long one client
// measures latency (at least minSeq requests, in blocks of seqBlock),
// how long the parallel
// clients run, in slices of parSlice, and how many there are.
const (
	seqPhase   = 300 * time.Millisecond
	minSeq     = 100
	seqBlock   = 25
	parPhase   = 700 * time.Millisecond
	parSlice   = 100 * time.Millisecond
	parClients = 8
)

// keepAlive: small GETs on kept-alive connections. One client per
// variant, one request at a time, the variants taking turns every
// seqBlock requests (so that all see the same moments of a loaded
// machine), gives
// each variant's latency (p50, p99; carbd's added latency is its
// difference from direct's). parClients clients at once (HTTP/1.1: one
// connection each; HTTP/2: one connection for all), the variants taking
// turns in slices of parSlice, give requests per second.
func (env *benchEnv) keepAlive(b *testing.B, h2 bool) {
	lat := map[string][]time.Duration{}
	done := map[string]int64{}
	busy := map[string]time.Duration{}
	decided0, observed0 := env.decided.Load(), env.observed.Load()
	clients := map[string]*http.Client{}
	for _, v := range env.vias {
		c := v.client(h2, true)
		clients[v.name] = c
		defer c.CloseIdleConnections()
	}
	var viaCarbd int64
	count := func(v via, n int64) {
		if v.name == "carbd" {
			viaCarbd += n
		}
	}
	for round := range b.N {
		vs := env.rotate(round)
		for _, v := range vs {
			for range 20 { // connections and the leaf set up, code warm
				if err := get(clients[v.name], v.base+"/bench", 3); err != nil {
					b.Fatal(err)
				}
			}
			count(v, 20)
		}
		t0 := time.Now()
		for i := 0; time.Since(t0) < seqPhase*time.Duration(len(vs)) || i < minSeq; i += seqBlock {
			for _, v := range vs {
				// The first request of a block wakes what waited while
				// the other variants ran: not measured.
				for k := range 1 + seqBlock {
					t := time.Now()
					if err := get(clients[v.name], v.base+"/bench", 3); err != nil {
						b.Fatal(err)
					}
					if k > 0 {
						lat[v.name] = append(lat[v.name], time.Since(t))
					}
				}
				count(v, 1+seqBlock)
			}
		}
		for k := range int(parPhase / parSlice) {
			for _, v := range env.rotate(round + k) {
				n, d, err := burst(clients[v.name], v.base+"/bench", parSlice)
				if err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
				done[v.name] += n
				busy[v.name] += d
				count(v, n)
			}
		}
	}
	b.StopTimer()
	env.checkCarbd(b, decided0, observed0, viaCarbd)
	b.ReportMetric(0, "ns/op")
	rate := map[string][]float64{}
	for _, v := range env.vias {
		rate[v.name] = []float64{float64(done[v.name]) / busy[v.name].Seconds()}
		p50, p99 := quantile(lat[v.name], .5), quantile(lat[v.name], .99)
		b.ReportMetric(rate[v.name][0], v.name+"-req/s")
		b.ReportMetric(us(p50), v.name+"-p50-µs")
		b.ReportMetric(us(p99), v.name+"-p99-µs")
	}
	env.ratio(b, rate, "carbd", "direct", "")
	env.ratio(b, rate, "carbd", "mitmdump", "")
	b.ReportMetric(us(quantile(lat["carbd"], .5)-quantile(lat["direct"], .5)), "added-p50-µs")
	b.ReportMetric(us(quantile(lat["carbd"], .99)-quantile(lat["direct"], .99)), "added-p99-µs")
}

// burst runs parClients clients on c for d, each fetching url (a small
// answer) again and again; it returns how many requests were answered
// and how long it took.
func burst(c *http.Client, url string, d time.Duration) (int64, time.Duration, error) {
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, parClients)
	t0 := time.Now()
	stop := t0.Add(d)
	for range parClients {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if err := get(c, url, 3); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	close(errs)
	return done.Load(), el, <-errs
}

// downloadSize is the download the issue measures.
const downloadSize = 100 << 20

// download: one 100 MiB response per download on a kept-alive
// connection; each variant's median throughput, carbd's against direct
// TLS, and the process's CPU time per download through carbd against
// direct, with the cores each kept busy (client, world and proxy share
// this process and these cores: the proxy adds a TLS leg, a second
// decryption and encryption of every byte, so where the cores are the
// bound, throughput follows CPU).
func (env *benchEnv) download(b *testing.B, h2 bool) {
	mbps := map[string][]float64{}
	cpu := map[string][]float64{}
	cores := map[string][]float64{}
	decided0, observed0 := env.decided.Load(), env.observed.Load()
	var viaCarbd int64
	for round := range b.N {
		for _, v := range env.rotate(round) {
			c := v.client(h2, true)
			url := fmt.Sprintf("%s/big?n=%d", v.base, downloadSize)
			if err := get(c, url, downloadSize); err != nil { // connection up, buffers grown
				b.Fatal(err)
			}
			runs := 3
			if v.name == "mitmdump" {
				runs = 1 // about 1 s each: the reference, not the subject
			}
			for range runs {
				c0, t0 := cpuTime(), time.Now()
				if err := get(c, url, downloadSize); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				mbps[v.name] = append(mbps[v.name], downloadSize/d.Seconds()/1e6)
				used := (cpuTime() - c0).Seconds()
				cpu[v.name] = append(cpu[v.name], used)
				cores[v.name] = append(cores[v.name], used/d.Seconds())
			}
			if v.name == "carbd" {
				viaCarbd += int64(runs) + 1
			}
			c.CloseIdleConnections()
		}
	}
	b.StopTimer()
	env.checkCarbd(b, decided0, observed0, viaCarbd)
	b.ReportMetric(0, "ns/op")
	for _, v := range env.vias {
		b.ReportMetric(median(mbps[v.name]), v.name+"-MB/s")
	}
	env.ratio(b, mbps, "carbd", "direct", "")
	env.ratio(b, mbps, "carbd", "mitmdump", "")
	env.ratio(b, cpu, "carbd", "direct", "-cpu")
	if cpuTime() > 0 {
		// Cores this process kept busy: with as many as the machine
		// has, throughput is CPU-bound and carbd/direct ≈ 1/(carbd/direct-cpu).
		b.ReportMetric(median(cores["direct"]), "direct-cores")
		b.ReportMetric(median(cores["carbd"]), "carbd-cores")
	}
}

// handshake: a new TLS connection per request (keep-alive off),
// parClients clients at once, for parPhase per variant in slices of
// parSlice, the variants taking turns: connections per second.
// Through carbd each is two handshakes (client leg with a cached leaf,
// upstream leg verified) and a connection upstream.
func (env *benchEnv) handshake(b *testing.B) {
	done := map[string]int64{}
	busy := map[string]time.Duration{}
	decided0, observed0 := env.decided.Load(), env.observed.Load()
	var viaCarbd int64
	clients := map[string]*http.Client{}
	for _, v := range env.vias {
		clients[v.name] = v.client(false, false)
		if err := get(clients[v.name], v.base+"/bench", 3); err != nil {
			b.Fatal(err)
		}
		if v.name == "carbd" {
			viaCarbd++
		}
	}
	for round := range b.N {
		for k := range int(parPhase / parSlice) {
			for _, v := range env.rotate(round + k) {
				n, d, err := burst(clients[v.name], v.base+"/bench", parSlice)
				if err != nil {
					b.Fatalf("%s: %v", v.name, err)
				}
				done[v.name] += n
				busy[v.name] += d
				if v.name == "carbd" {
					viaCarbd += n
				}
			}
		}
	}
	b.StopTimer()
	env.checkCarbd(b, decided0, observed0, viaCarbd)
	b.ReportMetric(0, "ns/op")
	rate := map[string][]float64{}
	for _, v := range env.vias {
		rate[v.name] = []float64{float64(done[v.name]) / busy[v.name].Seconds()}
		b.ReportMetric(rate[v.name][0], v.name+"-conn/s")
	}
	env.ratio(b, rate, "carbd", "direct", "")
	env.ratio(b, rate, "carbd", "mitmdump", "")
}

// checkCarbd fails the benchmark unless carbd decided each request sent
// through it and reported each response for provenance: a fast proxy
// that skipped either would measure nothing.
func (env *benchEnv) checkCarbd(b *testing.B, decided0, observed0, n int64) {
	b.Helper()
	if d := env.decided.Load() - decided0; d < n {
		b.Fatalf("carbd decided %d requests, %d were sent through it", d, n)
	}
	if o := env.observed.Load() - observed0; o < n {
		b.Fatalf("carbd reported %d responses for provenance, %d were answered", o, n)
	}
}

// ratio reports median(m[a]) / median(m[base]) as "a/base<suffix>" when
// both were measured.
func (env *benchEnv) ratio(b *testing.B, m map[string][]float64, a, base, suffix string) {
	if len(m[a]) == 0 || len(m[base]) == 0 {
		return
	}
	if d := median(m[base]); d > 0 {
		b.ReportMetric(median(m[a])/d, a+"/"+base+suffix)
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// BenchmarkProxyRequest: one small GET at a time on a kept-alive
// connection, through carbd and directly, with the process's CPU time
// per request: with -benchmem, a profile's view of what one request
// costs (client, world and, through carbd, the proxy), steadier than
// wall time on a loaded machine. Not part of the report.
func BenchmarkProxyRequest(b *testing.B) {
	env := newBenchEnvWith(b, false)
	for _, h2 := range []bool{false, true} {
		for _, v := range env.vias {
			b.Run(fmt.Sprintf("%s/%s", map[bool]string{false: "h1", true: "h2"}[h2], v.name), func(b *testing.B) {
				c := v.client(h2, true)
				defer c.CloseIdleConnections()
				url := v.base + "/bench"
				if err := get(c, url, 3); err != nil {
					b.Fatal(err)
				}
				c0 := cpuTime()
				for b.Loop() {
					if err := get(c, url, 3); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(us(cpuTime()-c0)/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// BenchmarkTapIngress: what showing 16 KiB of a long response body to
// the response tracker costs, past the MiB it keeps (FeedServer: no
// synthetic segment, the bytes are counted). Not in the report.
func BenchmarkTapIngress(b *testing.B) {
	rw, err := newRespTap(newSegmenter(netip.MustParseAddrPort("10.0.0.2:40000"), netip.MustParseAddrPort("10.0.0.1:443")))
	if err != nil {
		b.Fatal(err)
	}
	fr, err := newH1Framer(rw.sg.client, rw.sg.server, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	effs, err := fr.feed([]byte("GET /big HTTP/1.1\r\nHost: world.test\r\n\r\n"), false)
	if err != nil || len(effs) != 1 {
		b.Fatalf("framed %d requests: %v", len(effs), err)
	}
	rw.pair(effs[0].req)
	nop := func(*respwatch.Result) {}
	rw.ingress(fmt.Appendf(nil, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", int64(1)<<50), false, nop)
	buf := make([]byte, chunkSize)
	b.SetBytes(chunkSize)
	for b.Loop() {
		rw.ingress(buf, false, nop)
	}
	if rw.responses != 0 {
		b.Fatalf("the tracker saw the end of a response that has not ended")
	}
}
