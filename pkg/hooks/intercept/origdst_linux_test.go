package intercept

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/carbd/carbd/internal/netnsx"
	"github.com/carbd/carbd/internal/testutil"
)

// TestRedirectOriginalDst: in a network namespace of its own, an
// iptables REDIRECT sends curl's connections to port 443 to the proxy's
// listener; OriginalDst recovers where they were going (IPv4 and IPv6),
// the proxy's own upstream connections carry a mark the rule skips, and
// the world answers through the proxy.
func TestRedirectOriginalDst(t *testing.T) {
	testutil.RequireRoot(t)
	curl := testutil.RequireTool(t, "curl")
	testutil.RequireTool(t, "iptables")
	testutil.RequireTool(t, "ip6tables")
	ns := testutil.NewNetNS(t)
	const mark = 0x6a6
	for _, fam := range []struct {
		ipt, world, proxy string
	}{
		{"iptables", "127.0.0.2:443", "127.0.0.1:0"},
		{"ip6tables", "[::1]:443", "[::1]:0"},
	} {
		t.Run(fam.ipt, func(t *testing.T) {
			listen := func(addr string) net.Listener {
				var ln net.Listener
				if err := netnsx.DoNamed(ns, func() (err error) { ln, err = net.Listen("tcp", addr); return err }); err != nil {
					t.Fatal(err)
				}
				return ln
			}
			w := newWorldOn(t, listen(fam.world))
			var mu sync.Mutex
			var origs []netip.AddrPort
			tp := newTestProxyOn(t, w, listen(fam.proxy), func(c *Config) {
				c.OrigDst = func(conn net.Conn) (netip.AddrPort, error) {
					dst, err := OriginalDst(conn)
					mu.Lock()
					origs = append(origs, dst)
					mu.Unlock()
					return dst, err
				}
				c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
					d := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
						var serr error
						rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, mark) })
						return serr
					}}
					var conn net.Conn
					err := netnsx.DoNamed(ns, func() (err error) { conn, err = d.DialContext(ctx, network, addr); return err })
					return conn, err
				}
			})
			wa := netip.MustParseAddrPort(fam.world)
			testutil.Run(t, "ip", "netns", "exec", ns, fam.ipt, "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
				"-d", wa.Addr().String(), "--dport", "443", "-m", "mark", "!", "--mark", fmt.Sprint(mark),
				"-j", "REDIRECT", "--to-ports", fmt.Sprint(tp.addr.Port()))
			host := wa.Addr().String()
			if wa.Addr().Is6() {
				host = "[" + host + "]"
			}
			out, err := exec.Command("ip", "netns", "exec", ns, curl, "-sS", "--cacert", tp.caFile,
				"--resolve", "localhost:443:"+host, "https://localhost/hello", "-w", `%{http_code}\n`).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "hello from the world: HTTP/2.0 GET /hello") {
				t.Fatalf("curl through the redirect: %v\n%s", err, out)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(origs) != 1 || origs[0] != wa {
				t.Errorf("original destinations %v, want %v", origs, wa)
			}
		})
	}
}
