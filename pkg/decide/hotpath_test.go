package decide

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// A released effect costs no allocation of its own: the decision's Event
// comes from a chunk shared by slabEvents decisions and the justification
// is memoised. More than one allocation per eight decisions means
// something on the release path allocates per call again.
func TestProposeReleaseAllocations(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	e := New(p, Options{MaxTraceEvents: 64})
	e.Task("post the report to api.example.com")
	e.Observe(Event{Ch: ChanFile, Dir: In, Obj: "secrets/token", Content: "tok_9f8e7d6c5b4a39281 and a password hunter2hunter2"})
	ev := post("api.example.com", "the weekly report: all good")
	ctx := context.Background()
	for range 200 { // fill the trace ring and the memo
		e.Propose(ctx, ev)
	}
	const n = 1600
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		if d := e.Propose(ctx, ev).Decision; d.Verdict != Release {
			t.Fatalf("not released: %s", d.Justification)
		}
	}
	runtime.ReadMemStats(&after)
	if allocs := after.Mallocs - before.Mallocs; allocs > n/8 {
		t.Errorf("%d released decisions allocated %d times, want at most %d", n, allocs, n/8)
	}
}

// Decisions share chunks of Events, never an Event: each keeps its own
// effect (as redacted and role-mapped by the engine) after later
// proposals, and a held decision's Event is its own.
func TestDecisionEventsAreDistinct(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	e := New(p, Options{})
	e.Task("post to api.example.com")
	ctx := context.Background()
	var ds []Decision
	for i := range 3*slabEvents + 1 {
		ds = append(ds, e.Propose(ctx, post("api.example.com", fmt.Sprintf("body %d", i))).Decision)
	}
	for i, d := range ds {
		if d.Event == nil || d.Event.Content != fmt.Sprintf("body %d", i) || d.Event.Seq != d.Seq {
			t.Fatalf("decision %d (seq %d): event %+v", i, d.Seq, d.Event)
		}
	}
	held := e.Propose(ctx, post("other.example.net", "x")).Decision
	if held.Verdict != Defer {
		t.Fatalf("setup: %v", held.Verdict)
	}
	h := e.Held()
	if len(h) != 1 || h[0].Event == nil || h[0].Event.Obj != "https://other.example.net/" || h[0].Event == held.Event {
		t.Fatalf("held: %+v", h)
	}
}

// The memoised release justification reads as it did when it was built per
// decision, and follows a policy reload that renames the levels.
func TestReleaseJustificationFollowsPolicy(t *testing.T) {
	e := New(mustPolicy(t, basePolicy), Options{})
	e.Task("post to api.example.com")
	ctx := context.Background()
	want := "every gated value is derivable from trusted sources and its public data is cleared for api (internal)"
	for range 2 {
		if d := e.Propose(ctx, post("api.example.com", "hello")).Decision; d.Justification != want {
			t.Fatalf("justification %q, want %q", d.Justification, want)
		}
	}
	renamed := strings.Replace(basePolicy, "levels: [public, internal, secret]", "levels: [public, inside, secret]", 1)
	renamed = strings.Replace(renamed, "clearance: internal", "clearance: inside", 1)
	e.SetPolicy(mustPolicy(t, renamed))
	want = "every gated value is derivable from trusted sources and its public data is cleared for api (inside)"
	if d := e.Propose(ctx, post("api.example.com", "hello")).Decision; d.Justification != want {
		t.Fatalf("after reload: justification %q, want %q", d.Justification, want)
	}
}

// Every archive or compression magic is recognised at the start of the
// content, and only there and only whole.
func TestPackedMagicPrefixes(t *testing.T) {
	for _, m := range []string{"\x1f\x8b", "PK\x03\x04", "\x28\xb5\x2f\xfd", "\xfd7zXZ\x00", "BZh", "7z\xbc\xaf\x27\x1c"} {
		for _, c := range []struct {
			content string
			want    bool
		}{
			{m, true},
			{m + "rest of the archive", true},
			{m[:len(m)-1], false},
			{" " + m, false},
		} {
			ev := Event{Ch: ChanNet, Dir: Out, Op: "http:POST", Content: c.content}
			if got := packedContent(&ev); got != c.want {
				t.Errorf("packedContent(%q) = %v, want %v", c.content, got, c.want)
			}
		}
	}
}
