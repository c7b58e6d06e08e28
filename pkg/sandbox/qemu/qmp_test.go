package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeQMP serves QEMU's machine protocol as its spec describes it: the
// greeting, capabilities negotiation mode (only qmp_capabilities is
// accepted), then commands answered with return or error, with events
// interleaved. It records every command it receives.
type fakeQMP struct {
	mu       sync.Mutex
	commands []string
	status   string
	greeting string
}

func startFakeQMP(t *testing.T, f *fakeQMP) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.serve(c) // one client at a time, as QEMU's socket chardev
		}
	}()
	return sock
}

func (f *fakeQMP) serve(c net.Conn) {
	defer c.Close()
	greet := f.greeting
	if greet == "" {
		greet = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": ""}, "capabilities": ["oob"]}}`
	}
	fmt.Fprintln(c, greet)
	event := func(name string) {
		fmt.Fprintf(c, `{"timestamp": {"seconds": 1, "microseconds": 2}, "event": %q}`+"\n", name)
	}
	negotiated := false
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			fmt.Fprintln(c, `{"error": {"class": "GenericError", "desc": "JSON parse error"}}`)
			continue
		}
		f.mu.Lock()
		f.commands = append(f.commands, req.Execute)
		switch {
		case !negotiated && req.Execute != "qmp_capabilities":
			fmt.Fprintf(c, `{"error": {"class": "CommandNotFound", "desc": "Expecting capabilities negotiation with 'qmp_capabilities'"}}`+"\n")
		case req.Execute == "qmp_capabilities":
			negotiated = true
			fmt.Fprintln(c, `{"return": {}}`)
		case req.Execute == "stop":
			f.status = "paused"
			event("STOP")
			fmt.Fprintln(c, `{"return": {}}`)
		case req.Execute == "cont":
			f.status = "running"
			fmt.Fprintln(c, `{"return": {}}`)
			event("RESUME")
		case req.Execute == "query-status":
			fmt.Fprintf(c, `{"return": {"status": %q, "singlestep": false, "running": %v}}`+"\n", f.status, f.status == "running")
		default:
			fmt.Fprintf(c, `{"error": {"class": "CommandNotFound", "desc": "The command %s has not been found"}}`+"\n", req.Execute)
		}
		f.mu.Unlock()
	}
}

func TestQMPExecute(t *testing.T) {
	f := &fakeQMP{status: "running"}
	vm := &VM{qmp: startFakeQMP(t, f)}
	ctx := context.Background()
	if st, err := vm.Status(ctx); err != nil || st != "running" {
		t.Fatalf("status %q %v", st, err)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if st, err := vm.Status(ctx); err != nil || st != "paused" {
		t.Fatalf("status after pause %q %v", st, err)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := vm.QMP(ctx, "no-such-command", nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" || !strings.HasPrefix(err.Error(), "qemu: qmp no-such-command: CommandNotFound") {
		t.Errorf("unknown command: %v", err)
	}
	want := []string{
		"qmp_capabilities", "query-status",
		"qmp_capabilities", "stop",
		"qmp_capabilities", "query-status",
		"qmp_capabilities", "cont",
		"qmp_capabilities", "no-such-command",
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if diff := cmp.Diff(want, f.commands); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
}

func TestQMPErrors(t *testing.T) {
	ctx := context.Background()
	if err := (&VM{}).Pause(ctx); !errors.Is(err, ErrNoQMP) {
		t.Errorf("no socket: %v", err)
	}
	if _, err := QMPExecute(ctx, filepath.Join(t.TempDir(), "none.sock"), "stop", nil); err == nil || !strings.HasPrefix(err.Error(), "qemu: qmp stop: ") {
		t.Errorf("missing socket: %v", err)
	}
	// A peer that is not QMP.
	sock := startFakeQMP(t, &fakeQMP{greeting: `{"hello": 1}`})
	if _, err := QMPExecute(ctx, sock, "stop", nil); err == nil || !strings.Contains(err.Error(), "QMP banner") {
		t.Errorf("no banner: %v", err)
	}
	// A peer that never answers: ctx bounds the call.
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := QMPExecute(cctx, filepath.Join(dir, "s.sock"), "stop", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("silent peer: %v", err)
	}
}
