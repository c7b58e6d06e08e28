package nfq

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/hooks/tcx/tcxtest"
)

// The tests in this file run the network path under the tap offloads of
// a Cloud Hypervisor guest (vnettap_linux_test.go): the guest's kernel
// sends TSO and USO super-packets with partial checksums, and the relay
// writes them into the host's tap with their virtio-net headers. They
// run twice: with the queue's GSO flag off (the kernel segments GSO
// packets and completes checksums before queueing) and on (queued whole,
// NFQA_SKB_CSUMNOTREADY).

// queueLog records what the verdict loop received.
type queueLog struct {
	mu                 sync.Mutex
	packets, big, part int
	noHW               int // without NFQA_HWADDR
	largest            int
}

func (q *queueLog) hook(p *packet) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.packets++
	if len(p.data) > 1500 {
		q.big++
	}
	if p.csumNotReady {
		q.part++
	}
	if !p.hasHW {
		q.noHW++
	}
	q.largest = max(q.largest, len(p.data))
}

func (q *queueLog) snapshot() queueLog {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueLog{packets: q.packets, big: q.big, part: q.part, noHW: q.noHW, largest: q.largest}
}

func (q *queueLog) String() string {
	s := q.snapshot()
	return fmt.Sprintf("%d packets, %d over 1500 bytes (largest %d), %d with CSUMNOTREADY, %d without a hardware address", s.packets, s.big, s.largest, s.part, s.noHW)
}

// contains matches events whose content carries s.
func contains(s string) func(Meta, *decide.Event) bool {
	return func(_ Meta, ev *decide.Event) bool { return strings.Contains(ev.Content, s) }
}

// checkQueueSaw checks what the queue received against the GSO flag:
// without it, segments of at most the MTU with finished checksums; with
// it, super-packets with CSUMNOTREADY.
//
// Either way the parser must take every packet: a partial checksum it
// took for a corrupt one would be dropped for a retransmission
// (drop-retry) that carries the same partial checksum.
func checkQueueSaw(t *testing.T, e *env, gso bool, q *queueLog) {
	t.Helper()
	s := q.snapshot()
	t.Logf("queue received %s", q.String())
	if n := e.loop.Stats().Verdicts[DropRetry]; n != 0 {
		t.Errorf("%d packets dropped for the sender to retry (bad checksum, window, memory), want none", n)
	}
	if !gso && (s.big != 0 || s.part != 0) {
		t.Errorf("without the GSO flag the queue got %d packets over the MTU and %d with partial checksums, want none", s.big, s.part)
	}
	if gso && (s.big == 0 || s.part == 0) {
		t.Errorf("with the GSO flag the queue got %d packets over the MTU and %d with partial checksums, want super-packets with partial checksums", s.big, s.part)
	}
}

// TestOffloadTCP: HTTP requests sent by a guest kernel with TSO and
// checksum offload are held, parsed and decided like small segments: a
// released upload arrives intact, a refused one leaves no byte in the
// world, a secret split across two super-packets is seen whole and
// refused, and two requests in one super-packet are decided each.
func TestOffloadTCP(t *testing.T) {
	testutil.RequireTool(t, "curl")
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprintf("gso=%v", gso), func(t *testing.T) {
			q := &queueLog{}
			e, g := newTapEnv(t, envOpt{cfg: func(c *Config) { c.GSO = gso }, hook: q.hook})
			t.Logf("host tap offloads %#x", g.offloads)
			defer func() { t.Logf("relay guest->host: %s", g.out.String()) }()
			const secret = "SECRET-TOKEN-4242"
			e.dec.on(Refuse, contains(secret))
			e.dec.on(Release, host("allowed.test"))
			e.dec.on(Refuse, host("refused.test"))
			body := bytes.Repeat([]byte("carbd-offload-0123456789"), 8000) // 192 kB
			for _, fam := range families(e) {
				t.Run(fam.name, func(t *testing.T) {
					tso := uint8(vnetGSOTCPv4)
					if fam.guest.Is6() {
						tso = vnetGSOTCPv6
					}
					addr := netip.AddrPortFrom(fam.world, 8090)
					srv := httpServer(t, e.topo.World, addr)

					before := g.out.gsoFrames(tso)
					out, errOut, code := curlStdin(t, e.topo.Guest, body, "-H", "Host: allowed.test", "--data-binary", "@-", urlOf(addr, "/upload"))
					if code != 0 {
						e.dec.log(t)
						t.Fatalf("released POST: curl exit %d: %s", code, errOut)
					}
					if want := "POST /upload " + sum(body); out != want {
						t.Fatalf("released POST answered %q, want %q", out, want)
					}
					if n := g.out.gsoFrames(tso) - before; n == 0 || g.out.largest() <= 1514 {
						t.Fatalf("the guest sent %d TSO frames (largest frame %d bytes): the offload path was not taken", n, g.out.largest())
					}
					// The TC program runs once per super-packet: the upload's
					// flow averages more than an MTU per packet.
					flows, err := e.dp.Flows()
					if err != nil {
						t.Fatal(err)
					}
					var upload tcx.Flow
					for _, f := range flows {
						if f.Key.Dst == fam.world && f.Key.DstPort == 8090 && f.Bytes > upload.Bytes {
							upload = f
						}
					}
					t.Logf("TC program: upload flow %d packets, %d bytes (%d per packet)", upload.Packets, upload.Bytes, upload.Bytes/max(upload.Packets, 1))
					if upload.Packets == 0 || upload.Bytes/upload.Packets <= 1514 {
						t.Errorf("the TC program saw the %d-byte upload as %d packets: not as super-packets", len(body), upload.Packets)
					}

					t.Run("refused", func(t *testing.T) {
						before := srv.bytes.Load()
						onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte("/exfil"))
						_, errOut, code := curlStdin(t, e.topo.Guest, body, "-H", "Host: refused.test", "--data-binary", "@-", urlOf(addr, "/exfil"))
						if code != 56 || !strings.Contains(errOut, "reset") {
							t.Fatalf("refused POST: curl exit %d %q, want 56 (connection reset)", code, errOut)
						}
						settle()
						if n := srv.bytes.Load() - before; n != 0 || onWire.frames.Load() != 0 {
							t.Fatalf("the world read %d bytes of the refused request (%d frames on its wire)", n, onWire.frames.Load())
						}
					})

					// The secret starts in one super-packet and ends in the
					// next: the head, 6 kB of body and "SECRET-TO" in one
					// write, then "KEN-4242" and 6 kB more in a second
					// (TCP_NODELAY, autocorking off: one super-packet each).
					// Written back to back: a pause longer than PartAfter
					// would have the first half decided as a body part of
					// its own (see docs/network.md, offloads).
					t.Run("secret-across-super-packets", func(t *testing.T) {
						pad := strings.Repeat("x", 6000)
						part1 := pad + secret[:9]
						part2 := secret[9:] + pad
						head := fmt.Sprintf("POST /split HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n", len(part1)+len(part2))
						onWire1 := sniff(t, e.topo.World, e.topo.WorldIf, []byte(secret[:9]))
						onWire2 := sniff(t, e.topo.World, e.topo.WorldIf, []byte(secret[9:]))
						before := g.out.gsoFrames(tso)
						resp := rawRequest(t, e, addr, head+part1, part2)
						settle()
						if !strings.Contains(resp, "reset") {
							e.dec.log(t)
							t.Errorf("the split secret's request got %q, want a connection reset", resp)
						}
						if n := g.out.gsoFrames(tso) - before; n < 2 {
							t.Errorf("the request went out in %d TSO frames, want one per write (2)", n)
						}
						if n1, n2 := onWire1.frames.Load(), onWire2.frames.Load(); n1 != 0 || n2 != 0 {
							e.dec.log(t)
							t.Fatalf("the secret's halves reached the world's wire (%d and %d frames)", n1, n2)
						}
						if len(e.dec.decisions(func(d decision) bool {
							return d.meta.Flow.Dst == fam.world && strings.Contains(d.ev.Content, secret) && d.out.Verdict == Refuse
						})) == 0 {
							e.dec.log(t)
							t.Fatal("no decision saw the secret whole")
						}
					})

					// Kept alive: each 30 kB request is a few super-packets
					// past the released byte range; the fast path queues each
					// (queue-beyond-range) and a refused third never arrives.
					t.Run("keep-alive", func(t *testing.T) {
						kaddr := netip.AddrPortFrom(fam.world, 8091)
						var mu sync.Mutex
						var paths []string
						l := &counted{Listener: tcxtest.Listen(t, e.topo.World, kaddr)}
						ksrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
							b, _ := io.ReadAll(r.Body)
							mu.Lock()
							paths = append(paths, r.URL.Path)
							mu.Unlock()
							fmt.Fprintf(w, "%s %s", r.URL.Path, sum(b))
						})}
						go ksrv.Serve(l)
						t.Cleanup(func() { ksrv.Close() })
						client := guestClient(e)
						defer client.CloseIdleConnections()
						base, err := e.dp.Counters()
						if err != nil {
							t.Fatal(err)
						}
						big := bytes.Repeat([]byte("k"), 30000)
						post := func(path string, body []byte) (string, error) {
							req, _ := http.NewRequest("POST", urlOf(kaddr, path), bytes.NewReader(body))
							req.Host = "allowed.test"
							resp, err := client.Do(req)
							if err != nil {
								return "", err
							}
							defer resp.Body.Close()
							b, err := io.ReadAll(resp.Body)
							return string(b), err
						}
						for _, path := range []string{"/one", "/two"} {
							if got, err := post(path, big); err != nil || got != path+" "+sum(big) {
								t.Fatalf("POST %s: %q %v", path, got, err)
							}
						}
						dirty := append(bytes.Clone(big), secret...)
						if _, err := post("/three", dirty); err == nil || !strings.Contains(err.Error(), "reset") {
							t.Fatalf("POST /three with the secret: %v, want a connection reset", err)
						}
						settle()
						mu.Lock()
						got := strings.Join(paths, ",")
						mu.Unlock()
						if got != "/one,/two" || l.conns.Load() != 1 {
							t.Fatalf("server saw %q on %d connections, want /one,/two on one", got, l.conns.Load())
						}
						c, err := e.dp.Counters()
						if err != nil {
							t.Fatal(err)
						}
						if n := c.Sub(base)[tcx.QueueBeyondRange].Packets; n < 2 {
							t.Errorf("the fast path queued %d packets beyond the released range, want the 2 later requests", n)
						}
					})

					// Two pipelined requests in one write: one super-packet.
					// The first is released, the second carries the secret.
					t.Run("two-requests-one-super-packet", func(t *testing.T) {
						b1 := strings.Repeat("a", 3000)
						b2 := strings.Repeat("b", 3000) + secret
						reqs := fmt.Sprintf("POST /first HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n%s", len(b1), b1) +
							fmt.Sprintf("POST /second HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: %d\r\n\r\n%s", len(b2), b2)
						onWire := sniff(t, e.topo.World, e.topo.WorldIf, []byte(secret))
						onWire2 := sniff(t, e.topo.World, e.topo.WorldIf, []byte("/second"))
						before := g.out.gsoFrames(tso)
						if resp := rawRequest(t, e, addr, reqs); !strings.Contains(resp, "reset") {
							t.Errorf("the pipelined requests got %q, want a connection reset", resp)
						}
						settle()
						if n := g.out.gsoFrames(tso) - before; n < 1 {
							t.Errorf("the requests went out in %d TSO frames, want one", n)
						}
						if n1, n2 := onWire.frames.Load(), onWire2.frames.Load(); n1 != 0 || n2 != 0 {
							t.Fatalf("the second request reached the world's wire (%d frames with the secret, %d with its path)", n1, n2)
						}
						first := e.dec.decisions(func(d decision) bool {
							return d.meta.Flow.Dst == fam.world && d.ev.Dest != nil && strings.HasSuffix(d.ev.Obj, "/first")
						})
						second := e.dec.decisions(func(d decision) bool {
							return d.meta.Flow.Dst == fam.world && strings.Contains(d.ev.Content, secret) && strings.Contains(d.ev.Obj, "/second")
						})
						if len(first) == 0 || len(second) == 0 || second[0].out.Verdict != Refuse {
							e.dec.log(t)
							t.Fatalf("decisions: %d of the first request, %d of the second (want each decided, the second refused)", len(first), len(second))
						}
					})
				})
			}
			checkQueueSaw(t, e, gso, q)
		})
	}
}

// rawRequest connects from the guest, writes each chunk with TCP_NODELAY
// (so each leaves as its own super-packet: newTapEnv turns autocorking
// off), and returns what came back within a few seconds or the error
// text.
func rawRequest(t *testing.T, e *env, addr netip.AddrPort, chunks ...string) string {
	t.Helper()
	c, err := tcxtest.Dial(e.topo.Guest, "tcp", addr, netip.AddrPort{}, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	for _, ch := range chunks {
		if _, err := io.WriteString(c, ch); err != nil {
			return err.Error()
		}
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if len(b) == 0 && err != nil {
		return err.Error()
	}
	return string(b)
}
