package decide

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		name, line, want string
	}{
		{"not json", `{"ch":`, "trace.jsonl:2: not a JSON object"},
		{"unknown key", `{"ch":"net","dir":"out","obj":"x","content":"","colour":1}`, `trace.jsonl:2: unknown key "colour"`},
		{"missing ch", `{"dir":"out","obj":"x","content":""}`, "trace.jsonl:2: ch: required key is missing"},
		{"missing content", `{"ch":"net","dir":"out","obj":"x"}`, "trace.jsonl:2: content: required key is missing"},
		{"bad channel", `{"ch":"disk","dir":"out","obj":"x","content":""}`, `trace.jsonl:2: ch: unknown channel "disk"`},
		{"bad direction", `{"ch":"net","dir":"up","obj":"x","content":""}`, `trace.jsonl:2: dir: unknown direction "up"`},
		{"wrong type", `{"ch":"net","dir":"out","obj":7,"content":""}`, "trace.jsonl:2: obj: wrong type"},
		{"bad role", `{"ch":"net","dir":"out","obj":"x","content":"","fields":[{"name":"to","role":"recipient","value":"a"}]}`, `trace.jsonl:2: fields[0].role: unknown role "recipient"`},
		{"field without name", `{"ch":"net","dir":"out","obj":"x","content":"","fields":[{"value":"a"}]}`, "trace.jsonl:2: fields[0].name: required key is missing or empty"},
		{"fields on incoming", `{"ch":"net","dir":"in","obj":"x","content":"","fields":[{"name":"a","value":"b"}]}`, "trace.jsonl:2: fields: incoming events have no fields"},
		{"bad kind", `{"ch":"net","dir":"out","obj":"x","content":"","kind":"later"}`, `trace.jsonl:2: kind: unknown effect kind "later"`},
		{"bad time", `{"ch":"net","dir":"out","obj":"x","content":"","time":"yesterday"}`, "trace.jsonl:2: time: not an RFC 3339 time"},
		{"two values", `{"ch":"net","dir":"out","obj":"x","content":""} {}`, "trace.jsonl:2: more than one JSON value"},
		{"bad address", `{"ch":"net","dir":"out","obj":"x","content":"","dest":{"addr":"300.1.1.1"}}`, "trace.jsonl:2:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "# comment\n" + tc.line + "\n"
			evs, err := ReadTrace("trace.jsonl", strings.NewReader(src))
			if err == nil {
				t.Fatalf("no error; got %d events", len(evs))
			}
			if evs != nil {
				t.Errorf("events returned with an error: nothing may be partly applied")
			}
			var te *TraceError
			if !errors.As(err, &te) || te.Line != 2 {
				t.Errorf("error %v is not located at line 2", err)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("error %q, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestReadTraceFixtures(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "traces", "*.jsonl"))
	if len(files) < 2 {
		t.Fatalf("fixtures missing: %v", files)
	}
	for _, f := range files {
		evs, err := LoadTrace(f)
		if err != nil {
			t.Fatal(err)
		}
		outgoing := 0
		for _, e := range evs {
			if e.Dir == Out {
				outgoing++
			}
		}
		if len(evs) == 0 || outgoing == 0 {
			t.Errorf("%s: %d events, %d outgoing", f, len(evs), outgoing)
		}
	}
}

func FuzzReadTrace(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "testdata", "traces", "*.jsonl"))
	for _, fn := range files {
		b, err := os.ReadFile(fn)
		if err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"ch":"net","dir":"out","obj":"x","content":"","fields":[{"name":"a","role":"target","value":"b"}],"dest":{"addr":"::1","port":5}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		evs, err := ReadTrace("fuzz", strings.NewReader(string(data)))
		if err != nil {
			var te *TraceError
			if !errors.As(err, &te) || te.Line < 1 {
				t.Fatalf("unlocated error %v", err)
			}
			return
		}
		for _, e := range evs {
			if e.Ch < ChanFile || e.Ch > ChanCtrl || (e.Dir != In && e.Dir != Out) {
				t.Fatalf("invalid event accepted: %+v", e)
			}
			for _, fl := range e.Fields {
				if fl.Role < RoleTarget || fl.Role > RoleContent || fl.Name == "" {
					t.Fatalf("invalid field accepted: %+v", fl)
				}
			}
		}
	})
}
