package daemon

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/tcx"
)

// A question whose client is gone is withdrawn (docs/operator.md,
// "Withdrawn questions"). The wire rarely says that a client gave up: a
// client that closes its socket while its request is held (curl -m)
// leaves the request unacknowledged, so the guest's kernel keeps
// retransmitting it and sends no FIN until it is acknowledged. In the
// namespace sandbox carbd asks the guest's kernel instead: every
// clientProbeEvery, while an effect waits for the oracle, it lists the
// sandbox's TCP and UDP sockets (sock_diag) and finds the effect's
// client socket. A TCP socket that is gone, orphaned (closed by its
// process) or past ESTABLISHED, or a UDP socket that is gone, has no
// client any more: the effect's decision is cancelled
// (decide.ErrClientGone), or, held in a scope, its question withdrawn.
// VM backends keep the wire's signals only (pkg/hooks/nfq: a reset, a
// FIN, a new connection on the same ports, a DNS query no longer
// retransmitted) and the sandbox's exit.

// clientProbeEvery is how often the sandbox's sockets are listed while
// an effect waits for the oracle. Nothing is listed, and run does not
// wake, while none waits.
const clientProbeEvery = 500 * time.Millisecond

// clientWatch finds the effects whose client socket is gone.
type clientWatch struct {
	nc *netChannel
	// on: the sandbox's sockets can be listed (the namespace sandbox);
	// else nothing is watched.
	on bool
	// kick tells run that an effect is watched: it arms its timer.
	kick chan struct{}

	mu     sync.Mutex         // guards the fields below
	asking map[uint64]watched // decisions in progress, by a watch id
	held   map[uint64]watched // held effects, by sequence number
	next   uint64
	h      *netlink.Handle // sock_diag in the sandbox's network namespace
	pid    int
	warned bool
}

type watched struct {
	flow tcx.FlowKey
	gone func(reason string)
}

func newClientWatch(nc *netChannel) *clientWatch {
	return &clientWatch{nc: nc, on: nc.d.cfg.Backend == "netns", kick: make(chan struct{}, 1),
		asking: map[uint64]watched{}, held: map[uint64]watched{}}
}

// watchDecision watches the client of a decision in progress; gone is
// called (once) if it goes. The returned function ends the watch.
func (cw *clientWatch) watchDecision(flow tcx.FlowKey, gone func(reason string)) func() {
	if cw == nil || !cw.on || !probeable(flow) {
		return func() {}
	}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	cw.next++
	id := cw.next
	cw.asking[id] = watched{flow: flow, gone: gone}
	cw.wake()
	return func() {
		cw.mu.Lock()
		delete(cw.asking, id)
		cw.mu.Unlock()
	}
}

// watchHeld watches the client of held effect seq until its final
// verdict is recorded.
func (cw *clientWatch) watchHeld(seq uint64, flow tcx.FlowKey) {
	if cw == nil || !cw.on || !probeable(flow) {
		return
	}
	d := cw.nc.d
	cw.mu.Lock()
	cw.held[seq] = watched{flow: flow, gone: func(reason string) { d.clientGone(seq, reason) }}
	cw.mu.Unlock()
	cw.wake()
}

// wake tells run that an effect is watched; it never blocks.
func (cw *clientWatch) wake() {
	select {
	case cw.kick <- struct{}{}:
	default:
	}
}

// watching reports whether an effect is watched.
func (cw *clientWatch) watching() bool {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	return len(cw.asking) > 0 || len(cw.held) > 0
}

func probeable(k tcx.FlowKey) bool {
	return k.Proto == tcx.ProtoTCP || k.Proto == 17
}

// run probes every clientProbeEvery while an effect is watched, until
// ctx ends; it sleeps while none is. pid is a process in the sandbox's
// network namespace.
func (cw *clientWatch) run(ctx context.Context, pid int) {
	cw.mu.Lock()
	cw.pid = pid
	cw.mu.Unlock()
	t := time.NewTimer(clientProbeEvery)
	armed := true // a watch made before run started is probed too
	defer t.Stop()
	defer func() {
		cw.mu.Lock()
		if cw.h != nil {
			cw.h.Close()
			cw.h = nil
		}
		cw.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-cw.kick:
			if !armed {
				armed = true
				t.Reset(clientProbeEvery)
			}
		case <-t.C:
			armed = false
			// (A watch made from here on is seen by watching, or
			// leaves a kick.)
			if cw.watching() {
				armed = true
				t.Reset(clientProbeEvery)
			}
			if err := cw.probe(); err != nil {
				cw.mu.Lock()
				warn := !cw.warned
				cw.warned = true
				cw.mu.Unlock()
				if warn {
					cw.nc.d.log.Warn("cannot list the sandbox's sockets: a client that gives up is seen only on the wire", "err", err)
				}
			}
		}
	}
}

// probe lists the sandbox's sockets if an effect waits, and tells the
// watchers whose client socket is gone.
func (cw *clientWatch) probe() error {
	cw.mu.Lock()
	var ws []watched
	var done []uint64
	d := cw.nc.d
	d.mu.Lock()
	for seq, w := range cw.held {
		if _, held := d.held[seq]; !held {
			done = append(done, seq)
			continue
		}
		ws = append(ws, w)
	}
	d.mu.Unlock()
	for _, seq := range done {
		delete(cw.held, seq)
	}
	for _, w := range cw.asking {
		ws = append(ws, w)
	}
	if len(ws) == 0 {
		cw.mu.Unlock()
		return nil
	}
	if cw.h == nil {
		ns, err := vnetns.GetFromPid(cw.pid)
		if err != nil {
			cw.mu.Unlock()
			return fmt.Errorf("sandbox network namespace: %w", err)
		}
		h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
		ns.Close()
		if err != nil {
			cw.mu.Unlock()
			return fmt.Errorf("sock_diag handle: %w", err)
		}
		cw.h = h
	}
	h := cw.h
	cw.mu.Unlock()
	socks, err := listSockets(h)
	if err != nil {
		return err
	}
	for _, w := range ws {
		if why := socks.gone(w.flow); why != "" {
			w.gone(why)
		}
	}
	// A watcher told stays registered until its decision ends or its
	// effect is final; telling it again is harmless (both ends are
	// idempotent) but not needed: forget the held ones now.
	cw.mu.Lock()
	for seq, w := range cw.held {
		if socks.gone(w.flow) != "" {
			delete(cw.held, seq)
		}
	}
	cw.mu.Unlock()
	return nil
}

// sockets are the sandbox's TCP and UDP sockets.
type sockets struct {
	tcp map[[2]netip.AddrPort]*netlink.Socket // by local, remote
	udp map[uint16][]*netlink.Socket          // by local port
}

func listSockets(h *netlink.Handle) (*sockets, error) {
	s := &sockets{tcp: map[[2]netip.AddrPort]*netlink.Socket{}, udp: map[uint16][]*netlink.Socket{}}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		ts, err := h.SocketDiagTCP(fam)
		if err != nil { // an interrupted dump too: incomplete, decide nothing
			return nil, fmt.Errorf("list tcp sockets: %w", err)
		}
		for _, x := range ts {
			s.tcp[[2]netip.AddrPort{addrPort(x.ID.Source, x.ID.SourcePort), addrPort(x.ID.Destination, x.ID.DestinationPort)}] = x
		}
		us, err := h.SocketDiagUDP(fam)
		if err != nil {
			return nil, fmt.Errorf("list udp sockets: %w", err)
		}
		for _, x := range us {
			s.udp[x.ID.SourcePort] = append(s.udp[x.ID.SourcePort], x)
		}
	}
	return s, nil
}

func addrPort(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// TCP states (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpSynSent     = 2
)

// gone says why the client of flow is gone, or "" while it is there.
func (s *sockets) gone(k tcx.FlowKey) string {
	src := netip.AddrPortFrom(k.Src.Unmap(), k.SrcPort)
	switch k.Proto {
	case tcx.ProtoTCP:
		x, ok := s.tcp[[2]netip.AddrPort{src, netip.AddrPortFrom(k.Dst.Unmap(), k.DstPort)}]
		switch {
		case !ok:
			return "the client's socket is gone"
		case x.INode == 0:
			return "the client closed its socket"
		case x.State != tcpEstablished && x.State != tcpSynSent:
			return "the client closed its socket"
		}
	case 17:
		for _, x := range s.udp[k.SrcPort] {
			a := addrPort(x.ID.Source, x.ID.SourcePort).Addr()
			if a == src.Addr() || a.IsUnspecified() {
				return ""
			}
		}
		return "the client closed its socket"
	}
	return ""
}

// goneCause is the cause a decision's context ends with.
func goneCause(reason string) error { return fmt.Errorf("%w: %s", decide.ErrClientGone, reason) }

// whileClientWaits returns ctx for the decision of an effect on flow:
// it ends (decide.ErrClientGone) when the effect's client is gone or the
// sandbox exits. The returned function releases it.
func (nc *netChannel) whileClientWaits(ctx context.Context, flow tcx.FlowKey) (context.Context, func()) {
	d := nc.d
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(d.exited, func() { cancel(context.Cause(d.exited)) })
	unwatch := nc.clients.watchDecision(flow, func(reason string) { cancel(goneCause(reason)) })
	return ctx, func() { unwatch(); stop(); cancel(nil) }
}

// whileConnWaits is whileClientWaits for a request whose connection
// carbd terminates (the interception proxy): conn ends when the proxy
// gives up on the connection, which means its client is gone too.
func (nc *netChannel) whileConnWaits(conn context.Context, flow tcx.FlowKey) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(conn))
	stop := context.AfterFunc(conn, func() { cancel(goneCause("the intercepted connection closed")) })
	ctx, done := nc.whileClientWaits(ctx, flow)
	return ctx, func() { done(); stop(); cancel(nil) }
}
