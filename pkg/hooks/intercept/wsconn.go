package intercept

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/hooks/netparse"
)

// isWebSocketUpgrade reports whether a released open effect is a
// WebSocket upgrade request without a body.
func isWebSocketUpgrade(ev *decide.Event) bool {
	if ev.Op != "http:GET" {
		return false
	}
	ws := false
	for _, f := range ev.Fields {
		switch f.Name {
		case netparse.FieldHeaderPrefix + "upgrade":
			ws = ws || strings.EqualFold(strings.TrimSpace(f.Value), "websocket")
		case netparse.FieldHeaderPrefix + "content-length", netparse.FieldHeaderPrefix + "transfer-encoding":
			return false
		}
	}
	return ws
}

// headEnd returns the length of the HTTP head at the start of b (through
// its empty line), or -1 when b does not hold it all.
func headEnd(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 2
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 3
		}
	}
	return -1
}

// stripExtensions drops Sec-WebSocket-Extensions lines from a request
// head: a compression extension would hide the messages' content.
func stripExtensions(head []byte) []byte {
	var out []byte
	for len(head) > 0 {
		i := bytes.IndexByte(head, '\n')
		line := head[:i+1]
		head = head[i+1:]
		name, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("sec-websocket-extensions")) {
			continue
		}
		out = append(out, line...)
	}
	return out
}

// websocket runs a released WebSocket upgrade: the request goes up (its
// extension offer removed), the response comes back; after a 101 each
// client message is one effect (Request.Event Op "ws:message", or
// "ws:control" for a control frame with a payload), decided before any
// of its frames go up, and each server message is observed. A refused
// message ends the connection: the client gets a close frame (1008) with
// the notice, the server a close of the connection.
func (h *h1Conn) websocket(ctx context.Context, start int64, up *Request) error {
	c := h.c
	if d := start - h.pendAt; d > 0 {
		h.trim(int(min(d, int64(len(h.pend)))))
	}
	n := headEnd(h.pend)
	if n < 0 {
		return fmt.Errorf("%w: upgrade request head not found", ErrWebSocket)
	}
	head := stripExtensions(h.pend[:n])
	h.trim(n)
	if err := h.forward(head); err != nil {
		return err
	}
	// The response head: read up to its end, show it to the tap (the
	// upgrade's response event), pass it on.
	var resp []byte
	for headEnd(resp) < 0 {
		if len(resp) > 64<<10 {
			return fmt.Errorf("%w: upgrade response head over 64 KiB", ErrWebSocket)
		}
		k, err := c.up.Read(h.buf)
		resp = append(resp, h.buf[:k]...)
		if err != nil {
			c.cliTLS.Write(resp) //nolint:errcheck // closing
			return nil
		}
	}
	rn := headEnd(resp)
	h.rw.ingress(resp[:rn], false, c.observer(up))
	if _, err := c.cliTLS.Write(resp[:rn]); err != nil {
		return fmt.Errorf("intercept: write to client: %w", err)
	}
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 101")) {
		// Upgrade declined: an ordinary response, then the end (the
		// stream after an upgrade request is not framed as HTTP).
		c.cliTLS.Write(resp[rn:]) //nolint:errcheck // closing
		io.Copy(c.cliTLS, c.up)   //nolint:errcheck // closing
		return nil
	}
	var mu sync.Mutex // serializes whole frames to the client
	var ending atomic.Bool
	srv := &wsAssembler{limit: maxObservedBody}
	srv.write(resp[rn:])
	done := make(chan error, 1)
	go func() { done <- h.wsServer(srv, &mu, &ending, up) }()
	cli := &wsAssembler{masked: true, limit: c.p.cfg.MaxBodyBytes}
	cli.write(h.pend)
	h.trim(len(h.pend))
	end := func(notice string) error {
		ending.Store(true)
		c.up.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		c.cliTLS.Write(wsCloseFrame(1008, "carbd: refused: "+notice)) //nolint:errcheck // closing
		return nil
	}
	for {
		u, ok, err := cli.next()
		if err != nil {
			return end(err.Error())
		}
		if !ok {
			k, rerr := c.cliTLS.Read(h.buf)
			cli.write(h.buf[:k])
			if rerr != nil {
				c.up.CloseWrite() //nolint:errcheck // the server sees the end
				return <-done
			}
			continue
		}
		if !u.follow && (!u.end || u.typ < 8 || len(u.payload) > 0) {
			req := c.request()
			req.Event = wsEvent(&up.Event, &u, decide.Out)
			req.Oversized = u.big
			var v Verdict
			if why := c.misdirected(eventHost(&req.Event)); why != "" {
				v.Notice = why
				c.refuse(&req, why)
			} else {
				v = c.p.cfg.Decider.Decide(ctx, &req)
			}
			if !v.Release {
				return end(v.Notice)
			}
		}
		if _, err := c.up.Write(u.raw); err != nil {
			return fmt.Errorf("intercept: write upstream: %w", err)
		}
	}
}

// wsServer relays the server's frames to the client, whole frames under
// mu, and observes its messages.
func (h *h1Conn) wsServer(a *wsAssembler, mu *sync.Mutex, ending *atomic.Bool, up *Request) error {
	c := h.c
	buf := make([]byte, readBufSize)
	for {
		u, ok, err := a.next()
		if err != nil {
			c.cliTLS.Close()
			return err
		}
		if ok {
			if (u.big || u.end && !u.follow) && u.typ < 8 && c.p.cfg.Observe != nil {
				ev := wsEvent(&up.Event, &u, decide.In)
				if u.big {
					ev.Opaque = true
					ev.Fields = append(ev.Fields,
						decide.Field{Name: netparse.FieldOpaque, Role: decide.RoleContent},
						decide.Field{Name: netparse.FieldOpaqueReason, Role: decide.RoleControl, Value: "intercept: websocket message larger than the observed bound"})
				}
				c.p.cfg.Observe(up, ev)
			}
			mu.Lock()
			_, werr := c.cliTLS.Write(u.raw)
			mu.Unlock()
			if werr != nil {
				return werr
			}
			continue
		}
		k, rerr := c.up.Read(buf)
		a.write(buf[:k])
		if rerr != nil && ending.Load() {
			return nil // carbd ends the connection: the client gets its close frame
		}
		if rerr != nil {
			if len(a.buf) > 0 {
				mu.Lock()
				c.cliTLS.Write(a.buf) //nolint:errcheck // the end
				mu.Unlock()
			}
			c.cliTLS.CloseWrite() //nolint:errcheck // the client sees the end
			if errors.Is(rerr, io.EOF) || errors.Is(rerr, netClosed) {
				return nil
			}
			return rerr
		}
	}
}

// wsEvent builds the event of one message from its upgrade request's.
func wsEvent(upgrade *decide.Event, u *wsUnit, dir decide.Direction) decide.Event {
	ev := decide.Event{Time: time.Now(), Ch: decide.ChanNet, Dir: dir, Op: OpWSMessage, Obj: upgrade.Obj, Content: string(u.payload)}
	if u.typ >= 8 {
		ev.Op = OpWSControl
	}
	if upgrade.Dest != nil {
		d := *upgrade.Dest
		ev.Dest = &d
	}
	add := func(name string, role decide.Role, v string) {
		ev.Fields = append(ev.Fields, decide.Field{Name: name, Role: role, Value: v})
	}
	if dir == decide.In {
		src := strings.TrimPrefix(upgrade.Obj, "https://")
		if i := strings.IndexByte(src, '?'); i >= 0 {
			src = src[:i]
		}
		ev.Source = "fetch:" + src
	} else {
		if ev.Dest != nil && ev.Dest.Host != "" {
			add(netparse.FieldHost, decide.RoleTarget, ev.Dest.Host)
		}
		add(netparse.FieldURL, decide.RoleTarget, upgrade.Obj)
	}
	add(FieldWSType, decide.RoleControl, wsTypeName(u.typ))
	if len(u.payload) > 0 {
		add(netparse.FieldBody, decide.RoleContent, string(u.payload))
	}
	if u.big && dir == decide.Out {
		ev.Opaque = true
		add(netparse.FieldOpaque, decide.RoleContent, "")
		add(netparse.FieldOpaqueReason, decide.RoleControl, netparse.ErrOversized.Error())
	}
	return ev
}

var netClosed = net.ErrClosed
