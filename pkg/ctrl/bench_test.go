package ctrl

import (
	"bytes"
	"io"
	"testing"
)

func BenchmarkEncodeOutput(b *testing.B) {
	m := &Output{Stream: Stdout, Data: bytes.Repeat([]byte("x"), MaxChunk)}
	b.SetBytes(MaxChunk)
	for b.Loop() {
		if _, err := Encode(m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeOutput(b *testing.B) {
	line, _ := Encode(&Output{Stream: Stdout, Data: bytes.Repeat([]byte("x"), MaxChunk)})
	line = line[:len(line)-1]
	b.SetBytes(MaxChunk)
	for b.Loop() {
		if _, err := Decode(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnRoundTrip sends and receives small output messages
// through a Conn over an in-memory buffer.
func BenchmarkConnRoundTrip(b *testing.B) {
	var buf bytes.Buffer
	c := NewConn(struct {
		io.Reader
		io.Writer
	}{&buf, &buf})
	m := &Output{Stream: Stdout, Data: []byte("a line of agent output\n")}
	for b.Loop() {
		if err := c.Send(m); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Recv(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnvRoundTrip encodes and decodes an env message of 16
// variables with 64-byte values (an agent's keys and settings), the
// once-per-run cost of --env on a VM backend.
func BenchmarkEnvRoundTrip(b *testing.B) {
	vars := make([]string, 16)
	for i := range vars {
		vars[i] = "AGENT_VAR_" + string(rune('A'+i)) + "=" + string(bytes.Repeat([]byte{'v'}, 64))
	}
	m := &Env{Vars: vars}
	for b.Loop() {
		line, err := Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Decode(line[:len(line)-1]); err != nil {
			b.Fatal(err)
		}
	}
}
