package agentdojo

import (
	"errors"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

// FuzzParseRun: the run parser never panics, every error wraps
// ErrMalformed, and a run it accepts keeps its invariants: every result
// paired with exactly one call, a trace with one outgoing event per call
// and one incoming event per answered call, labels computable. The kept
// corpus is under testdata/fuzz/FuzzParseRun.
func FuzzParseRun(f *testing.F) {
	f.Add([]byte(attackedRun))
	f.Add([]byte(llamaRun))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseRun(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		switch r.Kind {
		case Benign, Attacked, InjectionAsPrompt:
		default:
			t.Fatalf("kind %v", r.Kind)
		}
		answered := 0
		for i, c := range r.Calls {
			if c.Index != i || c.Message < 0 || c.Message >= len(r.Messages) {
				t.Fatalf("call %d: index %d message %d", i, c.Index, c.Message)
			}
			if c.Result != nil {
				answered++
				m := c.Result.Message
				if m < 0 || m >= len(r.Messages) || r.Messages[m].Answers != i || r.Messages[m].Role != "tool" {
					t.Fatalf("call %d: result message %d does not answer it", i, m)
				}
			}
			for _, a := range c.Args {
				_ = Render(a.Value)
			}
		}
		tools := 0
		for _, m := range r.Messages {
			if m.Role == "tool" {
				tools++
				if m.Answers < 0 || m.Answers >= len(r.Calls) {
					t.Fatalf("tool message answers %d of %d calls", m.Answers, len(r.Calls))
				}
			}
		}
		if tools != answered {
			t.Fatalf("%d tool messages, %d answered calls", tools, answered)
		}
		tr, err := r.Trace(NewSuiteSpec(r.Suite, nil))
		if err != nil {
			t.Fatal(err)
		}
		outs, ins := 0, 0
		for _, e := range tr {
			if e.Ch == decide.ChanCtrl {
				continue
			}
			if e.Dir == decide.Out {
				outs++
			} else {
				ins++
			}
		}
		if outs != len(r.Calls) || ins != answered {
			t.Fatalf("trace: %d out for %d calls, %d in for %d answered", outs, len(r.Calls), ins, answered)
		}
		for _, lf := range r.Fields(nil) {
			if lf.Violated && !lf.Attacked {
				t.Fatalf("field %s violated in a run that is not attacked", lf.Name)
			}
		}
		_ = r.InjectionSeen()
	})
}
