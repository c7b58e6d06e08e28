package ctrl

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzDecode checks that Decode never panics, that every error it
// returns wraps one of the sentinels, and that whatever it accepts
// encodes to a line that decodes to the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range allMessages() {
		line, err := Encode(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(line[:len(line)-1])
	}
	for _, s := range []string{
		`{"type":"hello","version":1,"version":1}`,
		`{"type":"task","id":"t","text":"\ud800","argv":["a"]}`,
		`{"type":"output","stream":"stdout","data":"aGVs\nbG8="}`,
		`{"type":"result","status":1e2,"text":""}`,
		` {"type" : "shutdown"} `,
		`{"type":"shutdown"}` + "\r",
		`{"type":"env","vars":["A=1","B==","C=\u00e9\n"]}`,
		`{"type":"env","vars":["A=1","A=1"]}`,
		`{"type":"env","vars":["a_9=x","_=y"],"vars":["Z=1"]}`,
		`{"type":"env","vars":[["A=1"]]}`,
	} {
		f.Add([]byte(s))
	}
	sentinels := []error{ErrLineTooLong, ErrSyntax, ErrUnknownType, ErrUnknownKey, ErrMissingKey, ErrInvalid}
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := Decode(line)
		if err != nil {
			known := false
			for _, s := range sentinels {
				known = known || errors.Is(err, s)
			}
			if !known || !strings.HasPrefix(err.Error(), "ctrl: ") {
				t.Fatalf("Decode(%q): error %v wraps no sentinel", line, err)
			}
			return
		}
		enc, err := Encode(m)
		if err != nil {
			t.Fatalf("Decode(%q) accepted %#v but Encode refuses it: %v", line, m, err)
		}
		if bytes.Count(enc, []byte("\n")) != 1 {
			t.Fatalf("Encode(%#v) = %q: not one line", m, enc)
		}
		m2, err := Decode(enc[:len(enc)-1])
		if err != nil {
			t.Fatalf("re-decode of %q: %v", enc, err)
		}
		if diff := cmp.Diff(m, m2); diff != "" {
			t.Fatalf("round trip of %q (-first +second):\n%s", line, diff)
		}
	})
}
