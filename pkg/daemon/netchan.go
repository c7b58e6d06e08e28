package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/capture"
	"github.com/carbd/carbd/pkg/hooks/dnsproxy"
	"github.com/carbd/carbd/pkg/hooks/nfq"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/respwatch"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/netns"
)

// decideWorkers bounds the verdict loop's concurrent decisions, of which
// those waiting for the operator may be many.
const decideWorkers = 256

// netChannel is the sandbox's network path: a veth pair whose host side
// carries the TC program and carbd's queue rules, the verdict loop, the
// resolver, masquerading, and the capture for the audit.
type netChannel struct {
	d       *daemon
	plan    netns.Plan
	dp      *tcx.Datapath
	rules   nfrules.Config
	backend nfrules.Backend
	loop    *nfq.Loop
	dns     *dnsproxy.Proxy
	cap     *capture.Capture
	resp    *respwatch.Watcher
	icpt    *interceptor // nil: TLS stays opaque
	clients *clientWatch // the clients of effects waiting (clients.go)
	sb      *netns.Sandbox
	// agentDir is the agent's control directory (task, notices).
	agentDir string
	// closers of the backend's resources (sandbox, tap, VM), run in
	// reverse after the hooks are down.
	closers []func() error
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	nat     func() error
	// rulesDone is closed once the queue rules are in (or failed:
	// rulesErr); backend is set before. See installRules.
	rulesDone chan struct{}
	rulesErr  error
	// traced is closed once the file tracer is set up (netns backend;
	// nil: set up before the channel started).
	traced chan struct{}

	mu sync.Mutex // guards flows, bySeq and names
	// flows is each flow's latest decision, for the capture's
	// annotations; bounded (see maxFlowNotes).
	flows *lruTable[flowID, flowNote]
	bySeq map[uint64]flowID // held effects, to record their final verdict
	// names maps an address to the names the sandbox's resolver answered
	// with it, the latest last; bounded (see maxNamedAddrs).
	names *lruTable[netip.Addr, []string]

	// stream is the streamed pcapng audit (auditfile.go); closeStream
	// closes it and finishes its run.json.
	stream      *capture.Stream
	closeStream func() error
}

// Bounds of the network channel's tables. A flow's note (its latest
// decision, for the capture's annotations) is forgotten after
// flowNoteIdle without a decision or beyond maxFlowNotes flows; its
// packets still in the capture are then annotated "undecided". A name an
// address was answered with is forgotten after nameIdle without being
// answered or used, beyond maxNamedAddrs addresses, or beyond
// maxNamesPerAddr names for one address (the oldest first); a flow to it
// is then decided by address alone, as one to an address never resolved.
const (
	maxFlowNotes    = 1 << 16
	flowNoteIdle    = time.Hour
	maxNamedAddrs   = 1 << 16
	nameIdle        = time.Hour
	maxNamesPerAddr = 16
)

// flowID identifies a flow regardless of direction, for annotating
// captured packets.
type flowID struct {
	a, b  netip.AddrPort
	proto uint8
}

func newFlowID(src, dst netip.AddrPort, proto uint8) flowID {
	if src.Addr().Less(dst.Addr()) || (src.Addr() == dst.Addr() && src.Port() < dst.Port()) {
		return flowID{src, dst, proto}
	}
	return flowID{dst, src, proto}
}

type flowNote struct {
	seq     uint64
	verdict string
	reason  string
	at      time.Time // when the note was made
}

// startNetChannel creates the sandbox behind its veth pair with every
// hook in place before the host side comes up.
func startNetChannel(ctx context.Context, d *daemon, index int) (_ *netChannel, err error) {
	plan, err := netns.NewPlan(d.cfg.ID, index)
	if err != nil {
		return nil, err
	}
	nc := &netChannel{d: d, plan: plan, flows: newLRUTable[flowID, flowNote](maxFlowNotes, flowNoteIdle, nil),
		bySeq: map[uint64]flowID{}, names: newLRUTable[netip.Addr, []string](maxNamedAddrs, nameIdle, nil)}
	nc.clients = newClientWatch(nc)
	defer func() {
		if err != nil {
			nc.close()
			d.net = nil
		}
	}()
	// Decisions start as soon as the sandbox does, before this returns,
	// and their resolutions go to d.net: set it before any goroutine
	// that decides exists.
	d.net = nc
	// A crash leaves pinned state and rules behind; the sandbox died with
	// its daemon, so start from a clean slate (egress stayed dropped
	// meanwhile: the rules drop what is not marked).
	// The crashed run's link goes first (carbd cleanup removes in the
	// same order, with the same functions: cleanup.go).
	if err := removeCrashedLink(plan.HostIf); err != nil {
		return nil, err
	}
	tcfg := tcx.Config{SandboxID: d.cfg.ID, Ifname: plan.HostIf}
	_ = tcx.Remove(tcfg)
	if tcfg.ReadGen, err = d.shareReadGen(nc); err != nil {
		return nil, err
	}
	nc.rules = nfrules.Config{SandboxID: d.cfg.ID, Iface: plan.HostIf, QueueNum: plan.Queue}
	nc.installRules()

	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	nc.cancel = cancel
	// The agent's control directory: the task, and the abort notices of
	// this run (a new run starts with none).
	agentDir := filepath.Join(d.dir, "agent")
	_ = os.RemoveAll(agentDir)
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chown(agentDir, d.cfg.UID, d.cfg.GID); err != nil {
		return nil, err
	}
	_ = os.WriteFile(filepath.Join(agentDir, "task"), []byte(d.cfg.Task), 0o644)
	nc.agentDir = agentDir
	switch d.cfg.Backend {
	case "netns":
		err = nc.startNetns(ctx, lctx, tcfg)
	default:
		err = startBackend(ctx, lctx, nc, tcfg)
	}
	if err != nil {
		return nil, err
	}
	return nc, nil
}

// startBackend starts the sandboxes of backends other than netns; each
// registers itself (backend_*.go).
var backends = map[string]func(ctx, lctx context.Context, nc *netChannel, tcfg tcx.Config) error{}

func startBackend(ctx, lctx context.Context, nc *netChannel, tcfg tcx.Config) error {
	start, ok := backends[nc.d.cfg.Backend]
	if !ok {
		return fmt.Errorf("backend %q is not available in this build", nc.d.cfg.Backend)
	}
	return start(ctx, lctx, nc, tcfg)
}

// startNetns starts the embedded default: namespaces behind a veth pair
// whose host side gets the hooks before it comes up.
func (nc *netChannel) startNetns(ctx, lctx context.Context, tcfg tcx.Config) error {
	d, plan := nc.d, nc.plan
	// The file tracer loads (its programs verified: the longest step of
	// a start) while the sandbox and its hooks are set up. The sandbox's
	// command starts only once the tracer follows its cgroup
	// (CgroupFunc), and no decision is made before (decide).
	var cgroup string
	nc.traced = make(chan struct{})
	go func() {
		defer close(nc.traced)
		cgroup = d.files.startTracing(ctx, d.cfg.Workdir)
	}()
	defer func() { <-nc.traced }()
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
		"CARBD_TASK=" + d.cfg.Task, "CARBD_NOTICES=/run/carbd/notices", "CARBD_SANDBOX=" + d.cfg.ID}
	if t := os.Getenv("TERM"); t != "" {
		env = append(env, "TERM="+t)
	}
	binds := append([]netns.Bind{{Source: nc.agentDir, Target: "/run/carbd", Writable: true}}, d.cfg.Binds...)
	if !d.cfg.Intercept.Off {
		ic, err := nc.startIntercept()
		if err != nil {
			return err
		}
		nc.icpt = ic
		nc.closers = append(nc.closers, ic.close)
		b, tenv := ic.guest()
		binds = append(binds, b)
		env = append(env, tenv...)
	}
	env = append(env, d.cfg.Env...) // through the sandbox's configuration pipe, not argv; the user's last
	stdin := d.cfg.Stdin
	if stdin == nil {
		stdin = eofReader{}
	}
	sb, err := netns.Start(netns.Config{
		Plan: plan, Workdir: d.cfg.Workdir, Merged: d.files.merged, Argv: d.cfg.Argv, Env: env,
		UID: d.cfg.UID, GID: d.cfg.GID, Hostname: "carbd-" + d.cfg.ID,
		DNS:   []netip.Addr{plan.HostAddr4.Addr()},
		Binds: binds,
		Hide:  d.hiddenPaths(),
		CgroupFunc: func() string {
			<-nc.traced
			return cgroup
		},
		BeforeUp: func(host netlink.Link) error {
			return nc.hooks(lctx, tcfg)
		},
		Stdin: stdin, Stdout: d.cfg.Stdout, Stderr: d.cfg.Stderr,
	})
	if err != nil {
		return err
	}
	nc.sb = sb
	nc.closers = append(nc.closers, sb.Close)
	d.sandbox = sb
	nc.wg.Add(1)
	go func() { defer nc.wg.Done(); nc.clients.run(lctx, sb.Pid()) }()
	return nil
}

// installRules removes a crashed run's queue rules and installs this
// run's, in the background: they name the interface, which need not
// exist yet, so they go in while the rest of the sandbox is set up (the
// file tracer, the sandbox's namespaces, the TC program); hooks waits for
// them before the interface comes up, and close before removing them.
// Until they are in, the interface is down or absent: nothing passes.
func (nc *netChannel) installRules() {
	nc.rulesDone = make(chan struct{})
	go func() {
		defer close(nc.rulesDone)
		_ = nfrules.Remove(nc.rules)
		nc.backend, nc.rulesErr = nfrules.Apply(nc.rules)
	}()
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// hooks installs the data path on the host side of the veth, which is
// still down: the TC program with its liveness lease, the queue rules,
// the verdict loop, the resolver, the capture and masquerading.
func (nc *netChannel) hooks(ctx context.Context, tcfg tcx.Config) error {
	d := nc.d
	dp, err := tcx.Attach(tcfg)
	if err != nil {
		return fmt.Errorf("attach the TC program: %w", err)
	}
	nc.dp = dp
	if err := dp.RenewLease(2 * time.Second); err != nil {
		return err
	}
	// Without renewals the TC program drops everything once the lease
	// lapses: a renewal that fails ends the run.
	d.sup.Go(&nc.wg, ctx, "tc-lease", func(ctx context.Context) error {
		return dp.KeepAlive(ctx, 250*time.Millisecond, time.Second)
	})
	<-nc.rulesDone
	if nc.rulesErr != nil {
		return fmt.Errorf("install the queue rules: %w", nc.rulesErr)
	}
	// A packet waits at most HoldTimeout for its verdict; with the
	// operator as oracle that must cover the operator's deadline.
	hold := d.cfg.HoldTimeout
	if d.cfg.Operator != nil && hold < d.cfg.Operator.Timeout+5*time.Second {
		hold = d.cfg.Operator.Timeout + 5*time.Second
	}
	// What the world answers is observed for provenance: responses are
	// reassembled from the capture and handed to the engine as incoming
	// events (docs/responses.md). The verdict loop waits on it, so it
	// exists before the loop starts.
	rw, err := respwatch.New(respwatch.Config{Resolved: nc.resolved})
	if err != nil {
		return err
	}
	nc.resp = rw
	// A decision deferred to the oracle keeps its decide worker until the
	// oracle answers (a person may take minutes): the workers are many, so
	// open questions never stall the other effects' decisions (DNS
	// included). Each waiting one is a parked goroutine.
	loop, err := nfq.New(nfq.Config{QueueNum: nc.plan.Queue, MaxQueueLen: 4096, Decider: nc, Datapath: dp, Recheck: true,
		DecideWorkers: decideWorkers, HoldTimeout: hold, DNSRefusal: true, Logger: d.log.With("channel", "net"), ClientGone: d.clientGone})
	if err != nil {
		return err
	}
	nc.loop = loop
	d.open.loop.Store(loop)
	// Once it is up, the loop ending for any reason ends the run (its
	// held packets are dropped as it stops).
	loopErr := make(chan error, 1)
	ready := make(chan struct{})
	d.sup.Go(&nc.wg, ctx, "verdict-loop", func(ctx context.Context) error {
		err := loop.Run(ctx)
		select {
		case <-ready:
			return err
		default:
			loopErr <- err
			return errNotStarted // hooks reports it, as a start-up error
		}
	})
	select {
	case <-loop.Ready():
		close(ready)
	case err := <-loopErr:
		return fmt.Errorf("verdict loop: %w", err)
	case <-time.After(10 * time.Second):
		return errors.New("verdict loop did not start")
	}
	nc.dns = &dnsproxy.Proxy{Upstream: d.cfg.Upstream, Static: d.cfg.Hosts, OnAnswer: nc.learn}
	if err := nc.dns.Serve(ctx, netip.AddrPortFrom(nc.plan.HostAddr4.Addr(), 53)); err != nil {
		return err
	}
	// What the world answers is observed for provenance (created before
	// the verdict loop, which waits on it).
	w := nc.resp
	d.sup.Go(&nc.wg, ctx, "response-watcher", func(ctx context.Context) error {
		return w.Run(ctx, nc.observe)
	})
	// The streamed pcapng audit, before the capture that feeds it.
	if nc.stream, nc.closeStream, err = nc.openAuditStream(); err != nil {
		return err
	}
	frame := func(r capture.Record) { w.Record(r); nc.stream.Add(r) }
	if c, err := capture.Start(nc.plan.HostIf, "", 0, 64<<20, capture.WithFrameFunc(frame), capture.WithReadBuffer(8<<20)); err == nil {
		nc.cap = c
	} else {
		d.log.Warn("capture off: responses are not observed", "err", err)
	}
	if nc.icpt != nil {
		if err := nc.icpt.listen(); err != nil {
			return err
		}
	}
	undo, err := masquerade(nc.plan, nc.icpt)
	if err != nil {
		return fmt.Errorf("masquerade: %w", err)
	}
	nc.nat = undo
	if ic := nc.icpt; ic != nil {
		d.sup.Go(&nc.wg, ctx, "interception-proxy", ic.serve)
	}
	return nil
}

// resolved reports whether the sandbox's resolver answered host with
// addr: only then is a response named by the host the guest claimed.
func (nc *netChannel) resolved(host string, addr netip.Addr) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	nc.mu.Lock()
	defer nc.mu.Unlock()
	names, _ := nc.names.get(addr.Unmap())
	for _, n := range names {
		if n == host {
			return true
		}
	}
	return false
}

// observe hands a response from the world to the engine. The model
// provider's answers are an internal channel, not input from the world.
func (nc *netChannel) observe(ev decide.Event) {
	if _, internal := nc.d.engine.Policy().InternalChannel(&ev); internal {
		return
	}
	if ev.Dest != nil && ev.Dest.Host == "" && ev.Dest.Addr.IsValid() {
		nc.mu.Lock()
		if names, _ := nc.names.get(ev.Dest.Addr.Unmap()); len(names) > 0 {
			dst := *ev.Dest
			dst.Host = names[len(names)-1]
			ev.Dest = &dst
		}
		nc.mu.Unlock()
	}
	nc.d.observe(ev)
}

// learn records name -> address answers of the sandbox's resolver, so a
// flow to a bare address is matched by name.
func (nc *netChannel) learn(m map[string][]netip.Addr) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	for name, addrs := range m {
		for _, a := range addrs {
			have, _ := nc.names.peek(a)
			names := make([]string, 0, len(have)+1)
			for _, n := range have {
				if n != name {
					names = append(names, n)
				}
			}
			names = append(names, name) // the latest last
			if len(names) > maxNamesPerAddr {
				names = names[len(names)-maxNamesPerAddr:]
			}
			nc.names.put(a, names)
		}
	}
}

// Decide implements nfq.Decider over the engine.
func (nc *netChannel) Decide(ctx context.Context, m nfq.Meta, ev decide.Event) nfq.Outcome {
	// After a component failed, nothing is released any more.
	if nc.d.sup.Err() != nil {
		return nfq.Outcome{Verdict: nfq.Refuse, Reason: codeComponentFailed}
	}
	if m.Recheck {
		return nc.recheck(ctx, m) // revoke.go
	}
	// A connection redirected to the interception is decided there:
	// the connection by its server name, then each request.
	if nc.icpt.handles(m.Flow.Dst, m.Flow.DstPort, m.Flow.Proto) {
		return nfq.Outcome{Verdict: nfq.Release, Reason: "intercepted"}
	}
	if nc.icpt.refusesUDP(m, &ev) {
		return nc.icpt.refuseUDP(m)
	}
	// carbd's own resolver traffic is never asked about (ownicmp.go).
	if out, ok := nc.ownICMP(m, &ev); ok {
		return out
	}
	// A name the guest gave (a Host header, an SNI) names the destination
	// only if the sandbox's resolver answered it with this address: else
	// a request to any address could claim a party's or the model
	// provider's name. Unproven, the destination is known by its address
	// (and the names the resolver gave for it). Intercepted HTTPS is
	// decided by the interceptor, whose upstream certificate proves it.
	if ev.Dest != nil && ev.Dest.Host != "" && ev.Dest.Addr.IsValid() && !nc.resolved(ev.Dest.Host, ev.Dest.Addr) {
		dst := *ev.Dest
		dst.Host = ""
		ev.Dest = &dst
	}
	if ev.Dest != nil && ev.Dest.Host == "" && ev.Dest.Addr.IsValid() {
		nc.mu.Lock()
		if names, _ := nc.names.get(ev.Dest.Addr.Unmap()); len(names) > 0 {
			dst := *ev.Dest
			dst.Host = names[len(names)-1]
			ev.Dest = &dst
		}
		nc.mu.Unlock()
	}
	// What the agent read before it sent this must be known before it is
	// decided (a read then a send at once would otherwise race the
	// tracer). If that cannot be established, refuse: fail closed.
	// Likewise what the world answered on this connection before this
	// request (a link copied from a page just fetched).
	if nc.resp != nil && m.Flow.Proto == 6 {
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_ = nc.resp.WaitSeen(wctx, netip.AddrPortFrom(m.Flow.Src, m.Flow.SrcPort), netip.AddrPortFrom(m.Flow.Dst, m.Flow.DstPort), m.Seq)
		cancel()
	}
	if t := nc.traced; t != nil {
		<-t // the file tracer is set up (startNetns)
	}
	if err := nc.d.files.syncTracing(ctx); err != nil {
		nc.d.log.Warn("refused without a decision: the file trace could not be brought up to date", "effect", nc.d.engine.Policy().Redact(ev.Summary()), "err", err)
		return nfq.Outcome{Verdict: nfq.Refuse, Reason: "tracing-sync"}
	}
	// What the agent has read, before the decision: a release to the
	// end of the flow stands while it stays so (revoke.go).
	nc.d.open.noteLevel(m.Flow, nc.d.engine.ReadLevel())
	ctx, done := nc.whileClientWaits(ctx, m.Flow)
	defer done()
	res := nc.d.engine.Propose(ctx, ev)
	dec := res.Decision
	if cf := nc.d.sup.Err(); cf != nil {
		// A component failed while this was decided: refuse what it
		// would release or hold, and every effect its resolutions name.
		if dec.Verdict != decide.Refuse {
			dec = failedDecision(dec, cf)
			nc.d.auditFailed(dec)
		}
		for i := range res.Resolutions {
			res.Resolutions[i] = *failedResolution(&res.Resolutions[i], cf)
		}
	}
	nc.d.record(dec)
	nc.note(m.Flow, dec)
	out := nfq.Outcome{Reason: dec.Reason.Code}
	switch dec.Verdict {
	case decide.Release:
		out.Verdict = nfq.Release
	case decide.Defer:
		out.Verdict, out.Ticket = nfq.Hold, dec.Seq
		nc.clients.watchHeld(dec.Seq, m.Flow)
		nc.d.resolveSoon(dec.Scope)
	default:
		out.Verdict = nfq.Refuse
	}
	for i := range res.Resolutions {
		r := &res.Resolutions[i]
		out.Resolutions = append(out.Resolutions, nfq.Resolutions(r)...)
		for _, e := range r.Effects {
			nc.d.record(e)
			if nc.d.files != nil {
				nc.d.files.note(e)
			}
		}
		if r.Notice != "" {
			nc.d.notify(r.Notice)
		}
		nc.finals(r)
	}
	return out
}

func (nc *netChannel) note(k tcx.FlowKey, dec decide.Decision) {
	id := newFlowID(netip.AddrPortFrom(k.Src, k.SrcPort), netip.AddrPortFrom(k.Dst, k.DstPort), k.Proto)
	nc.mu.Lock()
	defer nc.mu.Unlock()
	v := dec.Verdict.String()
	if dec.Verdict == decide.Defer {
		v = "held"
		nc.bySeq[dec.Seq] = id
	}
	nc.flows.put(id, flowNote{seq: dec.Seq, verdict: v, reason: dec.Reason.Code + ": " + dec.Justification, at: time.Now()})
}

// applyResolution hands a resolved scope to the verdict loop.
func (nc *netChannel) applyResolution(r *decide.Resolution) {
	if nc.loop != nil {
		nc.loop.ApplyResolution(r)
	}
	nc.icpt.resolved(r)
	nc.finals(r)
}

// finals records the final verdicts of held flows for the audit capture.
func (nc *netChannel) finals(r *decide.Resolution) {
	nc.mu.Lock()
	defer nc.mu.Unlock()
	for _, e := range r.Effects {
		if id, ok := nc.bySeq[e.Seq]; ok {
			delete(nc.bySeq, e.Seq)
			nc.flows.put(id, flowNote{seq: e.Seq, verdict: e.Verdict.String(), reason: e.Reason.Code + ": " + e.Justification, at: time.Now()})
		}
	}
}

// annotate labels a captured frame with its flow's latest decision.
// Frames that never leave the link (ARP, IPv6 neighbour discovery and
// other link-local traffic, which carbd does not decide) are
// "link-local"; a frame of a flow without a decision is "undecided".
//
// Final (the streamed audit writes the frame now) is set for link-local
// frames and for frames of a decided, not held flow, except the sandbox's
// frames with payload captured before the flow's latest decision: the
// capture sees a frame before the verdict loop decides it, and a kept-
// alive connection's next request may be decided otherwise. Such frames
// wait for a newer decision or the stream's delay (the hold timeout).
func (nc *netChannel) annotate(r capture.Record) capture.Annotation {
	p := gopacket.NewPacket(r.Data, layers.LayerTypeEthernet, gopacket.NoCopy)
	var src, dst netip.Addr
	var proto uint8
	switch ip := p.NetworkLayer().(type) {
	case *layers.IPv4:
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		proto = uint8(ip.Protocol)
	case *layers.IPv6:
		src, _ = netip.AddrFromSlice(ip.SrcIP)
		dst, _ = netip.AddrFromSlice(ip.DstIP)
		proto = uint8(ip.NextHeader)
	default:
		what := "not IP"
		if eth, ok := p.LinkLayer().(*layers.Ethernet); ok {
			what = eth.EthernetType.String()
		}
		return capture.Annotation{Verdict: "link-local", Reason: what + " (not an effect beyond the link)", Final: true}
	}
	if linkLocal(src) || linkLocal(dst) {
		return capture.Annotation{Verdict: "link-local", Reason: "link-local address (not an effect beyond the link)", Final: true}
	}
	var sp, dpt uint16
	payload := false
	switch l4 := p.TransportLayer().(type) {
	case *layers.TCP:
		sp, dpt = uint16(l4.SrcPort), uint16(l4.DstPort)
		payload = len(l4.Payload) > 0 || l4.SYN || l4.FIN
	case *layers.UDP:
		sp, dpt = uint16(l4.SrcPort), uint16(l4.DstPort)
		payload = true
	default:
		payload = true
	}
	id := newFlowID(netip.AddrPortFrom(src.Unmap(), sp), netip.AddrPortFrom(dst.Unmap(), dpt), proto)
	nc.mu.Lock()
	n, ok := nc.flows.peek(id)
	nc.mu.Unlock()
	if !ok {
		return capture.Annotation{Verdict: "undecided"}
	}
	final := n.verdict != "held" && !(r.Dir == capture.Egress && payload && n.at.Before(r.Time))
	return capture.Annotation{Verdict: n.verdict, Seq: n.seq, Reason: n.reason, Final: final}
}

// linkLocal: addresses whose traffic stays on the sandbox's link.
func linkLocal(a netip.Addr) bool {
	return a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast()
}

func (nc *netChannel) writePcap(w io.Writer) error {
	if nc.cap == nil {
		return errors.New("no capture on this sandbox")
	}
	return nc.cap.WritePcapng(w, nc.annotate)
}

func (nc *netChannel) close() error {
	var errs []error
	if nc.d.sandbox != nil {
		_ = nc.d.sandbox.Kill()
	}
	if nc.cap != nil {
		nc.cap.Close()
	}
	if nc.closeStream != nil {
		// Frames still held back are written with their verdicts now.
		errs = append(errs, nc.closeStream())
	}
	if nc.dns != nil {
		nc.dns.Close()
	}
	if nc.cancel != nil {
		nc.cancel()
	}
	nc.wg.Wait()
	// Cut the sandbox off before its hooks come down: a socket its
	// killed processes left behind (an orphaned TCP connection still
	// retransmitting a request that was held) must never find the path
	// open once the program and the rules are gone.
	if nc.sb != nil {
		errs = append(errs, nc.sb.Close())
	}
	if nc.nat != nil {
		errs = append(errs, nc.nat())
	}
	if nc.dp != nil {
		errs = append(errs, nc.dp.Close())
	}
	if nc.rulesDone != nil {
		<-nc.rulesDone
	}
	if nc.rules.SandboxID != "" {
		errs = append(errs, nfrules.Remove(nc.rules))
	}
	for i := len(nc.closers) - 1; i >= 0; i-- {
		errs = append(errs, nc.closers[i]())
	}
	return errors.Join(errs...)
}
