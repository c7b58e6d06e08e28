package daemon

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/pkg/decide"
)

// The operator socket: one Unix socket per running sandbox, under the
// state directory, mode 0600, and every peer's credentials are checked
// (root only) before a request is read. Requests and responses are one
// JSON object per line; an audit export is followed by raw pcapng bytes.

// Request is one operator request.
type Request struct {
	Cmd           string `json:"cmd"` // status, held, approve, deny, audit
	ID            uint64 `json:"id,omitempty"`
	Justification string `json:"justification,omitempty"`
	// ForRun: approve or deny the same operation on the same target for
	// the rest of the run.
	ForRun bool `json:"for_run,omitempty"`
}

// Response is the answer to a request.
type Response struct {
	OK     bool           `json:"ok"`
	Error  string         `json:"error,omitempty"`
	Status *SandboxStatus `json:"status,omitempty"`
	Held   []HeldEffect   `json:"held,omitempty"`
	// Withdrawn (with held) are the questions withdrawn most recently:
	// no client waits for their answer any more.
	Withdrawn []decide.Withdrawn `json:"withdrawn,omitempty"`
	// Bytes of raw data (pcapng) that follow the response line.
	Bytes int `json:"bytes,omitempty"`
}

// Operator is what the socket serves; the daemon implements it.
type Operator interface {
	Status() SandboxStatus
	Held() []HeldEffect
	// Withdrawn lists the questions withdrawn most recently.
	Withdrawn() []decide.Withdrawn
	// Answer approves or denies a pending effect; by names who answered.
	Answer(id uint64, release bool, justification, by string, forRun bool) error
	AuditPcap(w io.Writer) error
}

// ErrNotRunning is returned by Client.Do when nobody listens on the
// socket: its carbd died (a crash leaves the socket behind).
var ErrNotRunning = errors.New("daemon: the sandbox's carbd is not running (after a crash, carbd run on the same working directory recovers it)")

// errNotRoot is what a non-root peer is told.
var errNotRoot = errors.New("permission denied: the operator socket answers root only")

// serveOperator accepts connections until l is closed, and returns why
// it stopped accepting. Each connection is served on a goroutine counted
// in wg.
func serveOperator(l *net.UnixListener, op Operator, wg *sync.WaitGroup) error {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return fmt.Errorf("operator socket: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			handleOperator(c, op)
		}()
	}
}

func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return cred.Uid, nil
}

func handleOperator(c *net.UnixConn, op Operator) {
	enc := json.NewEncoder(c)
	uid, err := peerUID(c)
	if err != nil || uid != 0 {
		_ = enc.Encode(Response{Error: errNotRoot.Error()})
		return
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	var req Request
	dec := json.NewDecoder(bufio.NewReader(io.LimitReader(c, 1<<16)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		_ = enc.Encode(Response{Error: "bad request: " + err.Error()})
		return
	}
	switch req.Cmd {
	case "status":
		st := op.Status()
		_ = enc.Encode(Response{OK: true, Status: &st})
	case "held":
		_ = enc.Encode(Response{OK: true, Held: op.Held(), Withdrawn: op.Withdrawn()})
	case "approve", "deny":
		if err := op.Answer(req.ID, req.Cmd == "approve", req.Justification, fmt.Sprintf("uid %d", uid), req.ForRun); err != nil {
			_ = enc.Encode(Response{Error: err.Error()})
			return
		}
		_ = enc.Encode(Response{OK: true})
	case "audit":
		var buf strings.Builder
		if err := op.AuditPcap(&buf); err != nil {
			_ = enc.Encode(Response{Error: err.Error()})
			return
		}
		if err := enc.Encode(Response{OK: true, Bytes: buf.Len()}); err != nil {
			return
		}
		_, _ = io.WriteString(c, buf.String())
	default:
		_ = enc.Encode(Response{Error: fmt.Sprintf("unknown command %q", req.Cmd)})
	}
}

// listenOperator creates the socket at path, readable and writable by
// root only.
func listenOperator(path string) (*net.UnixListener, error) {
	_ = os.Remove(path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("operator socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Client talks to one sandbox's operator socket.
type Client struct {
	Path string
}

// Sockets lists the operator sockets of the running sandboxes under the
// state directory. It needs to read the sandboxes directory, and only to
// search each sandbox's (0711), so a client that may list the sandboxes
// reaches their sockets, where the daemon checks who it is.
func Sockets(stateDir string) ([]Client, error) {
	dir := filepath.Join(stateDir, "sandboxes")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the sandboxes: %w", err)
	}
	var out []Client
	for _, e := range ents {
		c, ok := SocketOf(stateDir, e.Name())
		if ok {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// SocketOf returns the operator socket of sandbox id, if there is one.
func SocketOf(stateDir, id string) (Client, bool) {
	if id == "" || id == "." || id == ".." || strings.ContainsRune(id, '/') {
		return Client{}, false
	}
	p := filepath.Join(stateDir, "sandboxes", id, "operator.sock")
	if st, err := os.Lstat(p); err != nil || st.Mode().Type() != os.ModeSocket {
		return Client{}, false
	}
	return Client{Path: p}, true
}

// Do sends a request; when the response announces raw bytes they are
// copied to raw.
func (c Client) Do(req Request, raw io.Writer) (*Response, error) {
	conn, err := net.DialTimeout("unix", c.Path, 5*time.Second)
	if errors.Is(err, os.ErrPermission) {
		return nil, fmt.Errorf("%w (the operator socket answers root only)", err)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w: %w", ErrNotRunning, err)
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	// The daemon may refuse the connection (not root) before reading the
	// request and close it: then writing fails, but its answer, which
	// says why, is there to read.
	werr := json.NewEncoder(conn).Encode(req)
	br := bufio.NewReader(conn)
	line, err := br.ReadBytes('\n')
	if err != nil {
		if werr != nil {
			return nil, fmt.Errorf("operator socket %s: %w", c.Path, werr)
		}
		return nil, fmt.Errorf("operator socket %s: %w", c.Path, err)
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return nil, fmt.Errorf("operator socket %s: bad response: %w", c.Path, err)
	}
	if resp.Error != "" {
		return &resp, errors.New(resp.Error)
	}
	if resp.Bytes > 0 && raw != nil {
		if _, err := io.CopyN(raw, br, int64(resp.Bytes)); err != nil {
			return &resp, err
		}
	}
	return &resp, nil
}

// ID is the sandbox id of a socket path.
func (c Client) ID() string { return filepath.Base(filepath.Dir(c.Path)) }
