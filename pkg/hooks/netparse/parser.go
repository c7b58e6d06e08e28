package netparse

import (
	"errors"
	"net/netip"
	"strconv"
	"time"
)

// Action is what the verdict loop does with the packet it fed.
type Action uint8

const (
	// Refuse: drop the packet; it belongs to something refused without
	// asking the policy (a malformed packet, an unreassemblable fragment,
	// a retransmission that rewrites bytes, a full table). Err says why.
	// The zero Action refuses, so a forgotten case fails closed.
	Refuse Action = iota
	// Hold: keep the packet queued; its bytes belong to an effect that is
	// not complete yet. A later Result (or Expire) returns the effect.
	Hold
	// Decide: Effects holds the effects this packet completed; decide
	// them. The packet's bytes belong to them, and also to an effect still
	// incomplete when Tail is set (keep holding it after the decision).
	Decide
	// Covered: the packet's bytes all belong to effects returned earlier
	// (a retransmission, the rest of an oversized body, data after a
	// ClientHello): apply their verdicts.
	Covered
	// NoData: the packet carries no content of its own (SYN, pure ACK, a
	// FIN or RST without data). Effects may still be set when the packet
	// ended a stream (a FIN flushes an incomplete request).
	NoData
	// Drop: drop the packet without a decision; it has nothing to decide
	// (an exact duplicate of a held fragment) or cannot be taken now (bad
	// checksum, beyond the reassembly window or memory); a real sender
	// retransmits.
	Drop
)

var actionNames = [...]string{Refuse: "refuse", Hold: "hold", Decide: "decide", Covered: "covered", NoData: "nodata", Drop: "drop"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Meta is what the verdict loop knows about a packet besides its bytes.
type Meta struct {
	// Time is when the packet was queued; the parser's timeouts use it
	// and never read the clock.
	Time time.Time
	// ChecksumNotReady says the kernel has not computed the transport
	// checksum yet (NFQUEUE's NFQA_SKB_CSUMNOTREADY with the GSO flag).
	ChecksumNotReady bool
}

// Result is the parser's answer for one packet. It and everything it
// points to are valid until the next call to Feed or Expire.
type Result struct {
	Action Action
	// Err says why a packet is refused or dropped.
	Err error
	// Packet is the decoded packet (nil when it could not be decoded).
	// For a fragment, or a datagram reassembled from fragments,
	// Packet.Datagram names the datagram: the Action applies to all its
	// fragments.
	Packet *Packet
	// Tail: with Decide, part of the packet belongs to an effect not
	// complete yet.
	Tail bool
	// Effects are the effects completed by this packet (or by Expire).
	Effects []Effect
	// Expired names datagrams whose reassembly timed out: drop the
	// fragments held for them.
	Expired []FragKey
}

func (r *Result) reset() {
	r.Action, r.Err, r.Packet, r.Tail = Refuse, nil, nil, false
	r.Effects, r.Expired = r.Effects[:0], r.Expired[:0]
}

// add appends a cleared effect and returns it, reusing earlier buffers.
func (r *Result) add() *Effect {
	if len(r.Effects) < cap(r.Effects) {
		r.Effects = r.Effects[:len(r.Effects)+1]
	} else {
		r.Effects = append(r.Effects, Effect{})
	}
	e := &r.Effects[len(r.Effects)-1]
	e.reset()
	return e
}

// Parser turns packets into effects. It keeps TCP flows, fragments and
// QUIC connections; it is not safe for concurrent use (one per verdict
// loop goroutine).
type Parser struct {
	cfg   Config
	dec   *Decoder
	frag  *reassembler
	quic  quicDecoder
	flows map[flowKey]*flow
	// quicFlows remembers the 4-tuples that sent a QUIC Initial: their
	// later datagrams are encrypted.
	quicFlows   map[flowKey]time.Time
	streamBytes int
	free        [][]byte
	trims       []*flow
	dead        []*flow
	tlsScratch  []byte
	scratch     HTTPRequest
	fragPkt     Packet
	res         Result
	fed         uint64
}

// NewParser returns a parser; zero Config fields take their defaults.
func NewParser(cfg Config) (*Parser, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Parser{
		cfg:       c,
		dec:       NewDecoder(!c.IgnoreChecksums),
		flows:     make(map[flowKey]*flow),
		quicFlows: make(map[flowKey]time.Time),
	}
	p.frag = newReassembler(&p.cfg)
	return p, nil
}

// Config returns the configuration in use (defaults filled in).
func (p *Parser) Config() Config { return p.cfg }

// Feed parses one packet the guest sent (it starts at the IP header).
// The packet is not modified; the Result may point into it.
func (p *Parser) Feed(pkt []byte, m Meta) *Result {
	p.maintain()
	p.fed++
	res := &p.res
	res.reset()
	pk, err := p.dec.decode(pkt, m.ChecksumNotReady || p.cfg.IgnoreChecksums)
	if err != nil {
		res.Err = err
		if errors.Is(err, ErrChecksum) {
			res.Action = Drop
		}
		return res
	}
	res.Packet = pk
	if pk.IsFragment {
		payload, head, err := p.frag.add(m.Time, pk)
		switch {
		case errors.Is(err, errFragDup):
			res.Action = Drop
			res.Err = err
			return res
		case err != nil:
			res.Err = err
			return res
		case payload == nil:
			res.Action = Hold
			return res
		}
		p.fragPkt = *pk
		p.fragPkt.Payload = nil
		if pk, err = p.dec.DecodeTransport(head, payload); err != nil {
			// The datagram is refused: name it so that the fragments held
			// for it are dropped too.
			res.Packet = &p.fragPkt
			res.Err = err
			return res
		}
		pk.Datagram, pk.Frag = p.fragPkt.Datagram, p.fragPkt.Frag
		res.Packet = pk
	}
	switch pk.Proto {
	case ProtoTCP:
		p.tcp(pk, m.Time, res)
	case ProtoUDP:
		p.udp(pk, m.Time, res)
	case ProtoICMP, ProtoICMPv6:
		if pk.Family == 4 && pk.Proto == ProtoICMP || pk.Family == 6 && pk.Proto == ProtoICMPv6 {
			p.icmp(pk, m.Time, res)
		} else {
			p.ipOpaque(pk, m.Time, res)
		}
	default:
		p.ipOpaque(pk, m.Time, res)
	}
	return res
}

// base fills the fields every effect of packet pk has.
func (p *Parser) base(e *Effect, k Kind, pk *Packet, now time.Time) {
	e.Kind, e.Time, e.Family, e.Proto = k, now, pk.Family, pk.Proto
	e.Src, e.Dst = pk.SrcAddrPort(), pk.DstAddrPort()
}

func (p *Parser) udp(pk *Packet, now time.Time, res *Result) {
	res.Action = Decide
	e := res.add()
	payload := pk.Payload
	key := flowKey{pk.SrcAddrPort(), pk.DstAddrPort()}
	if pk.DstPort == 53 {
		p.base(e, KindDNS, pk, now)
		e.Content = payload
		if err := parseDNSQuery(payload, &e.DNS); err != nil {
			e.Opaque = err
		}
		return
	}
	if initial, known := isQUICLong(payload); known {
		if !initial {
			p.base(e, KindUDP, pk, now)
			e.Content, e.Opaque = payload, ErrOpaqueQUIC
			return
		}
		p.base(e, KindQUIC, pk, now)
		if err := p.quic.parse(payload, &e.QUIC); err != nil {
			e.Kind = KindUDP
			e.Content, e.Opaque = payload, err
			return
		}
		e.Opaque = ErrOpaqueQUIC
		if e.QUIC.Opaque != nil {
			e.Opaque = e.QUIC.Opaque
		}
		if _, ok := p.quicFlows[key]; ok || len(p.quicFlows) < p.cfg.MaxFlows {
			p.quicFlows[key] = now
		}
		return
	}
	p.base(e, KindUDP, pk, now)
	e.Content = payload
	if t, ok := p.quicFlows[key]; ok {
		if t.Before(now) {
			p.quicFlows[key] = now
		}
		e.Opaque = ErrOpaqueQUIC
	} else if pk.DstPort == 443 && len(payload) > 0 && payload[0]&0xc0 == 0x40 {
		// A QUIC short header to the HTTPS port whose Initial carbd did not
		// see (or no longer tracks): encrypted.
		e.Opaque = ErrOpaqueQUIC
	}
}

func (p *Parser) icmp(pk *Packet, now time.Time, res *Result) {
	res.Action = Decide
	e := res.add()
	echo := pk.Family == 4 && (pk.ICMPType == 8 || pk.ICMPType == 0) ||
		pk.Family == 6 && (pk.ICMPType == 128 || pk.ICMPType == 129)
	k := KindICMPOther
	if echo {
		k = KindICMPEcho
		e.ICMPID, e.ICMPSeq = pk.ICMPID, pk.ICMPSeq
	}
	p.base(e, k, pk, now)
	e.ICMPType, e.ICMPCode = pk.ICMPType, pk.ICMPCode
	e.Content = pk.Payload
}

func (p *Parser) ipOpaque(pk *Packet, now time.Time, res *Result) {
	res.Action = Decide
	e := res.add()
	p.base(e, KindIPOpaque, pk, now)
	e.Content = pk.Payload[:min(len(pk.Payload), p.cfg.MaxOpaqueBytes)]
	e.Opaque = ErrOpaqueProto
}

// Expire advances the parser's clock to now: it returns as effects what
// waited longer than PendingTimeout (Action Decide; NoData when there is
// none), forgets flows idle for FlowIdle and datagrams older than
// FragTimeout (returning their keys in Expired). Call it periodically,
// e.g. every 100 ms.
func (p *Parser) Expire(now time.Time) *Result {
	p.maintain()
	res := &p.res
	res.reset()
	res.Action = Decide
	res.Expired = p.frag.expire(now, res.Expired)
	for k, f := range p.flows {
		if now.Sub(f.last) >= p.cfg.FlowIdle {
			p.dropFlow(k, f)
			continue
		}
		if f.pending() && now.Sub(f.progress) >= p.cfg.PendingTimeout {
			p.flush(f, now, res, ErrPendingTimeout)
		}
	}
	for k, t := range p.quicFlows {
		if now.Sub(t) >= p.cfg.FlowIdle {
			delete(p.quicFlows, k)
		}
	}
	if len(res.Effects) == 0 {
		res.Action = NoData
	}
	return res
}

// Touch restarts a TCP flow's wait for the rest of a request at now: the
// verdict loop released a part of its body, and the client, whose window
// the held part filled, can only now send more. Without it a part whose
// decision took longer than PendingTimeout left the rest of the upload to
// be decided at once as one opaque effect (and refused), however quickly
// the client went on.
func (p *Parser) Touch(src, dst netip.AddrPort, now time.Time) {
	if f := p.flows[flowKey{src, dst}]; f != nil && now.After(f.progress) {
		f.progress = now
	}
}

// Forget drops the state of a TCP flow (the verdict loop refused it or
// reset the connection).
func (p *Parser) Forget(src, dst netip.AddrPort) {
	k := flowKey{src, dst}
	if f := p.flows[k]; f != nil {
		p.dropFlow(k, f)
	}
}

// Resync tells the parser that the bytes of a flow before nextSeq were
// released by an earlier decision it no longer remembers (a restart, an
// eviction): parsing restarts at nextSeq with a new request.
func (p *Parser) Resync(src, dst netip.AddrPort, nextSeq uint32, now time.Time) error {
	k := flowKey{src, dst}
	if f := p.flows[k]; f != nil {
		p.dropFlow(k, f)
	}
	if len(p.flows) >= p.cfg.MaxFlows {
		return ErrFlowsFull
	}
	f := p.newFlow(k, nextSeq, now)
	f.synSeen = true
	return nil
}

// Flows returns how many TCP flows the parser tracks.
func (p *Parser) Flows() int { return len(p.flows) }
