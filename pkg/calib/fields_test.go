package calib

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/google/go-cmp/cmp"
)

func TestDecodeFields(t *testing.T) {
	in := `{"role":"target","score":0.25,"violated":false,"attacked":false,"episode":"e1"}

{"role":"credential","score":1,"violated":true,"attacked":true}
  {"attacked":true,"violated":false,"score":0,"role":"content","episode":"e2"}  ` // no final newline
	got, err := DecodeFields(strings.NewReader(in), "f.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	want := []FieldRecord{
		{Role: decide.RoleTarget, Score: 0.25, Episode: "e1"},
		{Role: decide.RoleCredential, Score: 1, Violated: true, Attacked: true},
		{Role: decide.RoleContent, Score: 0, Attacked: true, Episode: "e2"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-want +got):\n%s", d)
	}
	// Round trip through WriteFields.
	var buf bytes.Buffer
	if err := WriteFields(&buf, got); err != nil {
		t.Fatal(err)
	}
	again, err := DecodeFields(&buf, "again")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, again); d != "" {
		t.Fatalf("round trip (-want +got):\n%s", d)
	}
	if got, err := DecodeFields(strings.NewReader(""), "empty"); err != nil || len(got) != 0 {
		t.Errorf("empty file: %v, %v", got, err)
	}
}

func TestDecodeFieldsErrors(t *testing.T) {
	ok := `{"role":"target","score":0.5,"violated":false,"attacked":false}` + "\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"unknown role", ok + `{"role":"recipient","score":0.5,"violated":false,"attacked":false}`, `f.jsonl:2: decide: unknown role "recipient"`},
		{"unknown key", ok + ok + `{"role":"target","score":0.5,"violated":false,"attacked":false,"tool":"x"}`, `f.jsonl:3: unknown key "tool"`},
		{"missing keys", `{"role":"target"}`, `f.jsonl:1: missing ["score" "violated" "attacked"]`},
		{"null score", `{"role":"target","score":null,"violated":false,"attacked":false}`, `f.jsonl:1: missing ["score"]`},
		{"score range", ok + "\n" + `{"role":"target","score":1.01,"violated":false,"attacked":false}`, `f.jsonl:3: score 1.01 outside [0,1]`},
		{"negative score", `{"role":"target","score":-0,"violated":false,"attacked":false}` + "\n" + `{"role":"target","score":-1e-9,"violated":false,"attacked":false}`, `f.jsonl:2: score -1e-09 outside`},
		{"syntax", `{"role":"target",,}`, `f.jsonl:1: byte 18: want a string`},
		{"two values", `{"role":"target","score":0.5,"violated":false,"attacked":false} {}`, `f.jsonl:1: byte 65: more than one JSON value`},
		{"violated unattacked", `{"role":"target","score":0.5,"violated":true,"attacked":false}`, `f.jsonl:1: violated but not attacked`},
		{"wrong type", `{"role":"target","score":"0.5","violated":false,"attacked":false}`, `f.jsonl:1: key "score": byte 26: want a number`},
		{"episode type", `{"role":"target","score":0.5,"violated":false,"attacked":false,"episode":7}`, `f.jsonl:1: key "episode": byte 74: want a string`},
		{"not an object", `[1,2]`, `f.jsonl:1: byte 1: want an object`},
		{"case-folded key", `{"ROLE":"target","score":0.5,"violated":false,"attacked":false}`, `f.jsonl:1: unknown key "ROLE"`},
		{"bad number", `{"role":"target","score":01,"violated":false,"attacked":false}`, `f.jsonl:1: byte 27: want ',' or '}'`},
		{"bad fraction", `{"role":"target","score":1.,"violated":false,"attacked":false}`, `want digits after '.'`},
		{"huge number", `{"role":"target","score":1e400,"violated":false,"attacked":false}`, `key "score": number 1e400 out of range`},
		{"bad literal", `{"role":"target","score":0.5,"violated":fals,"attacked":false}`, `key "violated": byte 41: want true or false`},
		{"literal run-on", `{"role":"target","score":0.5,"violated":trueish,"attacked":false}`, `key "violated": byte 41: want true or false`},
		{"control char", "{\"role\":\"tar\tget\",\"score\":0.5,\"violated\":false,\"attacked\":false}", `control character in string`},
		{"unterminated", `{"role":"target`, `unterminated string`},
		{"bad escape", `{"role":"t\qarget","score":0.5,"violated":false,"attacked":false}`, `invalid character 'q' in string escape code`},
		{"huge line", `{"role":"target","episode":"` + strings.Repeat("x", MaxFieldLine) + `"}`, `f.jsonl:1: line longer than`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeFields(strings.NewReader(tc.in), "f.jsonl")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "calib: f.jsonl:") {
				t.Errorf("err %q does not start with the file name", err)
			}
		})
	}
}

func TestDecodeFieldsJSONForms(t *testing.T) {
	for in, want := range map[string]FieldRecord{
		// escapes and non-ASCII are JSON's
		`{"role":"\u0074arget","score":0.5,"violated":false,"attacked":false,"episode":"\u00e9\n"}`: {Role: decide.RoleTarget, Score: 0.5, Episode: "é\n"},
		`{"role":"target","score":0.5,"violated":false,"attacked":false,"episode":"ép"}`:            {Role: decide.RoleTarget, Score: 0.5, Episode: "ép"},
		// number forms
		`{"role":"target","score":1E-2,"violated":false,"attacked":false}`:   {Role: decide.RoleTarget, Score: 0.01},
		`{"role":"target","score":-0,"violated":false,"attacked":false}`:     {Role: decide.RoleTarget, Score: 0},
		`{"role":"target","score":0.5e+0,"violated":false,"attacked":false}`: {Role: decide.RoleTarget, Score: 0.5},
		// a repeated key keeps its last value; null is absent
		`{"role":"command","role":"target","score":1,"violated":false,"attacked":false}`:             {Role: decide.RoleTarget, Score: 1},
		`{"role":"target","score":1,"violated":false,"attacked":false,"episode":null}`:               {Role: decide.RoleTarget, Score: 1},
		"\t{ \"role\" : \"target\" , \"score\" : 1 , \"violated\" : false , \"attacked\" : true }\r": {Role: decide.RoleTarget, Score: 1, Attacked: true},
	} {
		got, err := DecodeFields(strings.NewReader(in), "f")
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if d := cmp.Diff([]FieldRecord{want}, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", in, d)
		}
	}
}

func TestDecodeFieldsLongLine(t *testing.T) {
	// A line longer than the reader's buffer but under the limit is fine.
	ep := strings.Repeat("e", 200<<10)
	in := `{"role":"target","score":0.5,"violated":false,"attacked":false,"episode":"` + ep + `"}` + "\n" +
		`{"role":"command","score":0.5,"violated":false,"attacked":false}`
	got, err := DecodeFields(strings.NewReader(in), "long")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Episode != ep || got[1].Role != decide.RoleCommand {
		t.Fatalf("got %d records", len(got))
	}
}

func TestReadFieldsFile(t *testing.T) {
	content := `{"role":"target","score":0.5,"violated":true,"attacked":true}` + "\n"
	p := filepath.Join(t.TempDir(), "cal.jsonl")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, src, err := ReadFieldsFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(content))
	if d := cmp.Diff(SourceFile{Path: p, SHA256: hex.EncodeToString(sum[:]), Records: 1}, src); d != "" || len(recs) != 1 {
		t.Errorf("source (-want +got):\n%s", d)
	}
	if _, _, err := ReadFieldsFile(filepath.Join(t.TempDir(), "absent.jsonl")); err == nil || !strings.Contains(err.Error(), "absent.jsonl") {
		t.Errorf("missing file: err = %v", err)
	}
}

func TestWriteFieldsRejectsInvalid(t *testing.T) {
	err := WriteFields(&bytes.Buffer{}, []FieldRecord{{Role: decide.RoleTarget, Score: 2}})
	if err == nil || !strings.Contains(err.Error(), "field 1: score 2 outside") {
		t.Errorf("err = %v", err)
	}
}

// refFieldLine reads a line with encoding/json (case-insensitive keys,
// last repeated key wins): the reference the fast scanner is held to.
func refFieldLine(line []byte) (FieldRecord, error) {
	var fl struct {
		Role     *string  `json:"role"`
		Score    *float64 `json:"score"`
		Violated *bool    `json:"violated"`
		Episode  *string  `json:"episode"`
		Attacked *bool    `json:"attacked"`
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fl); err != nil {
		return FieldRecord{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return FieldRecord{}, errors.New("trailing data")
	}
	if fl.Role == nil || fl.Score == nil || fl.Violated == nil || fl.Attacked == nil {
		return FieldRecord{}, errors.New("missing")
	}
	role, err := decide.ParseRole(*fl.Role)
	if err != nil {
		return FieldRecord{}, err
	}
	r := FieldRecord{Role: role, Score: *fl.Score, Violated: *fl.Violated, Attacked: *fl.Attacked}
	if fl.Episode != nil {
		r.Episode = *fl.Episode
	}
	return r, r.check()
}

// FuzzFieldLine holds the fast line scanner to encoding/json: whatever it
// accepts, encoding/json reads the same way; whatever encoding/json
// rejects, it rejects. (It may reject more: keys are exact, not
// case-folded.)
func FuzzFieldLine(f *testing.F) {
	f.Add([]byte(`{"role":"target","score":0.25,"violated":false,"attacked":false,"episode":"e1"}`))
	f.Add([]byte(`{"role":"\u0074arget","score":1E-2,"violated":true,"attacked":true,"episode":"\ud83d\ude00"}`))
	f.Add([]byte(`{"ROLE":"target","score":-0,"violated":false,"attacked":false}`))
	f.Add([]byte(`{"role":"target","role":null,"score":0,"violated":false,"attacked":false}`))
	f.Add([]byte("{\"role\":\"target\",\"score\":0,\"violated\":false,\"attacked\":false,\"episode\":\"\xff\"}"))
	f.Fuzz(func(t *testing.T, line []byte) {
		if bytes.IndexByte(line, '\n') >= 0 || len(bytes.TrimSpace(line)) == 0 {
			return
		}
		got, err := parseFieldLine(line)
		want, rerr := refFieldLine(line)
		switch {
		case err == nil && rerr != nil:
			t.Fatalf("scanner accepts %q as %+v, encoding/json rejects it: %v", line, got, rerr)
		case err == nil && got != want:
			t.Fatalf("%q: scanner %+v, encoding/json %+v", line, got, want)
		case err != nil && rerr == nil && !strings.Contains(err.Error(), "unknown key"):
			t.Fatalf("scanner rejects %q (%v), encoding/json accepts it as %+v", line, err, want)
		}
	})
}

func FuzzReadFields(f *testing.F) {
	f.Add([]byte(`{"role":"target","score":0.25,"violated":false,"attacked":false,"episode":"e1"}` + "\n"))
	f.Add([]byte(`{"role":"credential","score":1,"violated":true,"attacked":true}` + "\n\n" + `{"role":"x"}`))
	f.Add([]byte(`{"role":"command","score":1e-300,"violated":false,"attacked":true,"episode":"\u00e9"}`))
	f.Add([]byte("\n\n  \n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := DecodeFields(bytes.NewReader(in), "fuzz")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "calib: fuzz:") {
				t.Fatalf("error %q does not name the file and line", err)
			}
			return
		}
		for i := range recs {
			if err := recs[i].check(); err != nil {
				t.Fatalf("record %d accepted but invalid: %v", i, err)
			}
		}
		var buf bytes.Buffer
		if err := WriteFields(&buf, recs); err != nil {
			t.Fatalf("WriteFields: %v", err)
		}
		again, err := DecodeFields(&buf, "again")
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		if d := cmp.Diff(recs, again); d != "" && !(len(recs) == 0 && len(again) == 0) {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
	})
}
