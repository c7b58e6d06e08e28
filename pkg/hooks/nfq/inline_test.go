package nfq

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// nowDecider is an InlineDecider for the tests: now decides at once what
// it can (ok false: it declines, and the pool's Decide is asked, through
// pool).
type nowDecider struct {
	*decider                                          // the pool's Decide
	now      func(Meta, decide.Event) (Outcome, bool) // DecideNow
	inline   atomic.Int64                             // effects DecideNow decided
}

func (d *nowDecider) DecideNow(m Meta, ev decide.Event) (Outcome, bool) {
	out, ok := d.now(m, ev)
	if ok {
		d.inline.Add(1)
	}
	return out, ok
}

// TestCoreDecideNow: an InlineDecider's answers apply at once, without
// the pool; what it declines goes to Decide; a panic refuses.
func TestCoreDecideNow(t *testing.T) {
	dec := &nowDecider{
		decider: byHost(map[string]Verdict{"pool.test": Release}),
		now: func(_ Meta, ev decide.Event) (Outcome, bool) {
			switch ev.Dest.Host {
			case "now.test":
				return Outcome{Verdict: Release}, true
			case "no.test":
				return Outcome{Verdict: Refuse}, true
			case "panic.test":
				panic("decider bug")
			}
			return Outcome{}, false
		},
	}
	h := newHarness(t, dec, nil)
	req := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }
	h.want(h.dial(cli4, srv4, 40200, 80).write(req("now.test")), true)
	c := h.dial(cli4, srv4, 40201, 80)
	h.want(c.write(req("no.test")), false)
	h.want(c.write("more"), false) // after the RST: the flow's worker handles in order
	h.out.mu.Lock()
	rsts := len(h.out.rsts)
	h.out.mu.Unlock()
	if rsts != 1 {
		t.Errorf("%d RSTs for the refused flow, want 1", rsts)
	}
	h.want(h.dial(cli4, srv4, 40202, 80).write(req("pool.test")), true)
	h.want(h.dial(cli4, srv4, 40203, 80).write(req("panic.test")), false)
	if n := len(dec.events()); n != 1 {
		t.Errorf("Decide called %d times, want once (pool.test)", n)
	}
	if n := dec.inline.Load(); n != 2 {
		t.Errorf("DecideNow decided %d effects, want 2", n)
	}
	if s := h.c.stats(); s.Panics != 1 || s.Verdicts[DropDecideError] != 1 || s.Verdicts[DropFlowRefused] != 1 || s.Released != 2 || s.Refused != 2 {
		t.Errorf("stats %s", s.String())
	}
}

// TestCoreDecideNowHoldAndResolutions: DecideNow may hold an effect
// under a ticket, and its resolutions reach the worker that holds them,
// this one included (it must not wait on itself).
func TestCoreDecideNowHoldAndResolutions(t *testing.T) {
	var mu sync.Mutex
	held := 0
	dec := &nowDecider{
		decider: always(Refuse),
		now: func(_ Meta, ev decide.Event) (Outcome, bool) {
			mu.Lock()
			defer mu.Unlock()
			if ev.Dest.Host == "hold.test" {
				held++
				return Outcome{Verdict: Hold, Ticket: uint64(held)}, true
			}
			var res []Resolution
			for i := 1; i <= held; i++ {
				res = append(res, Resolution{Ticket: uint64(i), Verdict: Release})
			}
			return Outcome{Verdict: Release, Resolutions: res}, true
		},
	}
	// One worker: the held flows and the releasing one share it.
	h := newHarness(t, dec, func(c *Config) { c.Workers = 1 })
	var ps []uint32
	for i := range 3 {
		ps = append(ps, h.dial(cli4, srv4, uint16(40210+i), 80).write("GET / HTTP/1.1\r\nHost: hold.test\r\n\r\n"))
	}
	for _, p := range ps {
		h.pending(p)
	}
	h.want(h.dial(cli4, srv4, 40219, 80).write("GET / HTTP/1.1\r\nHost: go.test\r\n\r\n"), true)
	for _, p := range ps {
		h.want(p, true)
	}
	if s := h.c.stats(); s.Deferred != 3 || s.Released != 4 || len(dec.events()) != 0 {
		t.Errorf("stats %s; Decide called %d times", s.String(), len(dec.events()))
	}
}

// TestCoreInlineRandomTraffic: TestCoreRandomTraffic's invariants with
// the inline paths and the hand-off paths, several senders at once (the
// inline path takes a worker's lock; the hand-off path its channel).
func TestCoreInlineRandomTraffic(t *testing.T) {
	for _, mode := range []string{"inline", "hand-off"} {
		for seed := uint64(1); seed <= 10; seed++ {
			t.Run(fmt.Sprintf("%s/%d", mode, seed), func(t *testing.T) {
				verdicts := map[string]Verdict{"ok.test": Release, "no.test": Refuse}
				dec := &nowDecider{decider: byHost(verdicts), now: func(_ Meta, ev decide.Event) (Outcome, bool) {
					if ev.Dest == nil || rand.IntN(2) == 0 {
						return Outcome{}, false // to the pool
					}
					v, ok := verdicts[ev.Dest.Host]
					if !ok {
						v = Refuse
					}
					return Outcome{Verdict: v}, true
				}}
				h := newHarness(t, dec, func(c *Config) {
					c.Parser.PendingTimeout = 300 * time.Millisecond
					c.handOff = mode == "hand-off"
				})
				type sent struct {
					id      uint32
					refused bool
				}
				var mu sync.Mutex
				var all []sent
				var wg sync.WaitGroup
				for s := 0; s < 3; s++ { // three senders, two connections each
					r := rand.New(rand.NewPCG(seed, uint64(s)))
					wg.Add(1)
					go func() {
						defer wg.Done()
						for c := 0; c < 2; c++ {
							host := "ok.test"
							if r.IntN(2) == 0 {
								host = "no.test"
							}
							cn := h.dial(cli4, srv4, uint16(42000+10*s+c), 80)
							req := "GET /" + strings.Repeat("p", r.IntN(3000)) + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
							type seg struct {
								seq  uint32
								data string
							}
							var segs []seg
							for off := 0; off < len(req); {
								n := min(1+r.IntN(700), len(req)-off)
								segs = append(segs, seg{cn.next + uint32(off), req[off : off+n]})
								off += n
							}
							r.Shuffle(len(segs), func(i, j int) { segs[i], segs[j] = segs[j], segs[i] })
							for _, sg := range segs {
								id := cn.at(sg.seq, sg.data)
								mu.Lock()
								all = append(all, sent{id, host == "no.test"})
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
				for _, s := range all {
					if h.verdict(s.id) && s.refused {
						t.Fatalf("packet %d of a refused request was accepted", s.id)
					}
				}
			})
		}
	}
}

var _ InlineDecider = (*nowDecider)(nil)
