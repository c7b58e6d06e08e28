// Package chvtest is a fake Cloud Hypervisor for tests of code that
// launches and drives it (pkg/sandbox/chv, the daemon's cloud-hypervisor
// backend). Cloud Hypervisor cannot be installed on carbd's development
// machines, so the fake implements its documented contract strictly and
// records every breach:
//
//   - the command line (ParseArgs): the documented options carbd uses with
//     their key=value syntax (`cloud-hypervisor --help`, docs/fs.md,
//     docs/vsock.md), the required ones, --fs only with
//     --memory shared=on, an ELF --kernel;
//   - the REST API on the --api-socket (API): only the documented
//     endpoints (vmm.ping, vmm.shutdown, vm.info, vm.pause, vm.resume,
//     vm.shutdown, vm.power-button) with their methods, no request body,
//     HTTP/1.1 to host localhost, and the OpenAPI document's status codes
//     and state machine (vm.shutdown is allowed from Running and Paused);
//   - the hybrid vsock on the --vsock socket (Vsock): "CONNECT <port>\n"
//     read exactly, "OK <hostport>\n" for the guest's port, the
//     connection closed for any other.
//
// Main runs the fake as a process: a test binary re-executes itself with
// EnvFake=1 and calls Main from TestMain (or an init function). The guest
// behind the vsock is the caller's GuestFunc. As Cloud Hypervisor does,
// the process exits when the guest powers off (Guest.PowerOff), on
// vmm.shutdown and on SIGTERM, and stays up after vm.shutdown. With
// EnvLog set, it appends what it saw to that file as JSON lines
// (ReadLog): its argv, every API request, contract violations, vsock
// handshakes, the guest's records and how it exited.
//
// Pure Go; it needs nothing but Unix sockets.
package chvtest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/carbd/carbd/pkg/ctrl"
)

// The environment of the re-executed fake.
const (
	// EnvFake set to "1" makes the test binary run Main.
	EnvFake = "CARBD_FAKE_CHV"
	// EnvLog names the file the fake appends its record to.
	EnvLog = "CARBD_FAKE_CHV_LOG"
)

// APIPrefix is the path prefix of every endpoint.
const APIPrefix = "/api/v1/"

// DefaultCtrlPort is the guest's control port when the kernel command
// line has no carbd.vsock=.
const DefaultCtrlPort = 1024

// The VM states of the VmState schema.
const (
	StateCreated  = "Created"
	StateRunning  = "Running"
	StateShutdown = "Shutdown"
	StatePaused   = "Paused"
)

// endpoints maps each endpoint the fake serves to its method.
var endpoints = map[string]string{
	"vmm.ping":        http.MethodGet,
	"vmm.shutdown":    http.MethodPut,
	"vm.info":         http.MethodGet,
	"vm.pause":        http.MethodPut,
	"vm.resume":       http.MethodPut,
	"vm.shutdown":     http.MethodPut,
	"vm.power-button": http.MethodPut,
}

// API is the REST API. It records each request as "METHOD path" and
// every breach of the contract. Safe for concurrent use.
type API struct {
	mu         sync.Mutex
	created    bool
	state      string
	requests   []string
	violations []string
	// OnRequest, when set, sees each request line as it is recorded.
	OnRequest func(line string)
	// OnViolation, when set, sees each violation.
	OnViolation func(msg string)
	// OnVMMShutdown, when set, runs (in its own goroutine) after
	// vmm.shutdown is answered.
	OnVMMShutdown func()
	// OnStateChange, when set, sees each new state.
	OnStateChange func(state string)
}

// NewAPI returns the API of a VMM whose VM is created and running, or
// of one with no VM (created false: vm.* answer 404).
func NewAPI(created bool) *API {
	a := &API{created: created, state: StateRunning}
	if !created {
		a.state = ""
	}
	return a
}

// Requests returns the requests so far.
func (a *API) Requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.requests...)
}

// Violations returns the contract breaches so far.
func (a *API) Violations() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.violations...)
}

// State is the VM's state.
func (a *API) State() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state
}

func (a *API) violate(w http.ResponseWriter, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	a.violations = append(a.violations, msg)
	if a.OnViolation != nil {
		a.OnViolation(msg)
	}
	http.Error(w, msg, http.StatusBadRequest)
}

func (a *API) setState(s string) {
	a.state = s
	if a.OnStateChange != nil {
		a.OnStateChange(s)
	}
}

// ServeHTTP serves one request.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	line := r.Method + " " + r.URL.Path
	a.requests = append(a.requests, line)
	if a.OnRequest != nil {
		a.OnRequest(line)
	}
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 {
		a.violate(w, "protocol %s, want HTTP/1.1", r.Proto)
		return
	}
	if r.Host != "localhost" {
		a.violate(w, "host %q, want localhost", r.Host)
		return
	}
	ep, ok := strings.CutPrefix(r.URL.Path, APIPrefix)
	method, known := endpoints[ep]
	if !ok || !known || r.URL.RawQuery != "" {
		a.violate(w, "unknown endpoint %s", r.URL.RequestURI())
		return
	}
	if r.Method != method {
		a.violate(w, "%s %s, want %s", r.Method, ep, method)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if len(body) != 0 || r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
		a.violate(w, "%s takes no request body", ep)
		return
	}
	if method == http.MethodGet && r.Header.Get("Accept") != "application/json" {
		a.violate(w, "%s without Accept: application/json", ep)
		return
	}
	act := func(allowed []string, next string) {
		if !a.created {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		for _, s := range allowed {
			if a.state == s {
				a.setState(next)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		http.Error(w, "VM is "+a.state, http.StatusMethodNotAllowed)
	}
	switch ep {
	case "vmm.ping":
		writeJSON(w, map[string]any{"build_version": "v48.0-fake", "version": "48.0.0", "pid": os.Getpid(), "features": []string{"kvm"}})
	case "vmm.shutdown":
		w.WriteHeader(http.StatusNoContent)
		if a.OnVMMShutdown != nil {
			go a.OnVMMShutdown()
		}
	case "vm.info":
		if !a.created {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		writeJSON(w, map[string]any{
			"config":             map[string]any{"payload": map[string]any{"kernel": "/k"}, "memory": map[string]any{"size": 536870912, "shared": true}},
			"state":              a.state,
			"memory_actual_size": 536870912,
			"device_tree":        map[string]any{"_fs0": map[string]any{"id": "_fs0", "children": []string{}, "pci_bdf": "0000:00:03.0"}},
		})
	case "vm.pause":
		act([]string{StateRunning}, StatePaused)
	case "vm.resume":
		act([]string{StatePaused}, StateRunning)
	case "vm.shutdown", "vm.power-button":
		act([]string{StateRunning, StatePaused}, StateShutdown)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(v)
}

// Vsock is the host end of a hybrid vsock: for each connection it reads
// "CONNECT <port>\n" exactly; for the guest's port it answers
// "OK <hostport>\n" and hands the stream to the guest, for any other
// port it closes the connection (nothing listens there).
type Vsock struct {
	ln        net.Listener
	guestPort uint32
	guest     func(net.Conn, *bufio.Reader)
	// OnLine, when set, sees each handshake line as it is read.
	OnLine   func(line string)
	mu       sync.Mutex
	lines    []string
	nextPort uint32
}

// StartVsock listens on path; guest serves each accepted connection to
// guestPort (r holds what the host sent after its CONNECT line).
func StartVsock(path string, guestPort uint32, guest func(c net.Conn, r *bufio.Reader)) (*Vsock, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	v := &Vsock{ln: ln, guestPort: guestPort, guest: guest, nextPort: 1 << 30}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go v.handle(c)
		}
	}()
	return v, nil
}

func (v *Vsock) handle(c net.Conn) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	v.mu.Lock()
	v.lines = append(v.lines, line)
	v.nextPort++
	hostPort := v.nextPort
	onLine := v.OnLine
	v.mu.Unlock()
	if onLine != nil {
		onLine(line)
	}
	if err != nil {
		c.Close()
		return
	}
	ps, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "CONNECT ")
	port, perr := strconv.ParseUint(ps, 10, 32)
	if !ok || perr != nil || strconv.FormatUint(port, 10) != ps || uint32(port) != v.guestPort {
		c.Close()
		return
	}
	fmt.Fprintf(c, "OK %d\n", hostPort)
	v.guest(c, r)
}

// Lines returns the handshake lines read so far.
func (v *Vsock) Lines() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

// Close stops listening.
func (v *Vsock) Close() error { return v.ln.Close() }

// Options is a parsed command line: option name -> key -> value ("" is
// the key of a plain value, e.g. --kernel PATH).
type Options map[string]map[string]string

// options lists each documented option carbd uses with the keys its
// value may have ("" for a plain value).
var options = map[string][]string{
	"api-socket": {"path"},
	"kernel":     {""},
	"initramfs":  {""},
	"cmdline":    {""},
	"cpus":       {"boot"},
	"memory":     {"size", "shared"},
	"net":        {"tap", "ip", "mask", "mac"},
	"fs":         {"tag", "socket"},
	"vsock":      {"cid", "socket"},
	"serial":     {"file", "off", "null", "tty", "pty"},
	"console":    {"file", "off", "null", "tty", "pty"},
}

// ParseArgs parses "--name value" pairs strictly.
func ParseArgs(args []string) (Options, error) {
	out := Options{}
	for i := 0; i < len(args); i += 2 {
		name, ok := strings.CutPrefix(args[i], "--")
		keys, known := options[name]
		if !ok || !known {
			return nil, fmt.Errorf("unknown argument %q", args[i])
		}
		if i+1 >= len(args) {
			return nil, fmt.Errorf("--%s without a value", name)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("--%s given twice", name)
		}
		val := args[i+1]
		kv := map[string]string{}
		if keys[0] == "" {
			kv[""] = val
		} else if (name == "serial" || name == "console") && !strings.Contains(val, "=") {
			if !contains(keys, val) || val == "file" {
				return nil, fmt.Errorf("--%s %q", name, val)
			}
			kv[val] = ""
		} else {
			for _, part := range strings.Split(val, ",") {
				k, v, ok := strings.Cut(part, "=")
				if !ok || !contains(keys, k) || v == "" {
					return nil, fmt.Errorf("--%s: bad option %q", name, part)
				}
				if _, dup := kv[k]; dup {
					return nil, fmt.Errorf("--%s: %s given twice", name, k)
				}
				kv[k] = v
			}
		}
		out[name] = kv
	}
	for _, req := range []string{"api-socket", "kernel", "memory", "vsock"} {
		if out[req] == nil {
			return nil, fmt.Errorf("--%s missing", req)
		}
	}
	if out["fs"] != nil && out["memory"]["shared"] != "on" {
		return nil, errors.New("--fs needs --memory shared=on")
	}
	if n := out["net"]; n != nil {
		if (n["ip"] == "") != (n["mask"] == "") {
			return nil, errors.New("--net: ip and mask go together")
		}
	}
	if cid, err := strconv.ParseUint(out["vsock"]["cid"], 10, 32); err != nil || cid < 3 {
		return nil, fmt.Errorf("--vsock cid %q", out["vsock"]["cid"])
	}
	b, err := os.ReadFile(out["kernel"][""])
	if err != nil || len(b) < 4 || string(b[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("--kernel %s: not an ELF kernel", out["kernel"][""])
	}
	return out, nil
}

// Cmdline returns the kernel command line's parameters as key -> value
// ("" for a parameter without "=").
func (o Options) Cmdline() map[string]string {
	m := map[string]string{}
	for _, p := range strings.Fields(o["cmdline"][""]) {
		k, v, _ := strings.Cut(p, "=")
		m[k] = v
	}
	return m
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Guest is the guest side of one control connection.
type Guest struct {
	// Conn is the control channel (the host's end is its ctrl.Conn).
	Conn *ctrl.Conn
	// Opts is the VMM's parsed command line.
	Opts Options
	// API is the VMM's API (its state says whether the VM is paused).
	API *API
	rec func(kind string, v any)
	off func()
}

// Record appends {kind: v} to the fake's log.
func (g *Guest) Record(kind string, v any) { g.rec(kind, v) }

// PowerOff ends the VMM as a guest power-off does: the process exits 0.
func (g *Guest) PowerOff() { g.off() }

// GuestFunc plays the guest on a control connection.
type GuestFunc func(*Guest)

// EchoGuest says hello, answers the task with a result echoing its text
// ("did: TEXT"), and returns at the host's shutdown or the end of the
// stream, leaving the VM running.
func EchoGuest(g *Guest) {
	if g.Conn.Send(&ctrl.Hello{Version: ctrl.Version}) != nil {
		return
	}
	for {
		m, err := g.Conn.Recv()
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *ctrl.Task:
			g.Conn.Send(&ctrl.Started{PID: 1})
			g.Conn.Send(&ctrl.Result{Status: 0, Text: "did: " + m.Text})
		case *ctrl.Shutdown:
			return
		}
	}
}

// Main is the fake cloud-hypervisor process: it parses args, serves the
// API and the vsock with guest behind it, and returns the exit status.
func Main(args []string, guest GuestFunc) int {
	var logMu sync.Mutex
	var logFile *os.File
	if p := os.Getenv(EnvLog); p != "" {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
			return 1
		}
		defer f.Close()
		logFile = f
	}
	rec := func(kind string, v any) {
		if logFile == nil {
			return
		}
		b, err := json.Marshal(map[string]any{kind: v})
		if err != nil {
			b, _ = json.Marshal(map[string]any{"violation": fmt.Sprintf("record %s: %v", kind, err)})
		}
		logMu.Lock()
		defer logMu.Unlock()
		logFile.Write(append(b, '\n'))
	}
	rec("argv", args)
	opts, err := ParseArgs(args)
	if err != nil {
		rec("violation", "command line: "+err.Error())
		rec("exit", "refused its command line")
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	exit := make(chan string, 3)
	api := NewAPI(true)
	api.OnRequest = func(line string) { rec("request", line) }
	api.OnViolation = func(msg string) { rec("violation", msg) }
	api.OnVMMShutdown = func() { exit <- "vmm.shutdown" }
	ln, err := net.Listen("unix", opts["api-socket"]["path"])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	defer ln.Close()
	go http.Serve(ln, api)
	port := uint32(DefaultCtrlPort)
	if v, ok := opts.Cmdline()["carbd.vsock"]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			rec("violation", "carbd.vsock="+v)
		}
		port = uint32(n)
	}
	var offOnce sync.Once
	vs, err := StartVsock(opts["vsock"]["socket"], port, func(c net.Conn, r *bufio.Reader) {
		defer c.Close()
		g := &Guest{
			Conn: ctrl.NewConn(struct {
				io.Reader
				io.Writer
			}{r, c}),
			Opts: opts, API: api, rec: rec,
			off: func() { offOnce.Do(func() { exit <- "guest power-off" }) },
		}
		guest(g)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	vs.OnLine = func(line string) { rec("vsock", line) }
	defer vs.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	select {
	case why := <-exit:
		rec("exit", why)
	case <-sig:
		rec("exit", "SIGTERM")
	}
	return 0
}

// Log is what a fake process recorded (EnvLog).
type Log struct {
	Argv       []string
	Requests   []string // "METHOD /api/v1/endpoint"
	Violations []string
	Vsock      []string // handshake lines
	Exit       string   // vmm.shutdown, guest power-off, SIGTERM, ...
	// Guest holds the guest's records in order.
	Guest []Record
}

// Record is one guest record.
type Record struct {
	Kind  string
	Value json.RawMessage
}

// ReadLog reads the file a fake appended to.
func ReadLog(path string) (*Log, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	l := &Log{}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil || len(m) != 1 {
			return nil, fmt.Errorf("chvtest: %s:%d: not a record: %q", path, i+1, line)
		}
		for k, v := range m {
			var s string
			switch k {
			case "argv":
				err = json.Unmarshal(v, &l.Argv)
			case "request", "violation", "vsock", "exit":
				err = json.Unmarshal(v, &s)
				switch k {
				case "request":
					l.Requests = append(l.Requests, s)
				case "violation":
					l.Violations = append(l.Violations, s)
				case "vsock":
					l.Vsock = append(l.Vsock, s)
				case "exit":
					l.Exit = s
				}
			default:
				l.Guest = append(l.Guest, Record{Kind: k, Value: v})
			}
			if err != nil {
				return nil, fmt.Errorf("chvtest: %s:%d: %s: %w", path, i+1, k, err)
			}
		}
	}
	return l, nil
}
