package nfq

import (
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// The core's side of the tap offload tests (gso_linux_test.go), on
// synthetic packets: what the kernel's queue delivers under offloads.

// sendAs dispatches one packet as the queue delivers it: a segment the
// kernel cut from a GSO packet has no hardware address; a GSO packet
// queued whole is flagged.
func (h *harness) sendAs(b []byte, hasHW, gso bool) uint32 {
	id := h.id.Add(1)
	p := &packet{id: id, data: b, time: time.Now(), indev: 7, gso: gso, csumNotReady: gso}
	if hasHW {
		p.hw, p.hasHW = [6]byte{2, 0, 0, 0, 0, 1}, true
	}
	h.c.dispatch(p)
	return id
}

// TestCoreRSTForSegmentedPackets: a refused request whose packets came
// without a hardware address (segments of a GSO packet) still resets its
// client, with the address its SYN came with; a source never seen with
// one gets no RST (there is nowhere to send it).
func TestCoreRSTForSegmentedPackets(t *testing.T) {
	h := newHarness(t, always(Refuse), nil)
	c := h.dial(cli4, srv4, 40100, 8080) // the SYN carries the address
	seg := func(data string) uint32 {
		id := h.sendAs(tcpPkt(t, tcpSeg{src: cli4, dst: srv4, sport: 40100, dport: 8080, seq: c.next, ack: c.ack, payload: []byte(data)}), false, false)
		c.next += uint32(len(data))
		return id
	}
	p1, p2 := seg(reqHead), seg("\r\n")
	h.want(p1, false)
	h.want(p2, false)
	// The worker sends the RST after the packets' verdicts: wait for it.
	var rsts []rstInfo
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		h.out.mu.Lock()
		rsts = append([]rstInfo(nil), h.out.rsts...)
		h.out.mu.Unlock()
		if len(rsts) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(rsts) != 1 || rsts[0].hw != [6]byte{2, 0, 0, 0, 0, 1} || rsts[0].ifindex != 7 {
		t.Fatalf("RSTs %+v, want one to the SYN's hardware address", rsts)
	}

	// A client whose every packet lacks the address.
	other := cli4.Next()
	syn := h.sendAs(tcpPkt(t, tcpSeg{src: other, dst: srv4, sport: 40101, dport: 8080, seq: 1000, syn: true}), false, false)
	h.want(syn, true)
	q1 := h.sendAs(tcpPkt(t, tcpSeg{src: other, dst: srv4, sport: 40101, dport: 8080, seq: 1001, ack: 5001, payload: []byte(reqHead + "\r\n")}), false, false)
	h.want(q1, false)
	// A barrier: the flow's worker handles this retransmission after it
	// finished with q1 (an RST included), in order.
	h.want(h.sendAs(tcpPkt(t, tcpSeg{src: other, dst: srv4, sport: 40101, dport: 8080, seq: 1001, ack: 5001, payload: []byte(reqHead + "\r\n")}), false, false), false)
	h.out.mu.Lock()
	n := len(h.out.rsts)
	h.out.mu.Unlock()
	if n != 1 {
		t.Errorf("%d RSTs, want none for a client never seen with a hardware address", n-1)
	}
}

// TestCoreUDPSuperPacketOpaque: a UDP packet queued whole as GSO is
// decided as one opaque effect, whatever its first datagram parses as; the
// same bytes queued as an ordinary datagram are a DNS query.
func TestCoreUDPSuperPacketOpaque(t *testing.T) {
	dec := always(Release)
	h := newHarness(t, dec, nil)
	var queries []byte
	for _, name := range []string{"ok0000.test", "lk0001.test"} {
		queries = append(queries, dnsQuery(t, name)...)
	}
	one := dnsQuery(t, "ok0000.test")
	h.want(h.sendAs(udpPkt(t, cli4, srv4, 40200, 53, one), true, false), true)
	h.want(h.sendAs(udpPkt(t, cli4, srv4, 40201, 53, queries), true, true), true)
	h.want(h.sendAs(udpPkt(t, cli4, srv4, 40202, 9100, []byte("datagram")), true, true), true)
	evs := dec.events()
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	if evs[0].Op != "dns:query" || netparse.IsOpaque(&evs[0]) {
		t.Errorf("an ordinary DNS datagram decided as %s (opaque %v), want dns:query", evs[0].Op, netparse.IsOpaque(&evs[0]))
	}
	for _, ev := range evs[1:] {
		if ev.Op != "udp:datagram" || !netparse.IsOpaque(&ev) || !strings.Contains(fieldValue(&ev, netparse.FieldOpaqueReason), "datagram boundaries") {
			t.Errorf("a UDP super-packet decided as %s (opaque %v, reason %q), want an opaque udp:datagram",
				ev.Op, netparse.IsOpaque(&ev), fieldValue(&ev, netparse.FieldOpaqueReason))
		}
	}
	if got := evs[1].Content; got != string(queries) {
		t.Errorf("the super-packet's content is %d bytes, want all %d", len(got), len(queries))
	}
}

func fieldValue(ev *decide.Event, name string) string {
	for _, f := range ev.Fields {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}
