package nfq

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

func families(e *env) []struct {
	name         string
	guest, world netip.Addr
	router       netip.Addr
} {
	return []struct {
		name         string
		guest, world netip.Addr
		router       netip.Addr
	}{
		{"ipv4", e.topo.Guest4, e.topo.World4, e.topo.Router4},
		{"ipv6", e.topo.Guest6, e.topo.World6, e.topo.Router6},
	}
}

// TestHTTP: a request to a released host arrives intact and is answered;
// one to a refused host leaves zero bytes in the world and the client
// fails at once with a reset. IPv4 and IPv6.
func TestHTTP(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{})
	e.dec.on(Release, host("allowed.test"))
	e.dec.on(Refuse, host("refused.test"))
	body := bytes.Repeat([]byte("carbd-body-0123456789"), 1000) // 21 kB: several segments
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(fam.world, 8080)
			srv := httpServer(t, e.topo.World, addr)
			out, errOut, code := curlStdin(t, e.topo.Guest, body, "-H", "Host: allowed.test", "--data-binary", "@-", urlOf(addr, "/upload"))
			if code != 0 {
				e.dec.log(t)
				t.Fatalf("released POST: curl exit %d: %s", code, errOut)
			}
			if want := "POST /upload " + sum(body); out != want {
				t.Fatalf("released POST answered %q, want %q", out, want)
			}
			before := srv.bytes.Load()
			onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte("/exfil"))
			_, errOut, code = curlStdin(t, e.topo.Guest, body, "-H", "Host: refused.test", "--data-binary", "@-", urlOf(addr, "/exfil"))
			if code != 56 || !strings.Contains(errOut, "reset") {
				t.Fatalf("refused POST: curl exit %d %q, want 56 (connection reset)", code, errOut)
			}
			settle()
			if n := srv.bytes.Load() - before; n != 0 || onWire.frames.Load() != 0 {
				t.Fatalf("the world read %d bytes of the refused request (%d frames on its wire)", n, onWire.frames.Load())
			}
			if n := len(e.dec.decisions(func(d decision) bool {
				return d.ev.Dest.Host == "refused.test" && d.meta.Flow.Dst == fam.world
			})); n != 1 {
				e.dec.log(t)
				t.Errorf("the refused request was decided %d times, want once", n)
			}
		})
	}
	s := e.loop.Stats()
	if s.RSTs < 2 {
		t.Errorf("%d RSTs sent, want one per refused connection (2)", s.RSTs)
	}
}

func curlStdin(t testing.TB, ns string, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	return curlIn(t, ns, bytes.NewReader(stdin), args...)
}

// guestClient is an HTTP client in the guest with at most one connection
// per host, kept alive.
func guestClient(e *env) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableCompression: true,
		MaxConnsPerHost:    1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return tcxtest.Dial(e.topo.Guest, network, netip.MustParseAddrPort(addr), netip.AddrPort{}, 5*time.Second)
		},
	}, Timeout: 20 * time.Second}
}

// TestKeepAliveRequestsDecidedEach: on one kept-alive connection, each
// request is queued by the fast path (beyond the released byte range)
// and decided on its own; a refused later request resets the connection
// and never reaches the server.
func TestKeepAliveRequestsDecidedEach(t *testing.T) {
	e := newEnv(t, envOpt{})
	e.dec.on(Release, host("allowed.test"))
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(fam.world, 8082)
			var paths []string
			var mu sync.Mutex
			l := &counted{Listener: tcxtest.Listen(t, e.topo.World, addr)}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				paths = append(paths, r.URL.Path)
				mu.Unlock()
				io.WriteString(w, "ok "+r.URL.Path)
			})}
			go srv.Serve(l)
			t.Cleanup(func() { srv.Close() })
			client := guestClient(e)
			defer client.CloseIdleConnections()
			base, err := e.dp.Counters()
			if err != nil {
				t.Fatal(err)
			}
			get := func(h, path string) (string, error) {
				method, body := "GET", io.Reader(nil)
				if h == "refused.test" {
					// Not idempotent: the client must not retry it on a new
					// connection.
					method, body = "POST", strings.NewReader("payload")
				}
				req, _ := http.NewRequest(method, urlOf(addr, path), body)
				req.Host = h
				resp, err := client.Do(req)
				if err != nil {
					return "", err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				return string(b), err
			}
			for _, path := range []string{"/one", "/two"} {
				if got, err := get("allowed.test", path); err != nil || got != "ok "+path {
					t.Fatalf("GET %s: %q %v", path, got, err)
				}
			}
			if _, err := get("refused.test", "/three"); err == nil || !strings.Contains(err.Error(), "reset") {
				t.Fatalf("POST /three to a refused host: %v, want a connection reset", err)
			}
			settle()
			mu.Lock()
			got := strings.Join(paths, ",")
			mu.Unlock()
			if got != "/one,/two" || l.conns.Load() != 1 {
				t.Fatalf("server saw %q on %d connections, want /one,/two on one", got, l.conns.Load())
			}
			ds := e.dec.decisions(func(d decision) bool { return d.meta.Flow.Dst == fam.world && d.meta.Kind == netparse.KindHTTP })
			if len(ds) != 3 {
				e.dec.log(t)
				t.Fatalf("%d HTTP decisions, want one per request (3)", len(ds))
			}
			for i, d := range ds {
				if d.meta.Flow != ds[0].meta.Flow {
					t.Errorf("request %d on flow %s, want %s", i, d.meta.Flow, ds[0].meta.Flow)
				}
				if i > 0 && d.meta.Seq != ds[i-1].meta.End {
					t.Errorf("request %d covers [%d,%d), previous ended at %d", i, d.meta.Seq, d.meta.End, ds[i-1].meta.End)
				}
			}
			c, err := e.dp.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if n := c.Sub(base)[tcx.QueueBeyondRange].Packets; n < 2 {
				t.Errorf("the fast path queued %d packets beyond the released range, want the 2 later requests", n)
			}
		})
	}
}

// TestUDP: each datagram is decided on its own; released ones arrive
// intact, refused ones not at all.
func TestUDP(t *testing.T) {
	e := newEnv(t, envOpt{})
	e.dec.on(Release, dstPort(9100))
	e.dec.on(Refuse, dstPort(9101))
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			ok := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 9100))
			no := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 9101))
			want := [][]byte{[]byte("datagram one"), bytes.Repeat([]byte{0xab}, 1400), []byte("datagram three")}
			sendUDP(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 9100), 41000, want...)
			sendUDP(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 9101), 41001, []byte("secret one"), []byte("secret two"))
			if !tcxtest.Eventually(10*time.Second, func() bool { return ok.n.Load() == 3 }) {
				t.Fatalf("world got %d of 3 released datagrams", ok.n.Load())
			}
			for i, got := range ok.all() {
				if !bytes.Equal(got, want[i]) {
					t.Errorf("datagram %d arrived as %q", i, got)
				}
			}
			settle()
			if no.n.Load() != 0 {
				t.Fatalf("world got %d refused datagrams", no.n.Load())
			}
			if n := len(e.dec.decisions(func(d decision) bool { return d.meta.Flow.Dst == fam.world && d.ev.Op == "udp:datagram" })); n != 5 {
				t.Errorf("%d datagram decisions, want 5 (one each)", n)
			}
			// A connected client learns of the refusal (ICMP
			// administratively prohibited) on its next read.
			c, err := tcxtest.Dial(e.topo.Guest, "udp", netip.AddrPortFrom(fam.world, 9101), netip.AddrPort{}, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte("refused"))
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Read(make([]byte, 16))
			if err == nil || !(strings.Contains(err.Error(), "no route to host") || strings.Contains(err.Error(), "permission denied")) {
				t.Errorf("read after a refused datagram: %v, want the ICMP error", err)
			}
		})
	}
}

// TestDNS: a query whose name carries data under a sensitive label is
// refused over UDP and TCP (the server never sees it); others are
// answered.
func TestDNS(t *testing.T) {
	testutil.RequireTool(t, "dig")
	e := newEnv(t, envOpt{})
	e.dec.on(Refuse, func(_ Meta, ev *decide.Event) bool {
		return ev.Op == "dns:query" && strings.Contains(ev.Obj, ".secret.")
	})
	e.dec.on(Release, op("dns:query"))
	for _, fam := range families(e) {
		srv := newDNSServer(t, e.topo.World, netip.AddrPortFrom(fam.world, 53))
		for _, proto := range []string{"udp", "tcp"} {
			t.Run(fam.name+"-"+proto, func(t *testing.T) {
				args := []string{"@" + fam.world.String(), "+tries=1", "+time=2", "+short"}
				if proto == "tcp" {
					args = append(args, "+tcp")
				}
				name := "ok-" + proto + ".example.test"
				out, code := run(e.topo.Guest, "dig", append(args, name)...)
				if code != 0 || strings.TrimSpace(out) != "10.77.2.2" {
					t.Fatalf("dig %s: exit %d %q", name, code, out)
				}
				leak := "6a6f686e2d646f65-" + proto + ".secret.example.test"
				onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte("6a6f686e2d646f65"))
				out, code = run(e.topo.Guest, "dig", append(args, leak)...)
				if code == 0 || slicesContains(strings.Fields(out), "10.77.2.2") {
					t.Fatalf("dig %s answered: %q", leak, out)
				}
				settle()
				if n := onWire.frames.Load(); n != 0 {
					t.Fatalf("%d frames with the refused name on the world's wire", n)
				}
				for _, n := range srv.asked() {
					if strings.Contains(n, "secret") {
						t.Fatalf("the world's DNS server was asked %q", n)
					}
				}
				if !slicesContains(srv.asked(), name) {
					t.Errorf("the server was not asked the released name %s: %q", name, srv.asked())
				}
				// The client fails at once: a RST over TCP, an ICMP
				// "administratively prohibited" over UDP (EHOSTUNREACH for
				// IPv4, EACCES for IPv6).
				wantErr := map[string]string{"udp": "host unreachable", "tcp": "connection reset"}[proto]
				if proto == "udp" && fam.world.Is6() {
					wantErr = "permission denied"
				}
				if !strings.Contains(out, wantErr) {
					t.Errorf("refused query: dig exit %d %q, want %q", code, strings.TrimSpace(out), wantErr)
				}
			})
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestICMPEcho: echo payloads are content; a refused pattern never
// reaches the world, an allowed one is answered.
func TestICMPEcho(t *testing.T) {
	testutil.RequireTool(t, "ping")
	e := newEnv(t, envOpt{})
	bad := []byte{0xde, 0xad, 0xbe, 0xef}
	e.dec.on(Refuse, func(_ Meta, ev *decide.Event) bool {
		return ev.Op == "icmp:echo" && strings.Contains(ev.Content, string(bad))
	})
	e.dec.on(Release, op("icmp:echo"))
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			family, proto, req := 4, 1, byte(8)
			if fam.world.Is6() {
				family, proto, req = 6, 58, 128
			}
			// Go's raw sockets hand over the ICMP message (the IPv4
			// header stripped).
			sink := tcxtest.RawSinkFunc(t, e.topo.World, family, proto, func(b []byte) bool {
				return len(b) > 8 && b[0] == req && bytes.Contains(b, bad)
			})
			allowed := tcxtest.RawSinkFunc(t, e.topo.World, family, proto, func(b []byte) bool {
				return len(b) > 8 && b[0] == req && bytes.Contains(b, []byte{0xa1, 0xb2, 0xc3})
			})
			ping := func(pattern string) int {
				args := []string{"-n", "-c", "1", "-W", "3", "-p", pattern}
				if family == 6 {
					args = append(args, "-6")
				}
				_, code := run(e.topo.Guest, "ping", append(args, fam.world.String())...)
				return code
			}
			if code := ping("a1b2c3"); code != 0 {
				t.Fatalf("ping with an allowed payload: exit %d", code)
			}
			if code := ping("deadbeef"); code == 0 {
				t.Fatal("ping with a refused payload was answered")
			}
			settle()
			if n := sink.Packets.Load(); n != 0 {
				t.Fatalf("the world saw %d echo requests with the refused payload", n)
			}
			if n := allowed.Packets.Load(); n != 1 {
				t.Fatalf("the world saw %d echo requests with the allowed payload, want 1", n)
			}
		})
	}
}

// TestFragmentedDatagram: a UDP datagram larger than the MTU is
// reassembled before the queue and decided whole: released, it arrives
// intact; refused, no fragment of it does.
func TestFragmentedDatagram(t *testing.T) {
	e := newEnv(t, envOpt{})
	e.dec.on(Release, dstPort(9110))
	e.dec.on(Refuse, dstPort(9111))
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			ok := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 9110))
			no := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 9111))
			onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte("refused-frag"))
			released := sniff(t, e.topo.World, e.topo.WorldIf, []byte("fragment-me-"))
			big := bytes.Repeat([]byte("fragment-me-"), 400) // 4800 bytes over a 1500 MTU
			secret := bytes.Repeat([]byte("refused-frag"), 400)
			sendUDP(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 9110), 0, big)
			sendUDP(t, e.topo.Guest, netip.AddrPortFrom(fam.world, 9111), 0, secret)
			if !tcxtest.Eventually(10*time.Second, func() bool { return ok.n.Load() == 1 }) {
				t.Fatalf("world got %d of the released datagram", ok.n.Load())
			}
			if got := ok.all()[0]; !bytes.Equal(got, big) {
				t.Fatalf("released datagram arrived with %d bytes, want %d intact", len(got), len(big))
			}
			// The sniffer reads on its own goroutine: its count may lag
			// the sink's.
			if !tcxtest.Eventually(5*time.Second, func() bool { return released.frames.Load() >= 4 }) {
				t.Fatalf("the sniffer saw %d frames of the released datagram, want its 4 fragments", released.frames.Load())
			}
			settle()
			if no.n.Load() != 0 || onWire.frames.Load() != 0 {
				t.Fatalf("the refused datagram arrived (%d datagrams, %d frames on the world's wire)", no.n.Load(), onWire.frames.Load())
			}
			ds := e.dec.decisions(func(d decision) bool { return d.meta.Flow.Dst == fam.world && d.meta.Flow.DstPort == 9111 })
			if len(ds) != 1 || len(ds[0].ev.Content) != len(big) {
				t.Fatalf("the refused datagram was decided %d times (want once, whole)", len(ds))
			}
		})
	}
}

// TestOpaqueProtocol: an IP protocol carbd does not parse is decided per
// packet as an opaque effect.
func TestOpaqueProtocol(t *testing.T) {
	e := newEnv(t, envOpt{})
	e.dec.on(Release, func(_ Meta, ev *decide.Event) bool { return ev.Op == "ip:opaque" && ev.Dest.Proto == "253" })
	e.dec.on(Refuse, func(_ Meta, ev *decide.Event) bool { return ev.Op == "ip:opaque" && ev.Dest.Proto == "254" })
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			family := 4
			if fam.world.Is6() {
				family = 6
			}
			ok := tcxtest.RawSink(t, e.topo.World, family, 253)
			no := tcxtest.RawSink(t, e.topo.World, family, 254)
			for i := 0; i < 3; i++ {
				if err := tcxtest.SendRaw(e.topo.Guest, fam.world, 253, []byte(fmt.Sprintf("experimental %d", i))); err != nil {
					t.Fatal(err)
				}
				if err := tcxtest.SendRaw(e.topo.Guest, fam.world, 254, []byte("covert channel")); err != nil {
					t.Fatal(err)
				}
			}
			if !tcxtest.Eventually(10*time.Second, func() bool { return ok.Packets.Load() == 3 }) {
				t.Fatalf("world got %d of 3 released packets", ok.Packets.Load())
			}
			settle()
			if no.Packets.Load() != 0 {
				t.Fatalf("world got %d refused packets", no.Packets.Load())
			}
			for _, d := range e.dec.decisions(func(d decision) bool { return d.meta.Flow.Dst == fam.world && d.ev.Op == "ip:opaque" }) {
				if !d.ev.Opaque {
					t.Errorf("an opaque protocol's event is not marked opaque: %s", d.ev.Summary())
				}
			}
		})
	}
}

// TestQUICInitial: UDP 443 with a QUIC Initial is decided by its SNI; a
// released connection's later (encrypted) datagrams take the fast path,
// a refused one's are dropped there.
func TestQUICInitial(t *testing.T) {
	e := newEnv(t, envOpt{})
	initial := quicInitial(t)
	short := append([]byte{0x40}, bytes.Repeat([]byte{0x5a}, 60)...) // a short-header packet
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			sink := udpPayloadSink(t, e.topo.World, netip.AddrPortFrom(fam.world, 443))
			dst := netip.AddrPortFrom(fam.world, 443)
			e.dec.reset()
			e.dec.on(Refuse, func(_ Meta, ev *decide.Event) bool { return ev.Op == "quic:initial" && ev.Dest.Host == "example.com" })
			sendUDP(t, e.topo.Guest, dst, 42443, initial)
			ds := waitDecisions(t, e, 1, func(d decision) bool { return d.meta.Flow.Dst == fam.world })
			if ds[0].ev.Op != "quic:initial" || ds[0].ev.Dest.Host != "example.com" {
				t.Fatalf("decided %s, want quic:initial to example.com", ds[0].ev.Summary())
			}
			sendUDP(t, e.topo.Guest, dst, 42443, short, short)
			settle()
			if sink.n.Load() != 0 {
				t.Fatalf("world got %d datagrams of the refused connection", sink.n.Load())
			}

			e.dec.reset()
			e.dec.on(Release, func(_ Meta, ev *decide.Event) bool { return ev.Op == "quic:initial" && ev.Dest.Host == "example.com" })
			sendUDP(t, e.topo.Guest, dst, 42444, initial)
			if !tcxtest.Eventually(10*time.Second, func() bool { return sink.n.Load() == 1 }) {
				t.Fatal("the released Initial did not arrive")
			}
			if !bytes.Equal(sink.all()[0], initial) {
				t.Fatal("the released Initial arrived altered")
			}
			before := e.loop.Stats().Received
			sendUDP(t, e.topo.Guest, dst, 42444, short, short, short)
			if !tcxtest.Eventually(10*time.Second, func() bool { return sink.n.Load() == 4 }) {
				t.Fatalf("world got %d of the released connection's 3 later datagrams", sink.n.Load()-1)
			}
			if n := e.loop.Stats().Received - before; n != 0 {
				t.Errorf("%d of the released connection's datagrams went through the queue, want the fast path", n)
			}
		})
	}
}

// quicInitial is RFC 9001 Appendix A.2's client Initial (SNI
// example.com), kept in netparse's testdata.
func quicInitial(t testing.TB) []byte {
	t.Helper()
	raw, err := os.ReadFile("../netparse/testdata/rfc9001-a.txt")
	if err != nil {
		t.Fatal(err)
	}
	var hexs strings.Builder
	in := false
	for _, line := range strings.Split(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, "protected "), line == "protected":
			in = true
			hexs.WriteString(strings.TrimPrefix(line, "protected"))
		case in && strings.HasPrefix(line, " "):
			hexs.WriteString(line)
		default:
			in = false
		}
	}
	b, err := hex.DecodeString(strings.Join(strings.Fields(hexs.String()), ""))
	if err != nil || len(b) != 1200 {
		t.Fatalf("rfc9001 protected packet: %d bytes, %v", len(b), err)
	}
	return b
}

func waitDecisions(t testing.TB, e *env, n int, f func(d decision) bool) []decision {
	t.Helper()
	var ds []decision
	if !tcxtest.Eventually(10*time.Second, func() bool { ds = e.dec.decisions(f); return len(ds) >= n }) {
		e.dec.log(t)
		t.Fatalf("%d decisions, want %d", len(ds), n)
	}
	return ds
}

// TestLocalInput: traffic to the host's own addresses (INPUT) is decided
// like forwarded traffic.
func TestLocalInput(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{})
	e.dec.on(Release, host("allowed.test"))
	for _, fam := range families(e) {
		t.Run(fam.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(fam.router, 8090)
			srv := httpServer(t, e.topo.Router, addr)
			out, errOut, code := curl(t, e.topo.Guest, "-H", "Host: allowed.test", urlOf(addr, "/local"))
			if code != 0 || !strings.HasPrefix(out, "GET /local ") {
				t.Fatalf("released request to the host: exit %d %q %s", code, out, errOut)
			}
			before := srv.bytes.Load()
			_, errOut, code = curl(t, e.topo.Guest, "-H", "Host: refused.test", urlOf(addr, "/local"))
			if code != 56 {
				t.Fatalf("refused request to the host: exit %d %s, want 56 (reset)", code, errOut)
			}
			settle()
			if n := srv.bytes.Load() - before; n != 0 {
				t.Fatalf("the host read %d bytes of the refused request", n)
			}
			ds := e.dec.decisions(func(d decision) bool { return d.meta.Flow.Dst == fam.router })
			if len(ds) == 0 || !ds[0].meta.Local {
				t.Fatalf("decisions for the host's address: %d, local %v", len(ds), len(ds) > 0 && ds[0].meta.Local)
			}
		})
	}
}

// TestHold: a held request is not forwarded; released later, the
// client's request completes; refused later, the client fails at once
// with a reset.
func TestHold(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{})
	e.dec.on(Hold, host("held.test"))
	addr := netip.AddrPortFrom(e.topo.World4, 8084)
	srv := httpServer(t, e.topo.World, addr)
	for _, tc := range []struct {
		name string
		v    Verdict
	}{{"then-release", Release}, {"then-refuse", Refuse}} {
		t.Run(tc.name, func(t *testing.T) {
			type res struct {
				out, err string
				code     int
			}
			done := make(chan res, 1)
			go func() {
				o, er, c := curl(t, e.topo.Guest, "-H", "Host: held.test", urlOf(addr, "/held"))
				done <- res{o, er, c}
			}()
			d := e.dec.waitHeld(t)
			settle()
			before := srv.bytes.Load()
			select {
			case r := <-done:
				t.Fatalf("curl returned while its request was held: %+v", r)
			default:
			}
			if n := srv.bytes.Load(); n != before {
				t.Fatal("the server read bytes of a held request")
			}
			if s := e.loop.Stats(); s.Held == 0 {
				t.Fatalf("nothing held: %s", s.String())
			}
			if !e.loop.Resolve(d.out.Ticket, tc.v, "test") {
				t.Fatal("Resolve: the ticket was not held")
			}
			r := <-done
			switch tc.v {
			case Release:
				if r.code != 0 || !strings.HasPrefix(r.out, "GET /held ") {
					t.Fatalf("released after the hold: exit %d %q %s", r.code, r.out, r.err)
				}
			case Refuse:
				if r.code != 56 || !strings.Contains(r.err, "reset") {
					t.Fatalf("refused after the hold: exit %d %s, want 56 (reset)", r.code, r.err)
				}
				if n := srv.bytes.Load(); n != before {
					t.Fatal("the server read bytes of the refused request")
				}
			}
			if e.loop.Resolve(d.out.Ticket, Release, "again") {
				t.Error("a second Resolve of the same ticket was taken")
			}
		})
	}
}

// TestHoldTimeout: a held effect nobody resolves is refused at the hold
// deadline and its client reset.
func TestHoldTimeout(t *testing.T) {
	testutil.RequireTool(t, "curl")
	e := newEnv(t, envOpt{cfg: func(c *Config) { c.HoldTimeout = 1500 * time.Millisecond }})
	e.dec.on(Hold, host("held.test"))
	addr := netip.AddrPortFrom(e.topo.World4, 8085)
	srv := httpServer(t, e.topo.World, addr)
	_, errOut, code := curl(t, e.topo.Guest, "-H", "Host: held.test", urlOf(addr, "/never"))
	if code != 56 {
		t.Fatalf("held past the deadline: curl exit %d %s, want 56 (reset)", code, errOut)
	}
	if srv.bytes.Load() != 0 {
		t.Fatal("the server read bytes of the timed-out request")
	}
	s := e.loop.Stats()
	if s.Verdicts[DropHoldTimeout] == 0 {
		t.Fatalf("no packet dropped for the hold timeout: %s", s.String())
	}
}
