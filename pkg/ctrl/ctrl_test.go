package ctrl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func allMessages() []Message {
	return []Message{
		&Hello{Version: 1},
		&Hello{Version: 2},
		&Env{Vars: []string{"OPENAI_API_KEY=sk-test-0123456789abcdef", "EMPTY=", "_X1=a=b c\n\"q\""}},
		&Task{ID: "t-1:a.b_c", Text: "fetch http://10.0.0.1/ and save it\nthen stop", Argv: []string{"sh", "-c", "echo hi > /work/x"}},
		&Task{ID: "x", Text: "", Argv: []string{"/bin/true"}},
		&Notice{Text: "carbd withheld POST http://evil.example/"},
		&Shutdown{},
		&Started{PID: 42},
		&Output{Stream: Stdout, Data: []byte("hello\n")},
		&Output{Stream: Stderr, Data: []byte{0, 0xff, 0xfe, '\n'}},
		&Result{Status: 0, Text: ""},
		&Result{Status: -1, Text: "exec: not found"},
		&Result{Status: 255, Text: "ünïcode ✓"},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, m := range allMessages() {
		line, err := Encode(m)
		if err != nil {
			t.Fatalf("encode %#v: %v", m, err)
		}
		if !bytes.HasSuffix(line, []byte("\n")) || bytes.Count(line, []byte("\n")) != 1 {
			t.Fatalf("encode %#v: %q is not one line", m, line)
		}
		if !bytes.HasPrefix(line, []byte(`{"type":"`+string(m.Type())+`"`)) {
			t.Errorf("encode %#v: %q does not start with its type", m, line)
		}
		got, err := Decode(line[:len(line)-1])
		if err != nil {
			t.Fatalf("decode %q: %v", line, err)
		}
		if diff := cmp.Diff(m, got); diff != "" {
			t.Errorf("round trip of %q (-want +got):\n%s", line, diff)
		}
	}
}

func TestEncodeWireShapes(t *testing.T) {
	// The exact lines of the package documentation.
	for _, tc := range []struct {
		m    Message
		want string
	}{
		{&Hello{Version: 2}, `{"type":"hello","version":2}`},
		{&Env{Vars: []string{"API_KEY=..."}}, `{"type":"env","vars":["API_KEY=..."]}`},
		{&Task{ID: "t1", Text: "...", Argv: []string{"sh", "-c", "..."}}, `{"type":"task","id":"t1","text":"...","argv":["sh","-c","..."]}`},
		{&Started{PID: 42}, `{"type":"started","pid":42}`},
		{&Output{Stream: Stdout, Data: []byte("hello\n")}, `{"type":"output","stream":"stdout","data":"aGVsbG8K"}`},
		{&Notice{Text: "..."}, `{"type":"notice","text":"..."}`},
		{&Result{Status: 0, Text: "..."}, `{"type":"result","status":0,"text":"..."}`},
		{&Shutdown{}, `{"type":"shutdown"}`},
	} {
		got, err := Encode(tc.m)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want+"\n" {
			t.Errorf("Encode(%#v) = %q, want %q", tc.m, got, tc.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	big := strings.Repeat("a", MaxChunk+1)
	for _, tc := range []struct {
		line string
		want error
	}{
		{``, ErrSyntax},
		{`   `, ErrSyntax},
		{`[]`, ErrSyntax},
		{`"hello"`, ErrSyntax},
		{`{"type":"hello","version":1`, ErrSyntax},
		{`{"type":"hello","version":1}{}`, ErrSyntax},
		{`{"type":"hello","version":1} x`, ErrSyntax},
		{`{"type":"hello","type":"hello","version":1}`, ErrSyntax},
		{`{"version":1}`, ErrMissingKey},
		{`{"type":1}`, ErrInvalid},
		{`{"type":null}`, ErrInvalid},
		{`{"type":"helo","version":1}`, ErrUnknownType},
		{`{"type":"Hello","version":1}`, ErrUnknownType},
		{`{"type":"hello","version":1,"extra":0}`, ErrUnknownKey},
		{`{"type":"hello","Version":1}`, ErrUnknownKey},
		{`{"type":"hello"}`, ErrMissingKey},
		{`{"type":"hello","version":0}`, ErrInvalid},
		{`{"type":"hello","version":1.5}`, ErrInvalid},
		{`{"type":"hello","version":"1"}`, ErrInvalid},
		{`{"type":"hello","version":null}`, ErrInvalid},
		{`{"type":"hello","version":99999999999999999999}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x"}`, ErrMissingKey},
		{`{"type":"task","id":"t","text":"x","argv":[]}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x","argv":[""]}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x","argv":["a",1]}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x","argv":"sh"}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x\u0000","argv":["sh"]}`, ErrInvalid},
		{`{"type":"task","id":"t","text":"x","argv":["sh","a\u0000"]}`, ErrInvalid},
		{`{"type":"task","id":"","text":"x","argv":["sh"]}`, ErrInvalid},
		{`{"type":"task","id":"a b","text":"x","argv":["sh"]}`, ErrInvalid},
		{`{"type":"task","id":"../x","text":"x","argv":["sh"]}`, ErrInvalid},
		{`{"type":"notice","text":""}`, ErrInvalid},
		{`{"type":"shutdown","now":true}`, ErrUnknownKey},
		{`{"type":"started","pid":0}`, ErrInvalid},
		{`{"type":"started","pid":-3}`, ErrInvalid},
		{`{"type":"output","stream":"stdin","data":"aGk="}`, ErrInvalid},
		{`{"type":"output","stream":"stdout","data":""}`, ErrInvalid},
		{`{"type":"output","stream":"stdout","data":"!!!"}`, ErrInvalid},
		{`{"type":"output","stream":"stdout","data":"` + big + `"}`, ErrInvalid},
		{`{"type":"result","status":256,"text":""}`, ErrInvalid},
		{`{"type":"result","status":-2,"text":""}`, ErrInvalid},
		{`{"type":"result","status":0}`, ErrMissingKey},
		{`{"type":"env"}`, ErrMissingKey},
		{`{"type":"env","vars":[]}`, ErrInvalid},
		{`{"type":"env","vars":"A=1"}`, ErrInvalid},
		{`{"type":"env","vars":["A=1",2]}`, ErrInvalid},
		{`{"type":"env","vars":["A"]}`, ErrInvalid},
		{`{"type":"env","vars":["=1"]}`, ErrInvalid},
		{`{"type":"env","vars":["1A=1"]}`, ErrInvalid},
		{`{"type":"env","vars":["A-B=1"]}`, ErrInvalid},
		{`{"type":"env","vars":["A=1","A=2"]}`, ErrInvalid},
		{`{"type":"env","vars":["A=x\u0000"]}`, ErrInvalid},
		{`{"type":"env","vars":[null]}`, ErrInvalid},
		{`{"type":"env","vars":["A=1"],"argv":["sh"]}`, ErrUnknownKey},
	} {
		_, err := Decode([]byte(tc.line))
		if !errors.Is(err, tc.want) {
			t.Errorf("Decode(%.80q) = %v, want %v", tc.line, err, tc.want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "ctrl: ") {
			t.Errorf("Decode(%.80q): error %q lacks the package prefix", tc.line, err)
		}
	}
}

func TestEncodeRejectsInvalid(t *testing.T) {
	for _, m := range []Message{
		nil,
		&Hello{},
		&Task{ID: "t", Argv: nil},
		&Task{ID: "t", Argv: []string{""}},
		&Notice{},
		&Started{},
		&Output{Stream: "x", Data: []byte("a")},
		&Output{Stream: Stdout},
		&Output{Stream: Stdout, Data: make([]byte, MaxChunk+1)},
		&Result{Status: 300},
	} {
		if _, err := Encode(m); !errors.Is(err, ErrInvalid) {
			t.Errorf("Encode(%#v) = %v, want ErrInvalid", m, err)
		}
	}
	// A valid message whose line is over MaxLine.
	if _, err := Encode(&Task{ID: "t", Text: strings.Repeat("x", MaxLine), Argv: []string{"sh"}}); !errors.Is(err, ErrLineTooLong) {
		t.Errorf("Encode(huge task) = %v, want ErrLineTooLong", err)
	}
}

// rw joins a reader and a writer.
type rw struct {
	io.Reader
	io.Writer
}

func TestConnLineNumbersAndRecovery(t *testing.T) {
	in := strings.Join([]string{
		`{"type":"hello","version":1}`,
		`{"type":"bogus"}`,
		strings.Repeat("x", MaxLine+10),
		`{"type":"started","pid":7}`,
		`{"type":"started","pid":7,"pid":8}`,
		`{"type":"result","status":3,"text":"done"}`,
		`{"type":"shutdown"`, // no newline: the stream ends inside the line
	}, "\n")
	c := NewConn(rw{strings.NewReader(in), io.Discard})
	type step struct {
		msg  Message
		line int
		err  error
	}
	want := []step{
		{msg: &Hello{Version: 1}},
		{line: 2, err: ErrUnknownType},
		{line: 3, err: ErrLineTooLong},
		{msg: &Started{PID: 7}},
		{line: 5, err: ErrSyntax},
		{msg: &Result{Status: 3, Text: "done"}},
		{line: 7, err: io.ErrUnexpectedEOF},
	}
	for i, w := range want {
		m, err := c.Recv()
		if w.err == nil {
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if diff := cmp.Diff(w.msg, m); diff != "" {
				t.Fatalf("step %d (-want +got):\n%s", i, diff)
			}
			continue
		}
		var le *LineError
		if !errors.As(err, &le) || le.Line != w.line || !errors.Is(err, w.err) {
			t.Fatalf("step %d: error %v, want %v on line %d", i, err, w.err, w.line)
		}
		if want := fmt.Sprintf("ctrl: line %d: ", w.line); !strings.HasPrefix(err.Error(), want) {
			t.Errorf("step %d: %q does not start with %q", i, err, want)
		}
	}
	if _, err := c.Recv(); err != io.EOF {
		t.Fatalf("after the last line: %v, want io.EOF", err)
	}
}

func TestConnLongestLine(t *testing.T) {
	// A line of exactly MaxLine bytes is accepted.
	prefix, suffix := `{"type":"notice","text":"`, `"}`
	text := strings.Repeat("n", MaxLine-len(prefix)-len(suffix))
	var buf bytes.Buffer
	c := NewConn(&buf)
	if err := c.Send(&Notice{Text: text}); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != MaxLine+1 {
		t.Fatalf("line is %d bytes, want %d", buf.Len(), MaxLine+1)
	}
	m, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if m.(*Notice).Text != text {
		t.Fatal("text changed")
	}
	if err := c.Send(&Notice{Text: text + "n"}); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("one byte more: %v, want ErrLineTooLong", err)
	}
}

func TestConnConcurrentSession(t *testing.T) {
	// A whole session over a synchronous pipe, each side with a reader and
	// a writer goroutine, as the host and the guest run it.
	hostEnd, guestEnd := net.Pipe()
	host, guest := NewConn(hostEnd), NewConn(guestEnd)
	defer host.Close()
	defer guest.Close()

	const chunks = 200
	var wg sync.WaitGroup
	guestErr := make(chan error, 1)
	wg.Add(1)
	go func() { // the guest
		defer wg.Done()
		guestErr <- func() error {
			if err := guest.Send(&Hello{Version: Version}); err != nil {
				return err
			}
			m, err := guest.Recv()
			if err != nil {
				return err
			}
			task, ok := m.(*Task)
			if !ok {
				return fmt.Errorf("got %T, want task", m)
			}
			notices := make(chan string, 1)
			go func() { // the guest's reader while it streams
				m, err := guest.Recv()
				if err != nil {
					notices <- err.Error()
					return
				}
				notices <- m.(*Notice).Text
			}()
			if err := guest.Send(&Started{PID: 100}); err != nil {
				return err
			}
			for i := 0; i < chunks; i++ {
				if err := guest.Send(&Output{Stream: Stdout, Data: []byte(fmt.Sprintf("%s %d\n", task.ID, i))}); err != nil {
					return err
				}
			}
			return guest.Send(&Result{Status: 0, Text: <-notices})
		}()
	}()

	if h, err := host.RecvHello(); err != nil || h.Version != Version {
		t.Fatalf("hello: %v %v", h, err)
	}
	if err := host.Send(&Task{ID: "t7", Text: "task", Argv: []string{"agent"}}); err != nil {
		t.Fatal(err)
	}
	sendErr := make(chan error, 1)
	go func() { sendErr <- host.Send(&Notice{Text: "withheld X"}) }() // while the guest streams
	var out bytes.Buffer
	var res *Result
	for res == nil {
		m, err := host.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *Started:
		case *Output:
			out.Write(m.Data)
		case *Result:
			res = m
		default:
			t.Fatalf("unexpected %T", m)
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := <-guestErr; err != nil {
		t.Fatal(err)
	}
	if res.Text != "withheld X" {
		t.Errorf("result text %q: the notice did not reach the guest", res.Text)
	}
	if n := strings.Count(out.String(), "\n"); n != chunks {
		t.Errorf("%d output lines, want %d", n, chunks)
	}
	if !strings.HasPrefix(out.String(), "t7 0\nt7 1\n") {
		t.Errorf("output out of order: %.40q", out.String())
	}
}

func TestRecvHelloChecks(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want error
	}{
		{`{"type":"hello","version":3}` + "\n", ErrVersion},
		{`{"type":"started","pid":1}` + "\n", ErrUnexpected},
		{``, io.EOF},
	} {
		c := NewConn(rw{strings.NewReader(tc.in), io.Discard})
		if _, err := c.RecvHello(); !errors.Is(err, tc.want) {
			t.Errorf("RecvHello(%q) = %v, want %v", tc.in, err, tc.want)
		}
	}
}

// TestRecvHelloVersions: the host serves every guest from MinVersion to
// Version (a version 1 guest takes no env message).
func TestRecvHelloVersions(t *testing.T) {
	for v := MinVersion; v <= Version; v++ {
		c := NewConn(rw{strings.NewReader(fmt.Sprintf(`{"type":"hello","version":%d}`+"\n", v)), io.Discard})
		if h, err := c.RecvHello(); err != nil || h.Version != v {
			t.Errorf("RecvHello(version %d) = %v, %v", v, h, err)
		}
	}
	if EnvVersion < MinVersion || EnvVersion > Version {
		t.Errorf("EnvVersion %d outside %d..%d", EnvVersion, MinVersion, Version)
	}
}

// TestEnvErrorsDoNotQuoteValues: the env message's values are
// credentials; a refused one is named by its index only, on both sides.
func TestEnvErrorsDoNotQuoteValues(t *testing.T) {
	const secret = "sk-live-SECRET0123456789"
	for _, vars := range [][]string{
		{"K=" + secret + "\x00"},
		{secret},
		{"K=" + secret, "K=" + secret},
		{"9" + secret + "=v"},
	} {
		_, err := Encode(&Env{Vars: vars})
		if !errors.Is(err, ErrInvalid) {
			t.Fatalf("Encode(%d vars) = %v, want ErrInvalid", len(vars), err)
		}
		if strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Encode's error quotes the value: %v", err)
		}
		line, _ := json.Marshal(map[string]any{"type": "env", "vars": vars})
		_, err = NewConn(rw{bytes.NewReader(append(line, '\n')), io.Discard}).Recv()
		if !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("Recv: %v (want ErrInvalid, not quoting the value)", err)
		}
	}
}

func TestAbortNotice(t *testing.T) {
	n := AbortNotice([]string{"POST http://evil.example/upload", "write /work/.bashrc\nwith newline"})
	if err := n.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"  - POST http://evil.example/upload\n",
		"  - write /work/.bashrc with newline\n",
		"did not take place",
		"rest of the task continues",
		"proceed",
		"only if the task explicitly requires it",
	} {
		if !strings.Contains(n.Text, want) {
			t.Errorf("notice lacks %q:\n%s", want, n.Text)
		}
	}
}
