// Package dnsproxy is the resolver a sandbox uses: carbd controls it, so
// every name the sandbox resolves is seen, and every answer maps names to
// addresses for the policy's parties (a flow to a bare address is matched
// by the names that resolved to it). The sandbox's queries still cross
// the NFQUEUE like any other egress: a query name can carry data, so it is
// an effect decided before it reaches this proxy.
//
// It forwards queries over UDP and TCP to upstream resolvers, or answers
// from a static table (an offline host, tests, the demo).
//
// # Limits
//
// At most MaxInFlight queries are being answered at once (each holds a
// goroutine and, when forwarded, an upstream socket for up to Timeout).
// A UDP query beyond that is answered SERVFAIL at once, by the reading
// goroutine itself, and counted (Stats). At most MaxTCPConns TCP
// connections are served at once; one more is closed on accept (the
// client retries, as after any resolver failure) and counted.
//
// # Requirements
//
// A socket on the host side of the sandbox's interface.
package dnsproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// Proxy is a forwarding DNS resolver.
type Proxy struct {
	// Upstream resolvers, tried in order; empty answers only from Static.
	Upstream []netip.AddrPort
	// Static answers A and AAAA queries for these names (lowercase, no
	// trailing dot) without asking upstream.
	Static map[string][]netip.Addr
	// OnAnswer receives name -> addresses of every answer relayed.
	OnAnswer func(map[string][]netip.Addr)
	Timeout  time.Duration // per upstream query; default 2 s
	// MaxInFlight bounds the queries answered at once (UDP and TCP);
	// default DefaultMaxInFlight. A UDP query over the bound is answered
	// SERVFAIL; a TCP one waits for its connection's turn (see
	// MaxTCPConns).
	MaxInFlight int
	// MaxTCPConns bounds the TCP connections served at once; default
	// DefaultMaxTCPConns. One more is closed on accept.
	MaxTCPConns int

	wg    sync.WaitGroup
	close []io.Closer
	slots chan struct{} // a token per query being answered
	conns chan struct{} // a token per TCP connection being served

	refusedUDP, refusedTCP atomic.Uint64
}

// Defaults of the bounds.
const (
	DefaultMaxInFlight = 64
	DefaultMaxTCPConns = 16
)

// Stats counts what the bounds refused.
type Stats struct {
	RefusedUDP uint64 // UDP queries answered SERVFAIL because MaxInFlight were in flight
	RefusedTCP uint64 // TCP connections closed because MaxTCPConns were open
}

// Stats returns the refusal counters.
func (p *Proxy) Stats() Stats {
	return Stats{RefusedUDP: p.refusedUDP.Load(), RefusedTCP: p.refusedTCP.Load()}
}

// Serve answers on UDP and TCP at each address until ctx ends.
func (p *Proxy) Serve(ctx context.Context, addrs ...netip.AddrPort) error {
	if p.Timeout == 0 {
		p.Timeout = 2 * time.Second
	}
	if p.MaxInFlight <= 0 {
		p.MaxInFlight = DefaultMaxInFlight
	}
	if p.MaxTCPConns <= 0 {
		p.MaxTCPConns = DefaultMaxTCPConns
	}
	p.slots = make(chan struct{}, p.MaxInFlight)
	p.conns = make(chan struct{}, p.MaxTCPConns)
	for _, a := range addrs {
		uc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
		if err != nil {
			p.Close()
			return fmt.Errorf("dnsproxy: listen udp %s: %w", a, err)
		}
		tl, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(a))
		if err != nil {
			uc.Close()
			p.Close()
			return fmt.Errorf("dnsproxy: listen tcp %s: %w", a, err)
		}
		p.close = append(p.close, uc, tl)
		p.wg.Add(2)
		go p.serveUDP(uc)
		go p.serveTCP(tl)
	}
	go func() {
		<-ctx.Done()
		p.Close()
	}()
	return nil
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	for _, c := range p.close {
		c.Close()
	}
	p.close = nil
	p.wg.Wait()
}

func (p *Proxy) serveUDP(c *net.UDPConn) {
	defer p.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		select {
		case p.slots <- struct{}{}:
		default:
			// Full: refuse now, without a goroutine.
			p.refusedUDP.Add(1)
			if _, _, qend, err := question(buf[:n]); err == nil {
				_, _ = c.WriteToUDPAddrPort(servfail(buf[:qend], false), from)
			}
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.slots }()
			if resp := p.answer(q, false); resp != nil {
				_, _ = c.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

func (p *Proxy) serveTCP(l *net.TCPListener) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		select {
		case p.conns <- struct{}{}:
		default:
			p.refusedTCP.Add(1)
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.conns }()
			defer c.Close()
			for {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				q, err := readTCPMsg(c)
				if err != nil {
					return
				}
				p.slots <- struct{}{} // the connection's turn
				resp := p.answer(q, true)
				<-p.slots
				if resp == nil {
					return
				}
				if err := writeTCPMsg(c, resp); err != nil {
					return
				}
			}
		}()
	}
}

func readTCPMsg(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	m := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err := io.ReadFull(r, m)
	return m, err
}

func writeTCPMsg(w io.Writer, m []byte) error {
	b := make([]byte, 2+len(m))
	binary.BigEndian.PutUint16(b, uint16(len(m)))
	copy(b[2:], m)
	_, err := w.Write(b)
	return err
}

// answer resolves one query message and returns the response message.
func (p *Proxy) answer(q []byte, tcp bool) []byte {
	name, qtype, qend, err := question(q)
	if err != nil {
		return nil
	}
	if addrs, ok := p.Static[name]; ok && (qtype == 1 || qtype == 28) {
		resp := staticResponse(q[:qend], qtype, addrs)
		p.report(resp)
		return resp
	}
	for _, up := range p.Upstream {
		resp, err := p.forward(up, q, tcp)
		if err == nil {
			p.report(resp)
			return resp
		}
	}
	return servfail(q[:qend], len(p.Upstream) == 0)
}

func (p *Proxy) report(resp []byte) {
	if p.OnAnswer == nil {
		return
	}
	if a, err := netparse.ParseDNSAnswer(resp); err == nil {
		if m := a.Addrs(); len(m) > 0 {
			p.OnAnswer(m)
		}
	}
}

func (p *Proxy) forward(up netip.AddrPort, q []byte, tcp bool) ([]byte, error) {
	network := "udp"
	if tcp {
		network = "tcp"
	}
	c, err := net.DialTimeout(network, up.String(), p.Timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(p.Timeout))
	if tcp {
		if err := writeTCPMsg(c, q); err != nil {
			return nil, err
		}
		return readTCPMsg(c)
	}
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	if n < 2 || buf[0] != q[0] || buf[1] != q[1] {
		return nil, errors.New("dnsproxy: upstream answer does not match the query id")
	}
	return buf[:n], nil
}

// question parses the first question of a query: its lowercase name, its
// type, and where the question section ends.
func question(q []byte) (string, uint16, int, error) {
	if len(q) < 12 || q[2]&0x80 != 0 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return "", 0, 0, errors.New("dnsproxy: not a one-question query")
	}
	var labels []string
	off := 12
	for {
		if off >= len(q) {
			return "", 0, 0, errors.New("dnsproxy: truncated name")
		}
		l := int(q[off])
		off++
		if l == 0 {
			break
		}
		if l > 63 || off+l > len(q) {
			return "", 0, 0, errors.New("dnsproxy: bad label")
		}
		labels = append(labels, strings.ToLower(string(q[off:off+l])))
		off += l
	}
	if off+4 > len(q) {
		return "", 0, 0, errors.New("dnsproxy: truncated question")
	}
	return strings.Join(labels, "."), binary.BigEndian.Uint16(q[off : off+2]), off + 4, nil
}

// staticResponse answers a query (header + question) with the addresses
// of the asked family.
func staticResponse(q []byte, qtype uint16, addrs []netip.Addr) []byte {
	r := append([]byte(nil), q...)
	r[2] = 0x84 | (q[2] & 0x01) // QR, AA, keep RD
	r[3] = 0x80                 // RA, NOERROR
	binary.BigEndian.PutUint16(r[6:8], 0)
	binary.BigEndian.PutUint16(r[8:10], 0)
	binary.BigEndian.PutUint16(r[10:12], 0)
	n := 0
	for _, a := range addrs {
		a = a.Unmap()
		if (qtype == 1) != a.Is4() {
			continue
		}
		r = append(r, 0xc0, 12) // pointer to the question name
		r = binary.BigEndian.AppendUint16(r, qtype)
		r = binary.BigEndian.AppendUint16(r, 1)
		r = binary.BigEndian.AppendUint32(r, 60)
		b := a.AsSlice()
		r = binary.BigEndian.AppendUint16(r, uint16(len(b)))
		r = append(r, b...)
		n++
	}
	binary.BigEndian.PutUint16(r[6:8], uint16(n))
	return r
}

// servfail answers SERVFAIL (or NXDOMAIN when there is no upstream: the
// name is simply unknown offline).
func servfail(q []byte, nx bool) []byte {
	r := append([]byte(nil), q...)
	r[2] = 0x80 | (q[2] & 0x01)
	r[3] = 0x82
	if nx {
		r[3] = 0x83
	}
	binary.BigEndian.PutUint16(r[6:8], 0)
	binary.BigEndian.PutUint16(r[8:10], 0)
	binary.BigEndian.PutUint16(r[10:12], 0)
	return r
}
