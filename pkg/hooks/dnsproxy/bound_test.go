package dnsproxy

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"
)

// heldUpstream is a resolver on loopback that holds every query until
// released, then answers each with an empty NOERROR.
type heldUpstream struct {
	c        *net.UDPConn
	mu       sync.Mutex
	held     []heldQuery
	released bool
	got      chan struct{} // one token per query received
}

type heldQuery struct {
	q    []byte
	from netip.AddrPort
}

func newHeldUpstream(t *testing.T) *heldUpstream {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := &heldUpstream{c: c, got: make(chan struct{}, 1<<16)}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			hq := heldQuery{append([]byte(nil), buf[:n]...), from}
			u.mu.Lock()
			if u.released {
				u.answer(hq)
			} else {
				u.held = append(u.held, hq)
			}
			u.mu.Unlock()
			u.got <- struct{}{}
		}
	}()
	t.Cleanup(func() { c.Close() })
	return u
}

func (u *heldUpstream) answer(hq heldQuery) {
	_, _, qend, err := question(hq.q)
	if err != nil {
		return
	}
	r := append([]byte(nil), hq.q[:qend]...)
	r[2], r[3] = 0x81, 0x80
	_, _ = u.c.WriteToUDPAddrPort(r, hq.from)
}

func (u *heldUpstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.released = true
	for _, hq := range u.held {
		u.answer(hq)
	}
	u.held = nil
}

func (u *heldUpstream) addr() netip.AddrPort {
	return netip.MustParseAddrPort(u.c.LocalAddr().String())
}

func query(id uint16, name string) []byte {
	q := make([]byte, 12)
	binary.BigEndian.PutUint16(q, id)
	q[2] = 0x01 // RD
	binary.BigEndian.PutUint16(q[4:], 1)
	for _, l := range []string{name, "example", "com"} {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	return append(q, 0, 0, 1, 0, 1)
}

// waitTokens takes n tokens from ch; the limit only guards against a hang.
func waitTokens(t *testing.T, ch <-chan struct{}, n int, what string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("%s: %d of %d", what, i, n)
		}
	}
}

// TestUDPFloodBounded: with MaxInFlight queries held upstream, every
// further query is answered SERVFAIL at once, no goroutine is started for
// it, and upstream never sees more than MaxInFlight queries at once. Once
// upstream answers, the held queries get their answers and new queries
// are forwarded again.
func TestUDPFloodBounded(t *testing.T) {
	const bound, flood = 8, 2000
	up := newHeldUpstream(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &Proxy{Upstream: []netip.AddrPort{up.addr()}, MaxInFlight: bound, Timeout: time.Minute}
	if err := p.Serve(ctx, netip.MustParseAddrPort("127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pa := netip.MustParseAddrPort(p.close[0].(*net.UDPConn).LocalAddr().String())
	cl, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(pa))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	type reply struct {
		id    uint16
		rcode byte
	}
	replies := make(chan reply, flood+bound+1)
	go func() {
		buf := make([]byte, 512)
		for {
			n, err := cl.Read(buf)
			if err != nil {
				return
			}
			if n >= 12 {
				replies <- reply{binary.BigEndian.Uint16(buf), buf[3] & 0x0f}
			}
		}
	}()

	for i := 0; i < bound; i++ {
		if _, err := cl.Write(query(uint16(i), "held")); err != nil {
			t.Fatal(err)
		}
	}
	waitTokens(t, up.got, bound, "queries forwarded upstream")
	base := runtime.NumGoroutine()
	// The flood, one query at a time so no socket buffer drops any: each
	// is refused before the next is sent.
	for i := 0; i < flood; i++ {
		id := uint16(1000 + i)
		if _, err := cl.Write(query(id, "flood")); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-replies:
			if r.id != id || r.rcode != 2 {
				t.Fatalf("query %d: reply id %d rcode %d, want SERVFAIL (2) for it", id, r.id, r.rcode)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("query %d: no reply", id)
		}
		if g := runtime.NumGoroutine(); g > base+2 {
			t.Fatalf("%d goroutines during the flood, %d before it", g, base)
		}
	}
	select {
	case <-up.got:
		t.Fatal("upstream got more than MaxInFlight queries at once")
	default:
	}
	if s := p.Stats(); s.RefusedUDP != flood {
		t.Errorf("stats %+v, want %d refused", s, flood)
	}

	up.release()
	seen := map[uint16]bool{}
	for len(seen) < bound {
		select {
		case r := <-replies:
			if r.rcode != 0 || r.id >= bound {
				t.Fatalf("after release: reply id %d rcode %d", r.id, r.rcode)
			}
			seen[r.id] = true
		case <-time.After(30 * time.Second):
			t.Fatalf("after release: %d of %d held queries answered", len(seen), bound)
		}
	}
	// A slot is free again: the next query is forwarded and answered.
	if _, err := cl.Write(query(7777, "after")); err != nil {
		t.Fatal(err)
	}
	waitTokens(t, up.got, 1, "query after the flood forwarded")
	select {
	case r := <-replies:
		if r.id != 7777 || r.rcode != 0 {
			t.Errorf("after the flood: reply id %d rcode %d", r.id, r.rcode)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("after the flood: no reply")
	}
}

// TestTCPConnsBounded: MaxTCPConns connections are served; one more is
// closed on accept, counted; when one ends a new one is served again.
func TestTCPConnsBounded(t *testing.T) {
	const bound = 3
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := &Proxy{Static: map[string][]netip.Addr{"a.example.com": {netip.MustParseAddr("192.0.2.1")}}, MaxTCPConns: bound}
	if err := p.Serve(ctx, netip.MustParseAddrPort("127.0.0.1:0")); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := p.close[1].(*net.TCPListener).Addr().String()
	ask := func(c net.Conn) error {
		if err := writeTCPMsg(c, query(1, "a")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err := readTCPMsg(c)
		return err
	}
	var open []net.Conn
	for i := 0; i < bound; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := ask(c); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		open = append(open, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if err := ask(extra); err == nil {
		t.Fatal("a connection over MaxTCPConns was served")
	}
	if s := p.Stats(); s.RefusedTCP != 1 {
		t.Errorf("stats %+v, want 1 refused connection", s)
	}
	open[0].Close()
	// The freed connection slot is taken back once the server sees the
	// close; until then a new connection may be refused too.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		err = ask(c)
		c.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection served after one ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
