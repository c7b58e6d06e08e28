package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"
)

// ErrNoQMP is returned by the VM's QMP methods when it was started
// without Config.QMPSocket.
var ErrNoQMP = errors.New("qemu: no qmp socket (Config.QMPSocket is empty)")

// QMPError is the error QEMU answered a QMP command with.
type QMPError struct {
	Command string
	Class   string // e.g. GenericError, CommandNotFound
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qemu: qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// qmpMessage is any message QEMU sends on QMP: the greeting, a command's
// return or error, or an asynchronous event.
type qmpMessage struct {
	QMP    json.RawMessage `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// maxQMPMessages bounds how many messages (events) a command may be
// answered after, so a chatty or broken peer cannot hold the caller.
const maxQMPMessages = 1024

// QMPExecute runs one command on QEMU's machine protocol socket (QEMU's
// docs/interop/qmp-spec): connect, read the greeting, leave capabilities
// negotiation mode with qmp_capabilities, send {"execute": command,
// "arguments": args} (args nil: none) and return the "return" value.
// Asynchronous events in between are skipped. ctx bounds the whole
// exchange; without a deadline it is bounded by 10 s.
func QMPExecute(ctx context.Context, socket, command string, args any) (json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("qemu: qmp %s: %w", command, err)
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	dec := json.NewDecoder(bufio.NewReader(c))
	read := func(what string) (*qmpMessage, error) {
		for i := 0; i < maxQMPMessages; i++ {
			var m qmpMessage
			if err := dec.Decode(&m); err != nil {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("qemu: qmp %s: %s: %w", command, what, ctx.Err())
				}
				if errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
					// The connection's deadline is ctx's and fired first.
					return nil, fmt.Errorf("qemu: qmp %s: %s: %w", command, what, context.DeadlineExceeded)
				}
				return nil, fmt.Errorf("qemu: qmp %s: %s: %w", command, what, err)
			}
			if m.Event != "" {
				continue
			}
			return &m, nil
		}
		return nil, fmt.Errorf("qemu: qmp %s: %s: more than %d events and no answer", command, what, maxQMPMessages)
	}
	g, err := read("greeting")
	if err != nil {
		return nil, err
	}
	if len(g.QMP) == 0 {
		return nil, fmt.Errorf("qemu: qmp %s: the peer did not greet with a QMP banner", command)
	}
	run := func(cmd string, args any) (json.RawMessage, error) {
		req := map[string]any{"execute": cmd}
		if args != nil {
			req["arguments"] = args
		}
		b, err := json.Marshal(req)
		if err != nil {
			return nil, fmt.Errorf("qemu: qmp %s: %w", cmd, err)
		}
		if _, err := c.Write(append(b, '\n')); err != nil {
			return nil, fmt.Errorf("qemu: qmp %s: %w", cmd, err)
		}
		m, err := read("answer")
		if err != nil {
			return nil, err
		}
		if m.Error != nil {
			return nil, &QMPError{Command: cmd, Class: m.Error.Class, Desc: m.Error.Desc}
		}
		if m.Return == nil {
			return nil, fmt.Errorf("qemu: qmp %s: answer without return or error", cmd)
		}
		return m.Return, nil
	}
	if _, err := run("qmp_capabilities", nil); err != nil {
		return nil, err
	}
	return run(command, args)
}
