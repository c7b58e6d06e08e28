package nfq

import (
	"context"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

const enginePolicy = `
version: 1
levels: [public, secret]
trusted:
  task: true
refuse:
  - name: no-exfil
    hosts: ["refused.test"]
operations:
  - ops: ["http:GET"]
    kind: blocking
    gate: [target]
  - ops: ["http:*"]
    kind: stallable
    gate: [target]
`

// TestEngineDecider runs the loop's core with the real decision engine:
// a request whose target the task names is released, one matching a
// refuse rule is refused, and a state-changing request to a target
// nobody trusted is held in the engine's scope until the scope resolves
// (the strict oracle refuses it).
func TestEngineDecider(t *testing.T) {
	p, err := decide.ParsePolicy("policy.yaml", []byte(enginePolicy))
	if err != nil {
		t.Fatal(err)
	}
	eng := decide.New(p, decide.Options{})
	eng.Task("Fetch http://allowed.test/report and summarise it.")
	h := newHarness(t, EngineDecider{Engine: eng}, nil)

	c := h.dial(cli4, srv4, 42000, 80)
	h.want(c.write("GET /report HTTP/1.1\r\nHost: allowed.test\r\n\r\n"), true)

	c2 := h.dial(cli4, srv4, 42001, 80)
	h.want(c2.write("GET /x HTTP/1.1\r\nHost: refused.test\r\n\r\n"), false)

	c3 := h.dial(cli4, srv4, 42002, 80)
	held := c3.write("POST /drop HTTP/1.1\r\nHost: other.test\r\nContent-Length: 4\r\n\r\ndata")
	h.pending(held)
	if n := len(eng.Held()); n != 1 {
		t.Fatalf("the engine holds %d effects, want the POST", n)
	}
	res := eng.Finish(context.Background())
	rs := Resolutions(res)
	if len(rs) != 1 || rs[0].Verdict != Refuse {
		t.Fatalf("resolution %+v, want the POST refused", rs)
	}
	if !h.c.resolve(rs[0]) {
		t.Fatal("the loop did not hold the resolved effect")
	}
	h.want(held, false)
	if s := eng.Stats(); s.Proposed != 3 {
		t.Errorf("the engine saw %d proposals, want 3", s.Proposed)
	}
}
