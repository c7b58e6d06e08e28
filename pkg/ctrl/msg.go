package ctrl

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Version is the protocol version this package speaks; the guest announces
// it in its hello. Version 2 added the env message.
const Version = 2

// MinVersion is the oldest guest version a host still serves: a version 1
// guest runs tasks without an environment (EnvVersion).
const MinVersion = 1

// EnvVersion is the first version whose guests accept an env message.
const EnvVersion = 2

// Limits of the wire format.
const (
	// MaxLine is the longest line (without its "\n") either side sends or
	// accepts.
	MaxLine = 1 << 20
	// MaxChunk is the most data one output message carries.
	MaxChunk = 32 << 10
	// MaxArgs is the most entries a task's argv has.
	MaxArgs = 4096
	// MaxID is the longest task id.
	MaxID = 128
	// MaxEnv is the most variables one env message carries.
	MaxEnv = 4096
)

// Errors. Decode errors wrap one of these, so errors.Is tells them apart.
var (
	ErrLineTooLong = errors.New("ctrl: line too long")
	ErrSyntax      = errors.New("ctrl: malformed message")
	ErrUnknownType = errors.New("ctrl: unknown message type")
	ErrUnknownKey  = errors.New("ctrl: unknown key")
	ErrMissingKey  = errors.New("ctrl: missing key")
	ErrInvalid     = errors.New("ctrl: invalid value")
	ErrVersion     = errors.New("ctrl: unsupported protocol version")
	ErrUnexpected  = errors.New("ctrl: unexpected message")
)

// Type names a message kind: the "type" key.
type Type string

// The message types.
const (
	TypeHello    Type = "hello"    // guest -> host
	TypeEnv      Type = "env"      // host -> guest, before the task
	TypeTask     Type = "task"     // host -> guest
	TypeNotice   Type = "notice"   // host -> guest
	TypeShutdown Type = "shutdown" // host -> guest
	TypeStarted  Type = "started"  // guest -> host
	TypeOutput   Type = "output"   // guest -> host
	TypeResult   Type = "result"   // guest -> host
)

// Message is one of *Hello, *Env, *Task, *Notice, *Shutdown, *Started, *Output
// and *Result.
type Message interface {
	// Type is the message's "type" key.
	Type() Type
	// Validate reports a value out of range, wrapping ErrInvalid.
	Validate() error
}

// Hello is the guest's first message.
type Hello struct {
	Version int `json:"version"`
}

// Env is the agent's own environment (carbd run --env, --env-file): each
// entry NAME=VALUE. The guest adds it to the agent's environment only: it
// never goes into an argv, a log or the kernel command line. It comes
// before the task, at most once, and only to guests of EnvVersion or
// later. Its values are credentials: errors about them never quote them.
type Env struct {
	Vars []string `json:"vars"`
}

// Task is the one task of a session: Text is the principal's task (the
// trusted values T_0) and Argv the agent command the guest runs.
type Task struct {
	ID   string   `json:"id"`
	Text string   `json:"text"`
	Argv []string `json:"argv"`
}

// Notice is text for the agent: which effects carbd withheld and how to
// go on (see AbortNotice).
type Notice struct {
	Text string `json:"text"`
}

// Shutdown asks the guest to end: after the result it powers off; before
// the result it stops the agent first.
type Shutdown struct{}

// Started reports the agent's process id in the guest.
type Started struct {
	PID int `json:"pid"`
}

// Stream names one of the agent's output streams.
type Stream string

// The output streams.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Output is a chunk of the agent's output, at most MaxChunk bytes.
type Output struct {
	Stream Stream `json:"stream"`
	Data   []byte `json:"data"`
}

// Result ends the task: Status is the exit status (0-255, 128+N for
// signal N, -1 when the agent could not start) and Text the agent's
// answer to the principal.
type Result struct {
	Status int    `json:"status"`
	Text   string `json:"text"`
}

func (*Hello) Type() Type    { return TypeHello }
func (*Env) Type() Type      { return TypeEnv }
func (*Task) Type() Type     { return TypeTask }
func (*Notice) Type() Type   { return TypeNotice }
func (*Shutdown) Type() Type { return TypeShutdown }
func (*Started) Type() Type  { return TypeStarted }
func (*Output) Type() Type   { return TypeOutput }
func (*Result) Type() Type   { return TypeResult }

func invalid(t Type, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, t, fmt.Sprintf(format, a...))
}

// Validate checks that the version is positive.
func (m *Hello) Validate() error {
	if m.Version < 1 {
		return invalid(TypeHello, "version %d", m.Version)
	}
	return nil
}

// Validate checks that there are 1 to MaxEnv entries, each NAME=VALUE
// with NAME a portable variable name (a letter or _, then letters, digits
// and _), no name twice, and no NUL byte. Its errors name the entry by
// its index, never by its content.
func (m *Env) Validate() error {
	if len(m.Vars) == 0 || len(m.Vars) > MaxEnv {
		return invalid(TypeEnv, "%d variables (want 1 to %d)", len(m.Vars), MaxEnv)
	}
	seen := make(map[string]bool, len(m.Vars))
	for i, v := range m.Vars {
		name, value, ok := strings.Cut(v, "=")
		if !ok || !validEnvName(name) {
			return invalid(TypeEnv, "vars[%d] is not NAME=VALUE with a name of letters, digits and _ not starting with a digit", i)
		}
		if seen[name] {
			return invalid(TypeEnv, "vars[%d] repeats an earlier name", i)
		}
		seen[name] = true
		if strings.IndexByte(value, 0) >= 0 {
			return invalid(TypeEnv, "vars[%d] holds a NUL byte", i)
		}
	}
	return nil
}

// validEnvName reports whether s is a portable environment variable name.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Validate checks the id (1 to MaxID bytes of letters, digits and
// "-_.:"), that argv has 1 to MaxArgs entries with a non-empty first one,
// and that neither argv nor the text holds a NUL byte (they become exec
// arguments and an environment variable).
func (m *Task) Validate() error {
	if m.ID == "" || len(m.ID) > MaxID {
		return invalid(TypeTask, "id length %d (want 1 to %d)", len(m.ID), MaxID)
	}
	for _, r := range m.ID {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:", r)) {
			return invalid(TypeTask, "id %q has character %q (want letters, digits, - _ . :)", m.ID, r)
		}
	}
	if strings.IndexByte(m.Text, 0) >= 0 {
		return invalid(TypeTask, "text holds a NUL byte")
	}
	if len(m.Argv) == 0 || len(m.Argv) > MaxArgs {
		return invalid(TypeTask, "argv has %d entries (want 1 to %d)", len(m.Argv), MaxArgs)
	}
	if m.Argv[0] == "" {
		return invalid(TypeTask, "argv[0] is empty")
	}
	for i, a := range m.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return invalid(TypeTask, "argv[%d] holds a NUL byte", i)
		}
	}
	return nil
}

// Validate checks that the text is not empty.
func (m *Notice) Validate() error {
	if m.Text == "" {
		return invalid(TypeNotice, "empty text")
	}
	return nil
}

// Validate never fails: a shutdown has no values.
func (*Shutdown) Validate() error { return nil }

// Validate checks that the pid is positive.
func (m *Started) Validate() error {
	if m.PID < 1 {
		return invalid(TypeStarted, "pid %d", m.PID)
	}
	return nil
}

// Validate checks the stream name and that the chunk holds 1 to MaxChunk
// bytes.
func (m *Output) Validate() error {
	if m.Stream != Stdout && m.Stream != Stderr {
		return invalid(TypeOutput, "stream %q (want stdout or stderr)", m.Stream)
	}
	if len(m.Data) == 0 || len(m.Data) > MaxChunk {
		return invalid(TypeOutput, "data of %d bytes (want 1 to %d)", len(m.Data), MaxChunk)
	}
	return nil
}

// Validate checks that the status is in -1..255.
func (m *Result) Validate() error {
	if m.Status < -1 || m.Status > 255 {
		return invalid(TypeResult, "status %d (want -1 to 255)", m.Status)
	}
	return nil
}

// keys lists the keys each type has besides "type"; all are required.
var keys = map[Type][]string{
	TypeHello:    {"version"},
	TypeEnv:      {"vars"},
	TypeTask:     {"id", "text", "argv"},
	TypeNotice:   {"text"},
	TypeShutdown: {},
	TypeStarted:  {"pid"},
	TypeOutput:   {"stream", "data"},
	TypeResult:   {"status", "text"},
}

func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeEnv:
		return &Env{}
	case TypeTask:
		return &Task{}
	case TypeNotice:
		return &Notice{}
	case TypeShutdown:
		return &Shutdown{}
	case TypeStarted:
		return &Started{}
	case TypeOutput:
		return &Output{}
	case TypeResult:
		return &Result{}
	}
	return nil
}

// Encode returns m as one line, with its "\n". It validates m first and
// refuses a line over MaxLine.
func Encode(m Message) ([]byte, error) {
	if m == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalid)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	var body []byte
	var err error
	if _, ok := m.(*Shutdown); ok {
		body = []byte("{}")
	} else {
		body, err = json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("ctrl: encode %s: %w", m.Type(), err)
		}
	}
	// body is a JSON object; put the type first.
	line := make([]byte, 0, len(body)+len(m.Type())+12)
	line = append(line, `{"type":"`...)
	line = append(line, m.Type()...)
	line = append(line, '"')
	if len(body) > 2 {
		line = append(line, ',')
	}
	line = append(line, body[1:]...)
	if len(line) > MaxLine {
		return nil, fmt.Errorf("%w: %s message of %d bytes (max %d)", ErrLineTooLong, m.Type(), len(line), MaxLine)
	}
	return append(line, '\n'), nil
}

// Decode parses one line (without its "\n") strictly: see the package
// documentation. It does not know the line number; Conn.Recv adds it.
//
// It reads the line once, as a stream of JSON tokens (keys in order, so a
// duplicate is seen), and converts each value to its field's type.
func Decode(line []byte) (Message, error) {
	if len(line) > MaxLine {
		return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrLineTooLong, len(line), MaxLine)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%w: empty line", ErrSyntax)
		}
		return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", ErrSyntax)
	}
	fields := make(map[string]any, 4)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("%w: key is not a string", ErrSyntax)
		}
		val, err := readValue(dec, key, 0)
		if err != nil {
			return nil, err
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("%w: duplicate key %q", ErrSyntax, key)
		}
		fields[key] = val
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("%w: %v", ErrSyntax, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the object", ErrSyntax)
	}

	rawType, ok := fields["type"]
	if !ok {
		return nil, fmt.Errorf("%w: \"type\"", ErrMissingKey)
	}
	ts, ok := rawType.(string)
	if !ok {
		return nil, fmt.Errorf("%w: \"type\" is not a string", ErrInvalid)
	}
	t := Type(ts)
	want, ok := keys[t]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, t)
	}
	for k := range fields {
		if k != "type" && !contains(want, k) {
			return nil, fmt.Errorf("%w %q in %s message", ErrUnknownKey, k, t)
		}
	}
	for _, k := range want {
		if _, ok := fields[k]; !ok {
			return nil, fmt.Errorf("%w %q in %s message", ErrMissingKey, k, t)
		}
	}
	m := newMessage(t)
	for _, k := range want {
		if err := setField(m, k, fields[k]); err != nil {
			return nil, err
		}
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// readValue reads one value: a string, a json.Number, a bool, or (at the
// top level only) an array of those as []any. null and objects are
// refused: no message has them.
func readValue(dec *json.Decoder, key string, depth int) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: key %q: %v", ErrSyntax, key, err)
	}
	switch t := tok.(type) {
	case string, json.Number, bool:
		return t, nil
	case nil:
		return nil, fmt.Errorf("%w: key %q is null", ErrInvalid, key)
	case json.Delim:
		if t != '[' || depth > 0 {
			return nil, fmt.Errorf("%w: key %q holds a nested %s", ErrInvalid, key, map[bool]string{true: "array", false: "object"}[t == '['])
		}
		arr := []any{}
		for dec.More() {
			v, err := readValue(dec, key, depth+1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		if _, err := dec.Token(); err != nil { // the closing bracket
			return nil, fmt.Errorf("%w: key %q: %v", ErrSyntax, key, err)
		}
		return arr, nil
	}
	return nil, fmt.Errorf("%w: key %q", ErrSyntax, key)
}

// setField converts one key's value to its field's type; the keys were
// checked against the type's list, so each case is exact.
func setField(m Message, key string, v any) error {
	bad := func(want string) error {
		return fmt.Errorf("%w: %s: key %q: want %s", ErrInvalid, m.Type(), key, want)
	}
	str := func(dst *string) error {
		s, ok := v.(string)
		if !ok {
			return bad("a string")
		}
		*dst = s
		return nil
	}
	strs := func(dst *[]string) error {
		arr, ok := v.([]any)
		if !ok {
			return bad("an array of strings")
		}
		*dst = make([]string, len(arr))
		for i, a := range arr {
			s, ok := a.(string)
			if !ok {
				return bad("an array of strings")
			}
			(*dst)[i] = s
		}
		return nil
	}
	integer := func(dst *int) error {
		n, ok := v.(json.Number)
		if !ok {
			return bad("an integer")
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || int64(int(i)) != i {
			return bad("an integer")
		}
		*dst = int(i)
		return nil
	}
	switch m := m.(type) {
	case *Hello:
		return integer(&m.Version)
	case *Env:
		return strs(&m.Vars)
	case *Task:
		switch key {
		case "id":
			return str(&m.ID)
		case "text":
			return str(&m.Text)
		case "argv":
			return strs(&m.Argv)
		}
	case *Notice:
		return str(&m.Text)
	case *Started:
		return integer(&m.PID)
	case *Output:
		switch key {
		case "stream":
			return str((*string)(&m.Stream))
		case "data":
			s, ok := v.(string)
			if !ok {
				return bad("a base64 string")
			}
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return bad("a base64 string")
			}
			m.Data = b
			return nil
		}
	case *Result:
		switch key {
		case "status":
			return integer(&m.Status)
		case "text":
			return str(&m.Text)
		}
	}
	return fmt.Errorf("%w %q in %s message", ErrUnknownKey, key, m.Type())
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// AbortNotice returns the notice carbd sends when it withholds effects
// (Kairos §III-D): it names each withheld effect, affirms that the rest of
// the task continues, tells the agent to proceed, and allows re-issuing an
// effect only when the task explicitly requires it. withheld holds one
// short description per effect (e.g. "POST https://x.example/upload").
func AbortNotice(withheld []string) *Notice {
	var b strings.Builder
	b.WriteString("carbd withheld the following effects; they did not take place:\n")
	for _, w := range withheld {
		b.WriteString("  - ")
		b.WriteString(strings.ReplaceAll(w, "\n", " "))
		b.WriteByte('\n')
	}
	b.WriteString("The rest of the task continues: proceed with it. ")
	b.WriteString("Re-issue one of these effects only if the task explicitly requires it.")
	return &Notice{Text: b.String()}
}
