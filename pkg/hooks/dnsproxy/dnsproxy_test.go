package dnsproxy

import (
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

// Real dig against the proxy: static answers over UDP and TCP, forwarding
// to an upstream (a second proxy playing the world's resolver), and the
// name -> address mapping reported for every answer.
func TestDigThroughProxy(t *testing.T) {
	dig := testutil.RequireTool(t, "dig")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	world := &Proxy{Static: map[string][]netip.Addr{"api.example.com": {netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")}}}
	wa := netip.MustParseAddrPort("127.0.0.1:25353")
	if err := world.Serve(ctx, wa); err != nil {
		t.Skipf("skipping: cannot listen on %s: %v", wa, err)
	}
	defer world.Close()
	var mu sync.Mutex
	seen := map[string][]netip.Addr{}
	p := &Proxy{Upstream: []netip.AddrPort{wa}, Static: map[string][]netip.Addr{"local.test": {netip.MustParseAddr("10.0.0.1")}},
		OnAnswer: func(m map[string][]netip.Addr) {
			mu.Lock()
			defer mu.Unlock()
			for k, v := range m {
				seen[k] = append(seen[k], v...)
			}
		}}
	pa := netip.MustParseAddrPort("127.0.0.1:25354")
	if err := p.Serve(ctx, pa); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"local.test", "A"}, "10.0.0.1"},
		{[]string{"API.example.com", "A"}, "192.0.2.7"},
		{[]string{"api.example.com", "AAAA", "+tcp"}, "2001:db8::7"},
	} {
		args := append([]string{"@127.0.0.1", "-p", "25354", "+short", "+time=2", "+tries=1"}, tc.args...)
		out, err := exec.Command(dig, args...).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("dig %v: %q %v, want %q", tc.args, out, err, tc.want)
		}
	}
	out, _ := exec.Command(dig, "@127.0.0.1", "-p", "25354", "+time=2", "+tries=1", "nope.invalid").CombinedOutput()
	if !strings.Contains(string(out), "SERVFAIL") && !strings.Contains(string(out), "NXDOMAIN") {
		t.Errorf("unknown name: %s", out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen["api.example.com"]) < 2 || len(seen["local.test"]) != 1 {
		t.Errorf("answers reported: %v", seen)
	}
}
