package decide

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A question is withdrawn when no client waits for it any more: one of
// two effects asking it leaves and the question stays; the other leaves
// and it is withdrawn, both effects refused as withdrawn; an answer
// afterwards says so.
func TestOperatorWithdraw(t *testing.T) {
	op := NewOperator(time.Minute)
	op.Now = func() time.Time { return time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC) }
	dns := func(seq uint64) DeferredEffect {
		ev := Event{Op: "dns:query", Fields: []Field{{Name: "qname", Role: RoleTarget, Value: "github.com"}, {Name: "qtype", Role: RoleControl, Value: "A"}}}
		k, s := questionKey(&ev)
		return DeferredEffect{Seq: seq, Summary: "dns github.com", Key: k, Scope: s}
	}
	type res struct {
		a   []OracleAnswer
		err error
	}
	ask := func(ctx context.Context, d DeferredEffect) chan res {
		ch := make(chan res, 1)
		go func() {
			a, err := op.Decide(ctx, &View{Deferred: []DeferredEffect{d}})
			ch <- res{a, err}
		}()
		return ch
	}
	ctx1, gone1 := context.WithCancelCause(context.Background())
	first := ask(ctx1, dns(1))
	waitPending(t, op, 1)
	second := ask(context.Background(), dns(2))
	for i := 0; i < 400 && op.Pending()[0].Waiting < 2; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if p := op.Pending(); p[0].Waiting != 2 {
		t.Fatalf("two effects should wait on one question: %+v", p)
	}
	// The first client goes (its context ends): the question stays.
	gone1(fmt.Errorf("%w: the guest reset the connection", ErrClientGone))
	r := <-first
	if r.err != nil || len(r.a) != 1 || !r.a[0].Withdrawn || r.a[0].Verdict != Refuse || !strings.Contains(r.a[0].Justification, "the guest reset the connection") {
		t.Fatalf("the first effect: %+v %v", r.a, r.err)
	}
	p := op.Pending()
	if len(p) != 1 || p[0].ID != 1 || p[0].Waiting != 1 {
		t.Fatalf("the question after one client left: %+v", p)
	}
	if len(op.Withdrawals(time.Time{})) != 0 {
		t.Errorf("withdrawn while a client waits: %+v", op.Withdrawals(time.Time{}))
	}
	// The second goes too (Withdraw): the question is withdrawn.
	op.Withdraw(2, "the client stopped retransmitting")
	r = <-second
	if len(r.a) != 1 || !r.a[0].Withdrawn || r.a[0].Verdict != Refuse {
		t.Fatalf("the second effect: %+v %v", r.a, r.err)
	}
	if p := op.Pending(); len(p) != 0 {
		t.Fatalf("pending after both clients left: %+v", p)
	}
	w := op.Withdrawals(time.Time{})
	if len(w) != 1 || w[0].ID != 1 || w[0].Reason != "the client stopped retransmitting" || w[0].At.IsZero() {
		t.Fatalf("withdrawals: %+v", w)
	}
	for _, id := range []uint64{1, 2} {
		err := op.AnswerWith(Answer{ID: id, Verdict: Release})
		if !errors.Is(err, ErrWithdrawn) || !strings.Contains(err.Error(), "question 1 was withdrawn (its client is gone") {
			t.Errorf("answer %d after the withdrawal: %v", id, err)
		}
	}
	if err := op.Answer(77, Release, ""); err != ErrNotPending {
		t.Errorf("answer to an unknown id: %v", err)
	}
	// An effect whose client left before it was asked (a scope's) is
	// withdrawn when it is; the same question asked anew is a new one.
	op.Withdraw(3, "the guest closed the connection")
	r = <-ask(context.Background(), dns(3))
	if len(r.a) != 1 || !r.a[0].Withdrawn {
		t.Fatalf("an effect gone before it was asked: %+v", r.a)
	}
	fresh := ask(context.Background(), dns(4))
	if p := waitPending(t, op, 1); p[0].ID != 4 {
		t.Fatalf("the question asked anew: %+v", p)
	}
	if err := op.Answer(4, Release, "ok"); err != nil {
		t.Fatal(err)
	}
	if r := <-fresh; len(r.a) != 1 || r.a[0].Verdict != Release || r.a[0].Withdrawn {
		t.Fatalf("the new question's answer: %+v", r.a)
	}
	// A context ended for another reason is an error, not a withdrawal.
	ctx5, cancel5 := context.WithCancel(context.Background())
	stopped := ask(ctx5, dns(5))
	waitPending(t, op, 1)
	cancel5()
	if r := <-stopped; r.err == nil {
		t.Fatalf("a cancelled question: %+v", r.a)
	}
	if len(op.Pending()) != 0 || len(op.Withdrawals(time.Time{})) != 1 {
		t.Fatalf("after a cancellation: pending %+v, withdrawn %+v", op.Pending(), op.Withdrawals(time.Time{}))
	}
}

// The engine records a withdrawn effect as refused with its own code.
func TestEngineWithdrawnCode(t *testing.T) {
	p := mustPolicy(t, basePolicy)
	op := NewOperator(time.Minute)
	e := New(p, Options{Oracle: op})
	e.Task("fetch the docs")
	get := Event{Ch: ChanNet, Dir: Out, Op: "http:GET", Obj: "http://unknown.example/",
		Fields: []Field{{Name: "host", Role: RoleTarget, Value: "unknown.example"}}, Dest: &Dest{Host: "unknown.example", Port: 80}}
	ctx, gone := context.WithCancelCause(context.Background())
	got := make(chan Decision, 1)
	go func() { got <- e.Propose(ctx, get).Decision }()
	waitPending(t, op, 1)
	gone(fmt.Errorf("%w: the guest reset the connection", ErrClientGone))
	d := <-got
	if d.Verdict != Refuse || d.Reason.Code != CodeOracleWithdrawn || !strings.Contains(d.Justification, "withdrawn at ") {
		t.Fatalf("withdrawn effect: %v %s (%s)", d.Verdict, d.Reason.Code, d.Justification)
	}
	if len(op.Pending()) != 0 {
		t.Errorf("pending: %+v", op.Pending())
	}
}
