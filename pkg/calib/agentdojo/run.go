package agentdojo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// RunKind classifies a run by what its user prompt is.
type RunKind uint8

const (
	// Benign: a user task with no injection planted
	// (user_task_N/none/none.json).
	Benign RunKind = iota + 1
	// Attacked: a user task with an injection task's goal planted in
	// the environment (user_task_N/<attack>/injection_task_M.json).
	Attacked
	// InjectionAsPrompt: the injection goal given directly as the user's
	// prompt (injection_task_M/none/none.json), a feasibility check of
	// the goal. It is neither benign data nor an attack.
	InjectionAsPrompt
)

var kindNames = [...]string{Benign: "benign", Attacked: "attacked", InjectionAsPrompt: "injection-as-prompt"}

func (k RunKind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// MarshalText renders the kind by name.
func (k RunKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Message is one message of a run's conversation, its content flattened to
// text (Llama-3.3 runs store content as a list of text parts).
type Message struct {
	Role    string // system, user, assistant or tool
	Content string
	// Calls are the indices into Run.Calls of the tool calls an assistant
	// message makes; Answers is the call a tool message answers (-1 for
	// other roles).
	Calls   []int
	Answers int
	Error   string // a tool message's error, if the tool failed
}

// Arg is one argument of a tool call, in the order the call gave them.
type Arg struct {
	Name string
	// Value is the decoded JSON value: string, json.Number, bool, nil,
	// []any or map[string]any.
	Value any
}

// Result is what a tool returned to the agent.
type Result struct {
	Content string // the tool's output text ("" when it failed)
	Error   string // the tool's error message, if it failed
	Message int    // index of the tool message in Run.Messages
}

// Text is what the agent read: the output, followed by the error when the
// tool failed.
func (r *Result) Text() string {
	switch {
	case r.Error == "":
		return r.Content
	case r.Content == "":
		return r.Error
	}
	return r.Content + "\n" + r.Error
}

// Call is one tool call of the agent, paired with its result.
type Call struct {
	Index    int    // position among the run's calls, from 0
	Message  int    // index of the assistant message that made it
	Function string // the tool's name
	ID       string // the call id; "" when the log has none (Llama-3.3)
	Args     []Arg
	// Result is nil when the call was never answered: the run ended (the
	// agent ran out of turns) before the tool ran.
	Result *Result
}

// Arg returns the value of the named argument and whether it was given.
func (c *Call) Arg(name string) (any, bool) {
	for _, a := range c.Args {
		if a.Name == name {
			return a.Value, true
		}
	}
	return nil, false
}

// Run is one recorded AgentDojo run.
type Run struct {
	// Where the run came from: the archive (or folder) and the member
	// path inside it.
	Archive, Member string

	// Pipeline is the agent pipeline, taken from the member path (the
	// JSON's pipeline_name is "local" for Llama-3.3); PipelineName is
	// what the JSON says.
	Pipeline, PipelineName string
	Suite                  string
	UserTask               string // user_task_N, or injection_task_M for InjectionAsPrompt
	InjectionTask          string // injection_task_M for Attacked runs
	Attack                 string // the attack for Attacked runs, e.g. important_instructions
	Kind                   RunKind
	Injections             map[string]string // injection vector -> the exact injected text
	Messages               []Message
	Calls                  []Call
	// Error is set when the benchmark recorded an API or context-length
	// error: such runs are logged as utility false, security true.
	Error            string
	Utility          bool
	Security         bool // for an attacked run: the injection task succeeded
	BenchmarkVersion string
	Duration         float64

	// Goal is the injection task's goal text, from prompts-and-goals.json
	// (see Attach); "" when unknown.
	Goal string
	env  *Environment
}

// Episode names the run: pipeline/suite/user_task/injection_task/attack
// ("none" for the parts a run does not have).
func (r *Run) Episode() string {
	inj, att := r.InjectionTask, r.Attack
	if inj == "" {
		inj = "none"
	}
	if att == "" {
		att = "none"
	}
	return r.Pipeline + "/" + r.Suite + "/" + r.UserTask + "/" + inj + "/" + att
}

// Errored reports whether the benchmark recorded an error for the run.
func (r *Run) Errored() bool { return r.Error != "" }

// AttackSucceeded reports whether this is an attacked run whose injection
// task succeeded, counting a run that ended in an error as a failed
// attack (ErrorsAsFailed). See AttackSucceededBy for the benchmark's own
// convention.
func (r *Run) AttackSucceeded() bool { return r.AttackSucceededBy(ErrorsAsFailed) }

// AttackSucceededBy reports whether this is an attacked run whose
// injection task succeeded, counting a run that ended in an error as c
// says.
func (r *Run) AttackSucceededBy(c ErrorCounting) bool {
	if r.Kind != Attacked || !r.Security {
		return false
	}
	return c == ErrorsAsRecorded || r.Error == ""
}

// ErrorCounting says how an attacked run that ended in an error (an API
// or context-length error, Run.Error set) counts.
type ErrorCounting string

const (
	// ErrorsAsRecorded takes the run's security flag as the benchmark
	// recorded it. AgentDojo's benchmark code logs a run whose model
	// call failed as utility false, security true, and its attack
	// success rates average that flag: the attack counts as succeeded.
	// This reproduces AgentDojo's published "no defense" figures.
	ErrorsAsRecorded ErrorCounting = "agentdojo"
	// ErrorsAsFailed counts such a run as a failed attack: the run
	// stopped before the injection task could be checked, and nothing
	// it did after the error reached the world.
	ErrorsAsFailed ErrorCounting = "failed"
)

// ParseErrorCounting parses "agentdojo" or "failed".
func ParseErrorCounting(s string) (ErrorCounting, error) {
	switch c := ErrorCounting(s); c {
	case ErrorsAsRecorded, ErrorsAsFailed:
		return c, nil
	}
	return "", fmt.Errorf("agentdojo: unknown error counting %q (want agentdojo or failed)", s)
}

// Prompt is the user's prompt: the content of the first user message.
func (r *Run) Prompt() string {
	for i := range r.Messages {
		if r.Messages[i].Role == "user" {
			return r.Messages[i].Content
		}
	}
	return ""
}

// FinalAnswer is the agent's answer to the principal: the last message
// when it is an assistant message without tool calls.
func (r *Run) FinalAnswer() (string, bool) {
	if len(r.Messages) == 0 {
		return "", false
	}
	m := &r.Messages[len(r.Messages)-1]
	if m.Role != "assistant" || len(m.Calls) > 0 {
		return "", false
	}
	return m.Content, true
}

// ErrMalformed matches (errors.Is) every error about a run file whose
// content does not follow the AgentDojo run schema.
var ErrMalformed = errors.New("agentdojo: malformed run")

// maxRunSize bounds one run file; the largest real run is about 200 KiB.
const maxRunSize = 64 << 20

// wire types: the JSON as written. Pointers tell a missing key from null.
type wireRun struct {
	SuiteName        *string           `json:"suite_name"`
	PipelineName     *string           `json:"pipeline_name"`
	UserTaskID       *string           `json:"user_task_id"`
	InjectionTaskID  *string           `json:"injection_task_id"`
	AttackType       *string           `json:"attack_type"`
	Injections       map[string]string `json:"injections"`
	Messages         *[]wireMessage    `json:"messages"`
	Error            *string           `json:"error"`
	Utility          *bool             `json:"utility"`
	Security         *bool             `json:"security"`
	Duration         *float64          `json:"duration"`
	BenchmarkVersion *string           `json:"benchmark_version"`
}

type wireMessage struct {
	Role       *string         `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []wireCall      `json:"tool_calls"`
	ToolCallID *string         `json:"tool_call_id"`
	ToolCall   *wireCall       `json:"tool_call"`
	Error      *string         `json:"error"`
}

type wireCall struct {
	Function *string         `json:"function"`
	Args     json.RawMessage `json:"args"`
	ID       *string         `json:"id"`
}

type wirePart struct {
	Type    *string `json:"type"`
	Content *string `json:"content"`
	Text    *string `json:"text"`
}

// ParseRun parses one run file. It checks the schema strictly enough that
// every later step can rely on it: required keys present, a known kind
// (benign, attacked or injection-as-prompt), message roles known, every
// tool result paired with a call (by id, or by order when ids are null).
// Pipeline is set from pipeline_name; Open replaces it with the pipeline
// named by the archive path. Errors wrap ErrMalformed.
func ParseRun(data []byte) (*Run, error) {
	if len(data) > maxRunSize {
		return nil, fmt.Errorf("%w: %d bytes is more than the %d a run may have", ErrMalformed, len(data), maxRunSize)
	}
	var w wireRun
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the run object", ErrMalformed)
	}
	r := &Run{Injections: w.Injections}
	bad := func(format string, args ...any) (*Run, error) {
		return nil, fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
	}
	if w.SuiteName == nil || *w.SuiteName == "" {
		return bad("suite_name is missing")
	}
	r.Suite = *w.SuiteName
	if w.PipelineName != nil {
		r.PipelineName = *w.PipelineName
		r.Pipeline = r.PipelineName
	}
	if w.UserTaskID == nil || *w.UserTaskID == "" {
		return bad("user_task_id is missing")
	}
	r.UserTask = *w.UserTaskID
	if w.InjectionTaskID != nil {
		r.InjectionTask = *w.InjectionTaskID
	}
	if w.AttackType != nil {
		r.Attack = *w.AttackType
	}
	switch {
	case strings.HasPrefix(r.UserTask, "injection_task_"):
		if r.InjectionTask != "" || r.Attack != "" {
			return bad("user_task_id %q is an injection task but injection_task_id or attack_type is set", r.UserTask)
		}
		r.Kind = InjectionAsPrompt
	case strings.HasPrefix(r.UserTask, "user_task_"):
		switch {
		case r.InjectionTask == "" && r.Attack == "":
			r.Kind = Benign
		case r.InjectionTask != "" && r.Attack != "":
			if !strings.HasPrefix(r.InjectionTask, "injection_task_") {
				return bad("injection_task_id %q is not an injection task", r.InjectionTask)
			}
			r.Kind = Attacked
		default:
			return bad("injection_task_id and attack_type must both be set or both be null")
		}
	default:
		return bad("user_task_id %q is neither user_task_N nor injection_task_N", r.UserTask)
	}
	if r.Kind == Attacked && len(r.Injections) == 0 {
		return bad("attacked run without injections")
	}
	if r.Kind != Attacked && len(r.Injections) != 0 {
		return bad("%s run with injections", r.Kind)
	}
	if w.Utility == nil || w.Security == nil {
		return bad("utility or security is missing")
	}
	r.Utility, r.Security = *w.Utility, *w.Security
	if w.Error != nil {
		r.Error = *w.Error
	}
	if w.Duration != nil {
		r.Duration = *w.Duration
	}
	if w.BenchmarkVersion != nil {
		r.BenchmarkVersion = *w.BenchmarkVersion
	}
	if w.Messages == nil {
		return bad("messages is missing")
	}
	if err := r.parseMessages(*w.Messages); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return r, nil
}

func (r *Run) parseMessages(ms []wireMessage) error {
	r.Messages = make([]Message, 0, len(ms))
	var pending []int // calls of the latest assistant turn not yet answered
	users := 0
	for i := range ms {
		wm := &ms[i]
		if wm.Role == nil {
			return fmt.Errorf("messages[%d]: role is missing", i)
		}
		content, err := flattenContent(wm.Content)
		if err != nil {
			return fmt.Errorf("messages[%d].content: %w", i, err)
		}
		m := Message{Role: *wm.Role, Content: content, Answers: -1}
		switch m.Role {
		case "system":
		case "user":
			users++
		case "assistant":
			if len(wm.ToolCalls) > 0 {
				pending = pending[:0]
			}
			for j := range wm.ToolCalls {
				c, err := parseCall(&wm.ToolCalls[j])
				if err != nil {
					return fmt.Errorf("messages[%d].tool_calls[%d]: %w", i, j, err)
				}
				c.Index, c.Message = len(r.Calls), i
				m.Calls = append(m.Calls, c.Index)
				pending = append(pending, c.Index)
				r.Calls = append(r.Calls, c)
			}
		case "tool":
			ci, err := r.pair(wm, pending)
			if err != nil {
				return fmt.Errorf("messages[%d]: %w", i, err)
			}
			pending = slices.DeleteFunc(pending, func(x int) bool { return x == ci })
			res := &Result{Content: content, Message: i}
			if wm.Error != nil {
				res.Error = *wm.Error
				m.Error = res.Error
			}
			r.Calls[ci].Result = res
			m.Answers = ci
		default:
			return fmt.Errorf("messages[%d]: unknown role %q", i, m.Role)
		}
		r.Messages = append(r.Messages, m)
	}
	if users == 0 {
		return errors.New("no user message (the task)")
	}
	return nil
}

// pair finds the call a tool message answers: by id when the message has
// one, else the first unanswered call of the latest assistant turn. The
// copy of the call the message carries must name the same function.
func (r *Run) pair(wm *wireMessage, pending []int) (int, error) {
	ci := -1
	if wm.ToolCallID != nil && *wm.ToolCallID != "" {
		id := *wm.ToolCallID
		for _, p := range pending {
			if r.Calls[p].ID == id {
				ci = p
				break
			}
		}
		if ci < 0 {
			for k := range r.Calls {
				if r.Calls[k].ID == id && r.Calls[k].Result == nil {
					ci = k
					break
				}
			}
		}
		if ci < 0 {
			return 0, fmt.Errorf("tool result answers call id %q, which no unanswered call has", id)
		}
	} else {
		for _, p := range pending {
			if r.Calls[p].ID == "" {
				ci = p
				break
			}
		}
		if ci < 0 {
			return 0, errors.New("tool result without a call id and no unanswered call without an id before it")
		}
	}
	if wm.ToolCall != nil && wm.ToolCall.Function != nil && *wm.ToolCall.Function != r.Calls[ci].Function {
		return 0, fmt.Errorf("tool result for %q paired with call %d of %q", *wm.ToolCall.Function, ci, r.Calls[ci].Function)
	}
	return ci, nil
}

func parseCall(wc *wireCall) (Call, error) {
	var c Call
	if wc.Function == nil || *wc.Function == "" {
		return c, errors.New("function is missing")
	}
	c.Function = *wc.Function
	if wc.ID != nil {
		c.ID = *wc.ID
	}
	args, err := decodeArgs(wc.Args)
	if err != nil {
		return c, fmt.Errorf("args: %w", err)
	}
	c.Args = args
	return c, nil
}

// decodeArgs decodes a JSON object into its arguments in the order given.
func decodeArgs(raw json.RawMessage) ([]Arg, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want an object, got %s", describeJSON(tok))
	}
	var args []Arg
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, ok := kt.(string)
		if !ok {
			return nil, fmt.Errorf("want an argument name, got %s", describeJSON(kt))
		}
		for _, a := range args {
			if a.Name == name {
				return nil, fmt.Errorf("argument %q given twice", name)
			}
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("argument %q: %w", name, err)
		}
		args = append(args, Arg{Name: name, Value: v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return args, nil
}

func describeJSON(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		return strconv.Quote(t.String())
	case string:
		return "the string " + strconv.Quote(clip(t, 40))
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
}

// flattenContent turns a message's content into text: a string as is, null
// as "", and a list of {"type": "text", "content": ...} parts (Llama-3.3
// runs) joined with newlines.
func flattenContent(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case '[':
		var parts []wirePart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", err
		}
		var b strings.Builder
		for i, p := range parts {
			if p.Type == nil || *p.Type != "text" {
				t := "none"
				if p.Type != nil {
					t = strconv.Quote(*p.Type)
				}
				return "", fmt.Errorf("part %d: type %s is not text", i, t)
			}
			text := p.Content
			if text == nil {
				text = p.Text
			}
			if text == nil {
				return "", fmt.Errorf("part %d: text part without content", i)
			}
			if i > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(*text)
		}
		return b.String(), nil
	}
	return "", fmt.Errorf("want a string, null or a list of text parts, got %s", clip(string(raw), 20))
}

// Render turns an argument value into the string a field carries: strings
// as they are, numbers in canonical form (50.0 -> "50", 0.01 -> "0.01"),
// booleans as true/false, null as "", a list of scalars one item per line,
// and anything else as compact JSON with sorted keys.
func Render(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case json.Number:
		return canonicalNumber(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case []any:
		scalars := true
		for _, e := range x {
			switch e.(type) {
			case string, json.Number, bool, float64:
			default:
				scalars = false
			}
		}
		if scalars {
			parts := make([]string, len(x))
			for i, e := range x {
				parts[i] = Render(e)
			}
			return strings.Join(parts, "\n")
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func canonicalNumber(n json.Number) string {
	s := string(n)
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return strconv.FormatInt(i, 10)
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return s
	}
	if f == 0 {
		return "0"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8Start(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }
