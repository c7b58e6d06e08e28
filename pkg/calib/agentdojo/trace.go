package agentdojo

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/carbd/carbd/pkg/decide"
)

// Trace converts the run into carbd events, in the order they crossed the
// boundary (Kairos §IV, "Kairos integration"):
//
//   - the system prompt is ignored (it is the agent's own configuration);
//   - the first user message is the task: a ctrl/in event from "principal";
//     later user messages are prompts of the pipeline itself (the
//     tool_filter defense asks the model to choose tools) and are not
//     boundary events;
//   - each tool call of an assistant turn is an outgoing event, Op
//     "tool:<function>", Obj the value of the tool's destination argument
//     (or the function name when it has none), one Field per argument with
//     its role from the spec, Content the arguments as JSON; the channel is
//     file for tools the policy makes stageable (the user's own cloud
//     drive), net otherwise;
//   - each tool result follows the calls of its turn, as an incoming event
//     on the same channel with Obj "tool:<function>", Source
//     "<function>(<short args>)" and Content the text the agent read (the
//     error message when the tool failed), without the delimiters the
//     spotlighting_with_delimiting pipeline wraps it in (the pipeline adds
//     them inside the agent, after the output crossed the boundary; the
//     tool's structured output stays parseable for field-level trust);
//   - the agent's final answer, when the run ends with one, is a ctrl/out
//     event to "principal".
//
// Calls the run never answered (it ended first) are outgoing events with
// no result after them. Arguments given as null or as an empty list carry
// no value and are left out of Fields.
func (r *Run) Trace(p *SuiteSpec) ([]decide.Event, error) {
	if p == nil {
		return nil, errors.New("agentdojo: trace: no suite spec")
	}
	tr, err := r.trace(p)
	if err != nil {
		return nil, err
	}
	return tr.events, nil
}

// traced is a trace with, per call, the index of its outgoing event.
type traced struct {
	events []decide.Event
	callEv []int
}

// trace builds the trace; a nil spec applies the defaults to every tool.
func (r *Run) trace(p *SuiteSpec) (*traced, error) {
	if p != nil && p.Suite != r.Suite {
		return nil, fmt.Errorf("agentdojo: trace %s: spec is for suite %q, the run is %q", r.Episode(), p.Suite, r.Suite)
	}
	t := &traced{callEv: make([]int, len(r.Calls))}
	t.events = make([]decide.Event, 0, 2+2*len(r.Calls))
	task := false
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case "user":
			if !task {
				task = true
				t.events = append(t.events, decide.Event{Ch: decide.ChanCtrl, Dir: decide.In, Obj: "principal", Content: m.Content})
			}
		case "assistant":
			for _, ci := range m.Calls {
				t.callEv[ci] = len(t.events)
				t.events = append(t.events, r.callEvent(p, &r.Calls[ci]))
			}
			if i == len(r.Messages)-1 && len(m.Calls) == 0 {
				t.events = append(t.events, decide.Event{Ch: decide.ChanCtrl, Dir: decide.Out, Obj: "principal", Content: m.Content})
			}
		case "tool":
			if m.Answers < 0 || m.Answers >= len(r.Calls) || r.Calls[m.Answers].Result == nil {
				return nil, fmt.Errorf("agentdojo: trace %s: message %d answers no call", r.Episode(), i)
			}
			c := &r.Calls[m.Answers]
			ts := p.Tool(c.Function)
			t.events = append(t.events, decide.Event{
				Ch: ts.Channel, Dir: decide.In, Obj: ts.Op, Op: ts.Op,
				Source: ShortCall(c), Content: r.toolOutput(c.Result.Text()),
			})
		}
	}
	return t, nil
}

// spotlightPipeline is the suffix of the pipelines that wrap every tool
// output in spotlightOpen ... spotlightClose (AgentDojo's
// spotlighting_with_delimiting defense).
const (
	spotlightPipeline = "spotlighting_with_delimiting"
	spotlightOpen     = "<<"
	spotlightClose    = ">>"
)

// toolOutput is a tool's result as the tool returned it: without the
// spotlighting pipeline's delimiters.
func (r *Run) toolOutput(text string) string {
	if strings.HasSuffix(r.Pipeline, spotlightPipeline) && len(text) >= len(spotlightOpen)+len(spotlightClose) &&
		strings.HasPrefix(text, spotlightOpen) && strings.HasSuffix(text, spotlightClose) {
		return text[len(spotlightOpen) : len(text)-len(spotlightClose)]
	}
	return text
}

func (r *Run) callEvent(p *SuiteSpec, c *Call) decide.Event {
	ts := p.Tool(c.Function)
	ev := decide.Event{Ch: ts.Channel, Dir: decide.Out, Op: ts.Op, Obj: c.Function}
	for _, a := range c.Args {
		if isEmptyValue(a.Value) {
			continue
		}
		role, _ := p.Role(c.Function, a.Name)
		v := Render(a.Value)
		ev.Fields = append(ev.Fields, decide.Field{Name: a.Name, Role: role, Value: v})
		if ts.DestField != "" && a.Name == ts.DestField && v != "" {
			ev.Obj = v
		}
	}
	ev.Content = argsJSON(c.Args)
	return ev
}

// isEmptyValue reports whether an argument carries no value: null or [].
func isEmptyValue(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	}
	return false
}

// argsJSON renders a call's arguments as a JSON object, in call order.
func argsJSON(args []Arg) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, a := range args {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(a.Name)
		b.Write(k)
		b.WriteByte(':')
		v, err := json.Marshal(a.Value)
		if err != nil {
			v = []byte("null")
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.String()
}

// ShortCall names a call for a human: read_file(bill-december-2023.txt),
// send_money(recipient=US12..., amount=50, ...). Values are clipped.
func ShortCall(c *Call) string {
	given := 0
	for _, a := range c.Args {
		if !isEmptyValue(a.Value) {
			given++
		}
	}
	var b strings.Builder
	b.WriteString(c.Function)
	b.WriteByte('(')
	n := 0
	for _, a := range c.Args {
		if isEmptyValue(a.Value) {
			continue
		}
		if n > 0 {
			b.WriteString(", ")
		}
		if n == 3 {
			b.WriteString("...")
			break
		}
		v := strings.Join(strings.Fields(Render(a.Value)), " ")
		if given > 1 {
			b.WriteString(a.Name + "=")
		}
		b.WriteString(clip(v, 32))
		n++
	}
	b.WriteByte(')')
	return b.String()
}
