package decide

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// MaxTraceLine bounds one line of a trace file (16 MiB).
const MaxTraceLine = 16 << 20

// TraceError locates a problem in a trace file.
type TraceError struct {
	File  string
	Line  int
	Field string
	Err   error
}

func (e *TraceError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s:%d: %s: %v", e.File, e.Line, e.Field, e.Err)
	}
	return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
}

func (e *TraceError) Unwrap() error { return e.Err }

// wireEvent is one trace line as written; pointers tell a missing key
// from an empty value.
type wireEvent struct {
	Ch      *string     `json:"ch"`
	Dir     *string     `json:"dir"`
	Obj     *string     `json:"obj"`
	Content *string     `json:"content"`
	Op      string      `json:"op"`
	Fields  []wireField `json:"fields"`
	Source  string      `json:"source"`
	Time    string      `json:"time"`
	Kind    string      `json:"kind"`
	Dest    *Dest       `json:"dest"`
	Opaque  bool        `json:"opaque"`
	Seq     uint64      `json:"seq"`
}

type wireField struct {
	Name  *string `json:"name"`
	Role  *string `json:"role"`
	Value *string `json:"value"`
}

// ReadTrace reads a trace: JSON lines, one event per line (see
// docs/trace-format.md). Blank lines and lines starting with '#' are
// skipped. Every problem is reported with the file name and line; the
// whole trace is rejected on the first one.
func ReadTrace(name string, r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxTraceLine)
	var out []Event
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] == '#' {
			continue
		}
		ev, field, err := parseTraceLine(b)
		if err != nil {
			return nil, &TraceError{File: name, Line: line, Field: field, Err: err}
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("line longer than %d bytes", MaxTraceLine)
		}
		return nil, &TraceError{File: name, Line: line + 1, Err: err}
	}
	return out, nil
}

// LoadTrace reads a trace file.
func LoadTrace(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(path, f)
}

func parseTraceLine(b []byte) (Event, string, error) {
	var w wireEvent
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Event{}, te.Field, fmt.Errorf("wrong type: want %s, got %s", te.Type, te.Value)
		}
		if strings.HasPrefix(err.Error(), "json: unknown field ") {
			return Event{}, "", fmt.Errorf("unknown key %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return Event{}, "", fmt.Errorf("not a JSON object: %v", err)
	}
	if dec.More() {
		return Event{}, "", errors.New("more than one JSON value on the line")
	}
	var ev Event
	var err error
	switch {
	case w.Ch == nil:
		return ev, "ch", errors.New("required key is missing")
	case w.Dir == nil:
		return ev, "dir", errors.New("required key is missing")
	case w.Obj == nil:
		return ev, "obj", errors.New("required key is missing")
	case w.Content == nil:
		return ev, "content", errors.New("required key is missing")
	}
	if ev.Ch, err = ParseChannel(*w.Ch); err != nil {
		return ev, "ch", stripPkg(err)
	}
	if ev.Dir, err = ParseDirection(*w.Dir); err != nil {
		return ev, "dir", stripPkg(err)
	}
	ev.Obj, ev.Content, ev.Op, ev.Source, ev.Dest, ev.Opaque, ev.Seq = *w.Obj, *w.Content, w.Op, w.Source, w.Dest, w.Opaque, w.Seq
	if w.Kind != "" {
		if ev.Kind, err = ParseKind(w.Kind); err != nil {
			return ev, "kind", stripPkg(err)
		}
	}
	if w.Time != "" {
		if ev.Time, err = time.Parse(time.RFC3339Nano, w.Time); err != nil {
			return ev, "time", errors.New("not an RFC 3339 time")
		}
	}
	if len(w.Fields) > 0 && ev.Dir == In {
		return ev, "fields", errors.New("incoming events have no fields")
	}
	for i, f := range w.Fields {
		loc := fmt.Sprintf("fields[%d]", i)
		if f.Name == nil || *f.Name == "" {
			return ev, loc + ".name", errors.New("required key is missing or empty")
		}
		if f.Value == nil {
			return ev, loc + ".value", errors.New("required key is missing")
		}
		fl := Field{Name: *f.Name, Value: *f.Value, Role: RoleContent}
		if f.Role != nil {
			if fl.Role, err = ParseRole(*f.Role); err != nil {
				return ev, loc + ".role", stripPkg(err)
			}
		}
		ev.Fields = append(ev.Fields, fl)
	}
	return ev, "", nil
}

func stripPkg(err error) error {
	return errors.New(strings.TrimPrefix(err.Error(), "decide: "))
}
