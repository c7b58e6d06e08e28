package chv

// A fake Cloud Hypervisor that implements the documented contract
// strictly: the REST API of the OpenAPI document (only the endpoints carbd
// uses, with their methods, empty bodies and status codes) and the hybrid
// vsock handshake. It runs in the test process (fakeAPI, fakeVsock) and,
// for Start, as a re-executed test binary (TestMain with CARBD_FAKE_CHV=1)
// that parses the command line as cloud-hypervisor documents it.

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
	"testing"

	"github.com/carbd/carbd/pkg/ctrl"
)

func TestMain(m *testing.M) {
	if os.Getenv("CARBD_FAKE_CHV") == "1" {
		os.Exit(fakeMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeAPI is the REST API: it records each request as "METHOD path" and
// every breach of the contract.
type fakeAPI struct {
	mu         sync.Mutex
	created    bool
	state      VMState
	requests   []string
	violations []string
	onVMMStop  func()
}

func newFakeAPI(created bool) *fakeAPI {
	f := &fakeAPI{created: created, state: StateRunning}
	if !created {
		f.state = ""
	}
	return f
}

// endpoints maps each endpoint carbd uses to its method.
var endpoints = map[string]string{
	"vmm.ping":        http.MethodGet,
	"vmm.shutdown":    http.MethodPut,
	"vm.info":         http.MethodGet,
	"vm.pause":        http.MethodPut,
	"vm.resume":       http.MethodPut,
	"vm.shutdown":     http.MethodPut,
	"vm.power-button": http.MethodPut,
}

func (f *fakeAPI) violate(w http.ResponseWriter, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	f.violations = append(f.violations, msg)
	http.Error(w, msg, http.StatusBadRequest)
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, r.Method+" "+r.URL.Path)
	if r.ProtoMajor != 1 || r.ProtoMinor != 1 {
		f.violate(w, "protocol %s, want HTTP/1.1", r.Proto)
		return
	}
	if r.Host != "localhost" {
		f.violate(w, "host %q, want localhost", r.Host)
		return
	}
	ep, ok := strings.CutPrefix(r.URL.Path, APIPrefix)
	method, known := endpoints[ep]
	if !ok || !known || r.URL.RawQuery != "" {
		f.violate(w, "unknown endpoint %s", r.URL.RequestURI())
		return
	}
	if r.Method != method {
		f.violate(w, "%s %s, want %s", r.Method, ep, method)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if len(body) != 0 || r.ContentLength > 0 || len(r.TransferEncoding) > 0 {
		f.violate(w, "%s takes no request body", ep)
		return
	}
	if method == http.MethodGet && r.Header.Get("Accept") != "application/json" {
		f.violate(w, "%s without Accept: application/json", ep)
		return
	}
	act := func(allowed VMState, next VMState) {
		switch {
		case !f.created:
			w.WriteHeader(http.StatusNotFound)
		case f.state != allowed:
			http.Error(w, "VM is "+string(f.state), http.StatusMethodNotAllowed)
		default:
			f.state = next
			w.WriteHeader(http.StatusNoContent)
		}
	}
	switch ep {
	case "vmm.ping":
		writeJSON(w, PingResponse{BuildVersion: "v48.0-fake", Version: "48.0.0", PID: int64(os.Getpid()), Features: []string{"kvm"}})
	case "vmm.shutdown":
		w.WriteHeader(http.StatusNoContent)
		if f.onVMMStop != nil {
			go f.onVMMStop()
		}
	case "vm.info":
		if !f.created {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		writeJSON(w, map[string]any{
			"config":             map[string]any{"payload": map[string]any{"kernel": "/k"}, "memory": map[string]any{"size": 536870912, "shared": true}},
			"state":              f.state,
			"memory_actual_size": 536870912,
			"device_tree":        map[string]any{"_fs0": map[string]any{"id": "_fs0", "children": []string{}, "pci_bdf": "0000:00:03.0"}},
		})
	case "vm.pause":
		act(StateRunning, StatePaused)
	case "vm.resume":
		act(StatePaused, StateRunning)
	case "vm.shutdown", "vm.power-button":
		if f.state == StatePaused {
			act(StatePaused, StateShutdown)
		} else {
			act(StateRunning, StateShutdown)
		}
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	json.NewEncoder(w).Encode(v)
}

// fakeVsock is the host end of a hybrid vsock: for each connection it
// reads "CONNECT <port>\n" exactly; for the guest's port it answers
// "OK <hostport>\n" and hands the stream to guest, for any other port it
// closes the connection (nothing listens there).
type fakeVsock struct {
	ln        net.Listener
	guestPort uint32
	guest     func(net.Conn, *bufio.Reader)
	mu        sync.Mutex
	lines     []string
	nextPort  uint32
}

func startFakeVsock(path string, guestPort uint32, guest func(net.Conn, *bufio.Reader)) (*fakeVsock, error) {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	f := &fakeVsock{ln: ln, guestPort: guestPort, guest: guest, nextPort: 1 << 30}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.handle(c)
		}
	}()
	return f, nil
}

func (f *fakeVsock) handle(c net.Conn) {
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	f.mu.Lock()
	f.lines = append(f.lines, line)
	f.nextPort++
	hostPort := f.nextPort
	f.mu.Unlock()
	if err != nil {
		c.Close()
		return
	}
	ps, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "CONNECT ")
	port, perr := strconv.ParseUint(ps, 10, 32)
	if !ok || perr != nil || strconv.FormatUint(port, 10) != ps || uint32(port) != f.guestPort {
		c.Close()
		return
	}
	fmt.Fprintf(c, "OK %d\n", hostPort)
	f.guest(c, r)
}

func (f *fakeVsock) Lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.lines...)
}

// ctrlGuest plays the guest helper: hello, then a result echoing the
// task's text, then it waits for shutdown.
func ctrlGuest(c net.Conn, r *bufio.Reader) {
	defer c.Close()
	conn := ctrl.NewConn(struct {
		io.Reader
		io.Writer
	}{r, c})
	if conn.Send(&ctrl.Hello{Version: ctrl.Version}) != nil {
		return
	}
	for {
		m, err := conn.Recv()
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *ctrl.Task:
			conn.Send(&ctrl.Started{PID: 1})
			conn.Send(&ctrl.Result{Status: 0, Text: "did: " + m.Text})
		case *ctrl.Shutdown:
			return
		}
	}
}

// fakeMain is the re-executed fake cloud-hypervisor: it checks the
// command line, serves the API and the vsock, and exits on vmm.shutdown
// or SIGTERM.
func fakeMain(args []string) int {
	opts, err := parseCHArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	exit := make(chan int, 1)
	api := newFakeAPI(true)
	api.onVMMStop = func() { exit <- 0 }
	ln, err := net.Listen("unix", opts["api-socket"]["path"])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go http.Serve(ln, api)
	port := uint32(DefaultCtrlPort)
	for _, p := range strings.Fields(opts["cmdline"][""]) {
		if v, ok := strings.CutPrefix(p, "carbd.vsock="); ok {
			n, _ := strconv.ParseUint(v, 10, 32)
			port = uint32(n)
		}
	}
	vs, err := startFakeVsock(opts["vsock"]["socket"], port, ctrlGuest)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer vs.ln.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	select {
	case code := <-exit:
		return code
	case <-sig:
		return 0
	}
}

// chOptions lists each documented option carbd uses with the keys its
// value may have ("" for a plain value).
var chOptions = map[string][]string{
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

// parseCHArgs parses "--name value" pairs strictly into name -> key ->
// value.
func parseCHArgs(args []string) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	for i := 0; i < len(args); i += 2 {
		name, ok := strings.CutPrefix(args[i], "--")
		keys, known := chOptions[name]
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
	if cid, err := strconv.ParseUint(out["vsock"]["cid"], 10, 32); err != nil || cid < 3 {
		return nil, fmt.Errorf("--vsock cid %q", out["vsock"]["cid"])
	}
	b, err := os.ReadFile(out["kernel"][""])
	if err != nil || len(b) < 4 || string(b[:4]) != "\x7fELF" {
		return nil, fmt.Errorf("--kernel %s: not an ELF kernel", out["kernel"][""])
	}
	return out, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
