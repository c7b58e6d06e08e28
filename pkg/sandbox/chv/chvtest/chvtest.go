// Package chvtest is a fake Cloud Hypervisor for tests of code that
// launches and drives it (pkg/sandbox/chv, the daemon's cloud-hypervisor
// backend). Cloud Hypervisor cannot be installed on carbd's development
// machines, so the fake models what its code does, release v53 (read at
// v53.0 and at commit ae44c297 of its main branch; docs/vm.md lists the
// files and functions), not only what its documents say, and records
// every request carbd should not make:
//
//   - the command line (ParseCommandLine): clap's rules for the options
//     carbd uses (repeatable --net and --fs, with one or more values; any
//     other option at most once), option_parser's key=value lists (quotes,
//     brackets, unknown keys refused, the last of a repeated key wins, an
//     empty value unsets), the values as vmm/src/config.rs converts and
//     validates them (sizes, toggles, MACs, numbers, queue counts and
//     sizes, the fs tag's 36 bytes, shared memory for --fs, ip with mask,
//     vsock cid), the bare --api-socket PATH, and a kernel Vm::load_kernel
//     would load (an ELF with the PVH note, or a bzImage);
//   - the REST API on the --api-socket (API): the codes, error bodies and
//     states of the VMM's handlers (see API);
//   - the hybrid vsock on the --vsock socket (Vsock): "CONNECT <port>\n"
//     read exactly, "OK <hostport>\n" when the guest listens on the port,
//     the connection closed otherwise;
//   - the event monitor (--event-monitor fd=N or path=P): the records
//     event_monitor writes (pretty JSON, a blank line after each) for
//     boot, pause, resume, shutdown, reset and, with --pvpanic, a guest
//     panic.
//
// Main runs the fake as a process: a test binary re-executes itself with
// EnvFake=1 and calls Main from TestMain (or an init function). The guest
// behind the vsock is the caller's GuestFunc. As Cloud Hypervisor does,
// the process exits when the guest powers off (Guest.PowerOff), on
// vmm.shutdown and on SIGTERM, stays up after vm.shutdown, and reboots
// the VM when the guest panics (Guest.Panic; EnvBoot=panic for a guest
// that panics while booting). With EnvLog set, it appends what it saw to
// that file as JSON lines (ReadLog): its argv, every API request,
// violations, vsock handshakes, events, the guest's records and how it
// exited.
//
// Pure Go; it needs nothing but Unix sockets.
package chvtest

import (
	"bufio"
	"encoding/json"
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
	"time"

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

// endpoints maps each endpoint carbd may call to its method; the VMM's
// other routes (HTTP_ROUTES in vmm/src/api/http/mod.rs: vm.boot,
// vm.create, vm.add-*, ...) exist in Cloud Hypervisor but carbd never
// calls them, so a call to one is recorded as a violation (and answered
// as the real VMM would for the request without a body: 400).
var endpoints = map[string]string{
	"vmm.ping":        http.MethodGet,
	"vmm.shutdown":    http.MethodPut,
	"vm.info":         http.MethodGet,
	"vm.pause":        http.MethodPut,
	"vm.resume":       http.MethodPut,
	"vm.shutdown":     http.MethodPut,
	"vm.power-button": http.MethodPut,
}

// otherRoutes are Cloud Hypervisor's routes carbd does not use (they
// exist: 400 rather than 404 for a request carbd should not send).
var otherRoutes = map[string]bool{
	"vm.add-device": true, "vm.add-user-device": true, "vm.add-disk": true, "vm.add-fs": true,
	"vm.add-generic-vhost-user": true, "vm.add-net": true, "vm.add-pmem": true, "vm.add-vdpa": true,
	"vm.add-vsock": true, "vm.boot": true, "vm.counters": true, "vm.create": true, "vm.delete": true,
	"vm.reboot": true, "vm.receive-migration": true, "vm.remove-device": true, "vm.resize": true,
	"vm.resize-disk": true, "vm.resize-zone": true, "vm.restore": true, "vm.send-migration": true,
	"vm.snapshot": true, "vm.nmi": true,
}

// DefaultVersion is the Cloud Hypervisor release the fake models.
const DefaultVersion = 53

// API is the REST API as Cloud Hypervisor's code answers it (not only as
// its OpenAPI document says; docs/vm.md lists the sources):
//
//   - routes: an unknown path is 404 ["Not Found"]; a method a route
//     does not take, or a body where it takes none, is 400;
//   - vmm.ping 200 with JSON; vmm.shutdown 200 (the document says 204),
//     after which the VM is deleted and the process exits;
//   - vm.pause, vm.resume, vm.shutdown, vm.power-button 204; refused
//     actions are 500 with the error chain as a JSON array of strings
//     (v48 on): "VM is not running" once no VM runs,
//     "InvalidStateTransition(Paused, Paused)" for pausing a paused VM
//     and "(Running, Running)" for resuming a running one;
//   - vm.info 200; with no VM created 404 from v53, 500 before; after
//     vm.shutdown the state is Created (the VM is dropped, its config
//     kept) and there is no device tree.
//
// Nothing is required of the headers (micro_http reads the request line,
// Content-Length and Transfer-Encoding). Requests carbd should never send
// (another endpoint, a wrong method, a body) are recorded as violations,
// and answered as Cloud Hypervisor answers them. Safe for concurrent use.
type API struct {
	// Version is the release modelled (default DefaultVersion): it
	// decides the code of "not created" (404 from 53, 500 before).
	Version int

	mu         sync.Mutex
	created    bool // a VM config exists
	running    bool // a VM exists (booted): Running or Paused
	paused     bool
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
	// OnEvent, when set, sees the event-monitor events the requests
	// cause (source, event), in order, with the lock held.
	OnEvent func(source, event string)
	// OnPowerButton, when set, runs (in its own goroutine) after a
	// vm.power-button press on a running VM is answered.
	OnPowerButton func()
}

// NewAPI returns the API of a VMM whose VM is created and running, or
// of one with no VM (created false).
func NewAPI(created bool) *API {
	return &API{created: created, running: created}
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

// State is the VM's state as vm.info reports it ("" with no VM).
func (a *API) State() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state()
}

func (a *API) state() string {
	switch {
	case !a.created:
		return ""
	case !a.running:
		return StateCreated
	case a.paused:
		return StatePaused
	}
	return StateRunning
}

func (a *API) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	a.violations = append(a.violations, msg)
	if a.OnViolation != nil {
		a.OnViolation(msg)
	}
}

func (a *API) event(source, ev string) {
	if a.OnEvent != nil {
		a.OnEvent(source, ev)
	}
}

func (a *API) changed() {
	if a.OnStateChange != nil {
		a.OnStateChange(a.state())
	}
}

// GuestReset models a guest reset (a kernel panic under panic=-1, a
// reboot): Vmm::vm_reboot shuts the VM down and boots a new one from the
// same config, with the events "vm rebooting" and "vm rebooted". It
// reports whether a VM was there to reset.
func (a *API) GuestReset() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running {
		return false
	}
	a.event("vm", "rebooting")
	a.paused = false
	a.event("vm", "rebooted")
	a.changed()
	return true
}

// GuestPowerOff models the guest powering off: the VMM shuts the VM
// down and exits (Vmm::vmm_shutdown: "vm shutdown", "vm deleted", "vmm
// shutdown").
func (a *API) GuestPowerOff() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deleteVM()
}

// deleteVM is Vmm::vmm_shutdown's vm_delete with its events.
func (a *API) deleteVM() {
	if a.running {
		a.running, a.paused = false, false
		a.event("vm", "shutdown")
	}
	if a.created {
		a.created = false
		a.event("vm", "deleted")
	}
	a.event("vmm", "shutdown")
	a.changed()
}

// apiError writes Cloud Hypervisor's error response: the status and the
// error chain's messages as a JSON array (error_response).
func apiError(w http.ResponseWriter, status int, chain ...string) {
	b, _ := json.Marshal(chain)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(b)
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
	w.Header().Set("Server", "Cloud Hypervisor API")
	if r.ProtoMajor != 1 {
		a.violate("protocol %s: micro_http speaks HTTP/1.0 and 1.1", r.Proto)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	ep, ok := strings.CutPrefix(r.URL.Path, APIPrefix)
	method, known := endpoints[ep]
	if !ok || (!known && !otherRoutes[ep]) {
		a.violate("unknown endpoint %s", r.URL.Path)
		apiError(w, http.StatusNotFound, "Not Found")
		return
	}
	if !known {
		a.violate("%s %s: an endpoint carbd does not use", r.Method, ep)
		apiError(w, http.StatusBadRequest, "Bad Request")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodPut {
		a.violate("%s %s, want %s", r.Method, ep, method)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if r.Method != method {
		a.violate("%s %s, want %s", r.Method, ep, method)
		apiError(w, http.StatusBadRequest, "Bad Request")
		return
	}
	body, _ := io.ReadAll(r.Body)
	if len(body) != 0 {
		a.violate("%s takes no request body", ep)
		apiError(w, http.StatusBadRequest, "Bad Request")
		return
	}
	notRunning := func(what string) {
		apiError(w, http.StatusInternalServerError, "Error from API", what, "VM is not running")
	}
	switch ep {
	case "vmm.ping":
		writeJSON(w, map[string]any{"build_version": fmt.Sprintf("v%d.0-fake", a.version()), "version": fmt.Sprintf("%d.0.0", a.version()),
			"pid": os.Getpid(), "features": []string{"kvm"}})
	case "vmm.shutdown":
		a.deleteVM()
		w.WriteHeader(http.StatusOK)
		if a.OnVMMShutdown != nil {
			go a.OnVMMShutdown()
		}
	case "vm.info":
		if !a.created {
			status := http.StatusNotFound
			if a.version() < 53 {
				status = http.StatusInternalServerError
			}
			apiError(w, status, "Error from API", "The VM info is not available", "VM is not created")
			return
		}
		info := map[string]any{
			"config":             map[string]any{"payload": map[string]any{"kernel": "/k"}, "memory": map[string]any{"size": 536870912, "shared": true}},
			"state":              a.state(),
			"memory_actual_size": 536870912,
		}
		if a.running {
			info["device_tree"] = map[string]any{"_fs0": map[string]any{"id": "_fs0", "children": []string{}, "pci_bdf": "0000:00:03.0"}}
		}
		writeJSON(w, info)
	case "vm.pause":
		switch {
		case !a.running:
			notRunning("The VM could not be paused")
		case a.paused:
			apiError(w, http.StatusInternalServerError, "Error from API", "The VM could not be paused", "Cannot pause VM",
				"Failed to pause migratable component", "Invalid transition: InvalidStateTransition(Paused, Paused)")
		default:
			a.event("vm", "pausing")
			a.paused = true
			a.event("vm", "paused")
			a.changed()
			w.WriteHeader(http.StatusNoContent)
		}
	case "vm.resume":
		switch {
		case !a.running:
			notRunning("The VM could not resume")
		case !a.paused:
			apiError(w, http.StatusInternalServerError, "Error from API", "The VM could not resume", "Cannot resume VM",
				"Failed to resume migratable component", "Invalid transition: InvalidStateTransition(Running, Running)")
		default:
			a.event("vm", "resuming")
			a.paused = false
			a.event("vm", "resumed")
			a.changed()
			w.WriteHeader(http.StatusNoContent)
		}
	case "vm.shutdown":
		if !a.running {
			notRunning("The VM could not shutdown")
			return
		}
		a.running, a.paused = false, false
		a.event("vm", "shutdown")
		a.changed()
		w.WriteHeader(http.StatusNoContent)
	case "vm.power-button":
		if !a.running {
			notRunning("Error triggering power button")
			return
		}
		w.WriteHeader(http.StatusNoContent)
		if a.OnPowerButton != nil && !a.paused {
			go a.OnPowerButton()
		}
	}
}

func (a *API) version() int {
	if a.Version == 0 {
		return DefaultVersion
	}
	return a.Version
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
	// Guarded by mu once the listener runs.
	OnLine func(line string)
	// Listening, when set, says whether the guest listens on its port
	// now; when it does not, a CONNECT to it is closed unanswered.
	// Guarded by mu once the listener runs.
	Listening func() bool
	mu        sync.Mutex
	lines     []string
	nextPort  uint32
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
	onLine, listeningFn := v.OnLine, v.Listening
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
	listening := listeningFn == nil || listeningFn()
	if !ok || perr != nil || strconv.FormatUint(port, 10) != ps || uint32(port) != v.guestPort || !listening {
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

// Guest is the guest side of one control connection.
type Guest struct {
	// Conn is the control channel (the host's end is its ctrl.Conn).
	Conn *ctrl.Conn
	// Opts is the VMM's parsed command line.
	Opts Options
	// API is the VMM's API (its state says whether the VM is paused).
	API   *API
	rec   func(kind string, v any)
	off   func()
	reset func(panicked bool)
}

// Record appends {kind: v} to the fake's log.
func (g *Guest) Record(kind string, v any) { g.rec(kind, v) }

// PowerOff ends the VMM as a guest power-off does: the VM is shut down
// and deleted ("vm shutdown", "vm deleted", "vmm shutdown") and the
// process exits 0.
func (g *Guest) PowerOff() { g.off() }

// Panic plays a kernel panic under panic=-1: the pvpanic device reports
// it ("guest panic", with --pvpanic), then the guest resets and Cloud
// Hypervisor reboots the VM ("vm rebooting", "vm rebooted"). The fake
// keeps the control connection open (the worst case: only the events
// tell the host the guest it talked to is gone) and the VMM running.
func (g *Guest) Panic() { g.reset(true) }

// GuestFunc plays the guest on a control connection.
type GuestFunc func(*Guest)

// EchoGuest says hello, answers the task with a result echoing its text
// ("did: TEXT"), and returns at the host's shutdown or the end of the
// stream, leaving the VM running. A task text "panic" makes it panic
// after its hello instead (Guest.Panic) and wait for the stream's end.
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
			if m.Text == "panic" {
				g.Panic()
				continue
			}
			g.Conn.Send(&ctrl.Started{PID: 1})
			g.Conn.Send(&ctrl.Result{Status: 0, Text: "did: " + m.Text})
		case *ctrl.Shutdown:
			return
		}
	}
}

// EnvBoot, set to "panic" in the fake's environment, makes its guest
// panic while it boots, before anything listens on the vsock, over and
// over (each reboot panics again), as a guest whose kernel or /init
// crashes does under panic=-1.
const EnvBoot = "CARBD_FAKE_CHV_BOOT"

// eventWriter writes event-monitor records as Cloud Hypervisor does
// (event_log and start_event_monitor_thread): pretty-printed JSON, then
// a blank line.
type eventWriter struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (e *eventWriter) write(source, event string, props map[string]string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	d := time.Since(e.start)
	var p any
	if props != nil {
		p = props
	}
	b, _ := json.MarshalIndent(map[string]any{
		"timestamp":  map[string]any{"secs": uint64(d / time.Second), "nanos": uint32(d % time.Second)},
		"source":     source,
		"event":      event,
		"properties": p,
	}, "", "  ")
	e.w.Write(append(b, '\n', '\n'))
}

// openEventMonitor opens --event-monitor's target: fd=N (inherited) or
// path=P (created, truncated).
func openEventMonitor(spec string) (io.WriteCloser, error) {
	if v, ok := strings.CutPrefix(spec, "fd="); ok {
		fd, err := strconv.Atoi(v)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), "event-monitor")
		if _, err := f.Stat(); err != nil {
			return nil, fmt.Errorf("event monitor fd %d: %w", fd, err)
		}
		return f, nil
	}
	return os.OpenFile(strings.TrimPrefix(spec, "path="), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
}

// Main is the fake cloud-hypervisor process: it parses args, serves the
// API and the vsock with guest behind it, writes the event monitor, and
// returns the exit status.
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
	cl, err := ParseCommandLine(args)
	if err != nil {
		rec("violation", "command line: "+err.Error())
		rec("exit", "refused its command line")
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	opts := cl.Opts
	var events *eventWriter
	if cl.EventMonitor != "" {
		w, err := openEventMonitor(cl.EventMonitor)
		if err != nil {
			rec("violation", "--event-monitor: "+err.Error())
			fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
			return 1
		}
		defer w.Close()
		events = &eventWriter{w: w, start: time.Now()}
	}
	_, pvpanic := opts["pvpanic"]
	exit := make(chan string, 3)
	api := NewAPI(true)
	api.OnRequest = func(line string) { rec("request", line) }
	api.OnViolation = func(msg string) { rec("violation", msg) }
	api.OnVMMShutdown = func() { exit <- "vmm.shutdown" }
	api.OnEvent = func(source, event string) {
		rec("event", source+" "+event)
		events.write(source, event, nil)
	}
	ln, err := net.Listen("unix", cl.APISocket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	defer ln.Close()
	// The VM on the command line is created and booted (vm_create,
	// vm_boot) before the API serves.
	events.write("vm", "booting", nil)
	events.write("vm", "booted", nil)
	go http.Serve(ln, api)
	port := uint32(DefaultCtrlPort)
	if v, ok := opts.Cmdline()["carbd.vsock"]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			rec("violation", "carbd.vsock="+v)
		}
		port = uint32(n)
	}
	reset := func(panicked bool) {
		if panicked && pvpanic {
			rec("event", "guest panic")
			events.write("guest", "panic", map[string]string{"event": "panic"})
		}
		api.GuestReset()
	}
	bootPanic := os.Getenv(EnvBoot) == "panic"
	if bootPanic {
		// A crash loop: each boot panics again, the first some time
		// after the VMM started (the kernel boots for a while).
		go func() {
			time.Sleep(300 * time.Millisecond)
			for {
				reset(true)
				time.Sleep(200 * time.Millisecond)
			}
		}()
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
			off: func() {
				offOnce.Do(func() {
					api.GuestPowerOff()
					exit <- "guest power-off"
				})
			},
			reset: reset,
		}
		guest(g)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake cloud-hypervisor:", err)
		return 1
	}
	vs.mu.Lock() // the listener is already accepting
	vs.OnLine = func(line string) { rec("vsock", line) }
	// Nothing listens in a guest that never finishes booting.
	vs.Listening = func() bool { return !bootPanic }
	vs.mu.Unlock()
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
	Events     []string // the event-monitor events, "source event"
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
			case "request", "violation", "vsock", "exit", "event":
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
				case "event":
					l.Events = append(l.Events, s)
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
