package chv

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/sandbox/chv/chvtest"
	"github.com/google/go-cmp/cmp"
)

func fullConfig() Config {
	return Config{
		APISocket: "/run/carbd/vm1/api.sock",
		Kernel:    "/img/vmlinux",
		Initramfs: "/img/initramfs.cpio.gz",
		Net: &Net{
			Tap:     "cbtap0",
			Addr:    netip.MustParsePrefix("10.77.0.2/30"),
			Gateway: netip.MustParseAddr("10.77.0.1"),
			DNS:     netip.MustParseAddr("10.77.0.1"),
		},
		FS:        &FS{Socket: "/run/carbd/vm1/vfs.sock"},
		Vsock:     Vsock{CID: 3, Socket: "/run/carbd/vm1/vsock.sock"},
		SerialLog: "/var/log/carbd/vm1.console",
	}
}

func TestArgsGolden(t *testing.T) {
	got, err := fullConfig().Args()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--api-socket", "path=/run/carbd/vm1/api.sock",
		"--kernel", "/img/vmlinux",
		"--initramfs", "/img/initramfs.cpio.gz",
		"--cmdline", "console=ttyS0 panic=-1 quiet carbd.ip=10.77.0.2/30 carbd.gw=10.77.0.1 carbd.dns=10.77.0.1 carbd.fs=work carbd.fsdir=/work carbd.vsock=1024",
		"--cpus", "boot=1",
		"--memory", "size=512M,shared=on",
		"--net", "tap=cbtap0,mac=52:54:00:ca:4b:01",
		"--fs", "tag=work,socket=/run/carbd/vm1/vfs.sock",
		"--vsock", "cid=3,socket=/run/carbd/vm1/vsock.sock",
		"--serial", "file=/var/log/carbd/vm1.console",
		"--console", "off",
		"--event-monitor", "fd=3",
		"--pvpanic",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}
	if _, err := chvtest.ParseArgs(got); err == nil || !strings.Contains(err.Error(), "--kernel /img/vmlinux: open") {
		// The fake's parser accepts the argv up to the kernel file,
		// which does not exist here.
		t.Errorf("the fake's parser: %v", err)
	}
}

func TestArgsGoldenNoFS(t *testing.T) {
	c := fullConfig()
	c.FS = nil
	c.CPUs, c.MemoryMiB = 2, 1024
	c.Vsock = Vsock{CID: 42, Socket: "/v.sock", Port: 5000}
	c.Verbose = true
	got, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--api-socket", "path=/run/carbd/vm1/api.sock",
		"--kernel", "/img/vmlinux",
		"--initramfs", "/img/initramfs.cpio.gz",
		"--cmdline", "console=ttyS0 panic=-1 carbd.ip=10.77.0.2/30 carbd.gw=10.77.0.1 carbd.dns=10.77.0.1 carbd.vsock=5000",
		"--cpus", "boot=2",
		"--memory", "size=1024M,shared=on",
		"--net", "tap=cbtap0,mac=52:54:00:ca:4b:01",
		"--vsock", "cid=42,socket=/v.sock",
		"--serial", "file=/var/log/carbd/vm1.console",
		"--console", "off",
		"--event-monitor", "fd=3",
		"--pvpanic",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("argv (-want +got):\n%s", diff)
	}
}

func TestValidateRejects(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"no api socket":   func(c *Config) { c.APISocket = "" },
		"comma in socket": func(c *Config) { c.APISocket = "/a,b" },
		"relative kernel": func(c *Config) { c.Kernel = "vmlinux" },
		"no initramfs":    func(c *Config) { c.Initramfs = "" },
		"no vsock":        func(c *Config) { c.Vsock = Vsock{} },
		"reserved cid":    func(c *Config) { c.Vsock.CID = 2 },
		"no serial log":   func(c *Config) { c.SerialLog = "" },
		"memory":          func(c *Config) { c.MemoryMiB = 8 },
		"cpus":            func(c *Config) { c.CPUs = 300 },
		"tap":             func(c *Config) { c.Net.Tap = "" },
		"no guest addr":   func(c *Config) { c.Net.Addr = netip.Prefix{} },
		"ipv4 as ip6":     func(c *Config) { c.Net.Addr6 = netip.MustParsePrefix("10.0.0.2/30") },
		"gw6 without ip6": func(c *Config) { c.Net.Gateway6 = netip.MustParseAddr("fd00::1") },
		"ipv4 gw6": func(c *Config) {
			c.Net.Addr6, c.Net.Gateway6 = netip.MustParsePrefix("fd00::2/64"), netip.MustParseAddr("10.0.0.1")
		},
		"fs socket":          func(c *Config) { c.FS.Socket = "rel" },
		"fs tag":             func(c *Config) { c.FS.Tag = "a=b" },
		"kernel param space": func(c *Config) { c.ExtraCmdline = []string{"a b"} },
	} {
		c := fullConfig()
		n, f := *c.Net, *c.FS
		c.Net, c.FS = &n, &f
		mut(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), "chv: config: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// serveFake serves api on a Unix socket and returns a client for it.
func serveFake(t *testing.T, api *chvtest.API) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := NewClient(sock)
	t.Cleanup(c.Close)
	return c
}

func TestClientAgainstFake(t *testing.T) {
	api := chvtest.NewAPI(true)
	c := serveFake(t, api)
	ctx := context.Background()

	p, err := c.Ping(ctx)
	if err != nil || p.Version != "53.0.0" || p.PID != int64(os.Getpid()) {
		t.Fatalf("ping: %+v %v", p, err)
	}
	state := func(want VMState, tree bool) {
		t.Helper()
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatalf("info: %v", err)
		}
		if info.State != want || info.MemoryActualSize != 536870912 || (info.DeviceTree["_fs0"].PCIBDF == "0000:00:03.0") != tree {
			t.Fatalf("info %+v, want state %s (device tree %v)", info, want, tree)
		}
	}
	state(StateRunning, true)
	if err := c.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	state(StatePaused, true)
	if err := c.Pause(ctx); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "status 500: Error from API: ") ||
		!strings.Contains(err.Error(), "InvalidStateTransition(Paused, Paused)") {
		t.Fatalf("pause a paused VM: %v, want ErrWrongState with the error chain", err)
	}
	if err := c.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Resume(ctx); !errors.Is(err, ErrWrongState) {
		t.Fatalf("resume a running VM: %v", err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// The VM is dropped and its config kept: Created, no device tree.
	state(StateCreated, false)
	for name, f := range map[string]func(context.Context) error{"shutdown": c.Shutdown, "power button": c.PowerButton, "pause": c.Pause, "resume": c.Resume} {
		if err := f(ctx); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "VM is not running") {
			t.Errorf("%s on a shut down VM: %v, want ErrWrongState", name, err)
		}
	}
	if err := c.ShutdownVMM(ctx); err != nil {
		t.Fatal(err)
	}

	want := []string{
		"GET /api/v1/vmm.ping",
		"GET /api/v1/vm.info",
		"PUT /api/v1/vm.pause",
		"GET /api/v1/vm.info",
		"PUT /api/v1/vm.pause",
		"PUT /api/v1/vm.resume",
		"PUT /api/v1/vm.resume",
		"PUT /api/v1/vm.shutdown",
		"GET /api/v1/vm.info",
		"PUT /api/v1/vm.pause",
		"PUT /api/v1/vm.power-button",
		"PUT /api/v1/vm.resume",
		"PUT /api/v1/vm.shutdown",
		"PUT /api/v1/vmm.shutdown",
	}
	got := api.Requests()
	// The four refused actions ran in map order: compare them as a set.
	sortRange(got, 9, 13)
	sortRange(want, 9, 13)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	if v := api.Violations(); len(v) > 0 {
		t.Errorf("contract violations: %q", v)
	}
}

func sortRange(s []string, i, j int) { sort.Strings(s[i:j]) }

func TestClientNotCreated(t *testing.T) {
	ctx := context.Background()
	for _, version := range []int{52, 53} {
		api := chvtest.NewAPI(false)
		api.Version = version
		c := serveFake(t, api)
		// vm.info: 404 from v53, a 500 naming "VM is not created" before.
		if _, err := c.Info(ctx); !errors.Is(err, ErrNotCreated) {
			t.Errorf("v%d: info: %v", version, err)
		}
		// No VM runs: the actions are refused as "not running" (500) in
		// every release.
		for name, f := range map[string]func(context.Context) error{"pause": c.Pause, "resume": c.Resume, "shutdown": c.Shutdown} {
			if err := f(ctx); !errors.Is(err, ErrWrongState) {
				t.Errorf("v%d: %s: %v", version, name, err)
			}
		}
		if err := c.ShutdownVMM(ctx); err != nil {
			t.Errorf("v%d: vmm.shutdown: %v", version, err)
		}
	}
}

// TestFakeAnswersAsCloudHypervisor: requests carbd must never send are
// recorded as violations and answered with the codes Cloud Hypervisor's
// code gives them, which a client keyed to the OpenAPI document (or to
// an older fake) would misread.
func TestFakeAnswersAsCloudHypervisor(t *testing.T) {
	api := chvtest.NewAPI(true)
	c := serveFake(t, api)
	do := func(method, path, body string, hdr map[string]string) (int, string) {
		req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, r := range []struct {
		method, path, body string
		status             int
		answer             string
	}{
		{"GET", "/api/v1/vm.pause", "", 400, `["Bad Request"]`},
		{"PUT", "/api/v1/vm.pause", `{"x":1}`, 400, `["Bad Request"]`},
		{"POST", "/api/v1/vm.resume", "", 400, ""},
		{"PUT", "/api/v1/vm.boom", "", 404, `["Not Found"]`},
		{"GET", "/api/v2/vmm.ping", "", 404, `["Not Found"]`},
		{"PUT", "/api/v1/vm.reboot", "", 400, `["Bad Request"]`},
	} {
		if got, answer := do(r.method, r.path, r.body, nil); got != r.status || answer != r.answer {
			t.Errorf("%s %s: %d %q, want %d %q", r.method, r.path, got, answer, r.status, r.answer)
		}
	}
	if v := api.Violations(); len(v) != 6 {
		t.Errorf("violations %q", v)
	}
	if st := api.State(); st != chvtest.StateRunning {
		t.Errorf("a refused request changed the state to %s", st)
	}
	// No header is required: a GET without Accept and with another Host
	// is served.
	if got, answer := do("GET", "/api/v1/vm.info", "", map[string]string{"Accept": "", "Host": "chv"}); got != 200 || !strings.Contains(answer, `"state":"Running"`) {
		t.Errorf("vm.info without Accept: %d %s", got, answer)
	}
	// vmm.shutdown answers 200 (the OpenAPI document says 204).
	if got, _ := do("PUT", "/api/v1/vmm.shutdown", "", nil); got != http.StatusOK {
		t.Errorf("vmm.shutdown: %d, want 200", got)
	}
	if v := api.Violations(); len(v) != 6 {
		t.Errorf("violations %q", v)
	}
}

func TestClientUnexpectedStatus(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "vmm.ping") {
			io.WriteString(w, `{"build_version":"x"}`) // no version: not the schema
			return
		}
		http.Error(w, "internal failure", http.StatusInternalServerError)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c := NewClient(sock)
	defer c.Close()
	if err := c.Pause(context.Background()); !errors.Is(err, ErrAPI) || !strings.Contains(err.Error(), "internal failure") {
		t.Errorf("500 without a state message: %v", err)
	}
	if _, err := c.Ping(context.Background()); !errors.Is(err, ErrAPI) {
		t.Errorf("ping without version: %v", err)
	}
	c2 := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	if _, err := c2.Ping(context.Background()); err == nil || !strings.HasPrefix(err.Error(), "chv: ") {
		t.Errorf("no socket: %v", err)
	}
}

func TestDialVsock(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "v.sock")
	echo := func(c net.Conn, r *bufio.Reader) {
		defer c.Close()
		c.Write([]byte("early bytes\n")) // right after OK, possibly in one segment
		line, _ := r.ReadString('\n')
		c.Write([]byte("echo: " + line))
	}
	fv, err := chvtest.StartVsock(sock, 1024, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer fv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	c, err := DialVsock(ctx, sock, 1024)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.HostPort != 1<<30+1 {
		t.Errorf("host port %d", c.HostPort)
	}
	c.Write([]byte("ping\n"))
	got, _ := io.ReadAll(c)
	if string(got) != "early bytes\necho: ping\n" {
		t.Errorf("stream %q", got)
	}
	if _, err := DialVsock(ctx, sock, 77); !errors.Is(err, ErrVsockRefused) {
		t.Errorf("port nobody listens on: %v, want ErrVsockRefused", err)
	}
	if diff := cmp.Diff([]string{"CONNECT 1024\n", "CONNECT 77\n"}, fv.Lines()); diff != "" {
		t.Errorf("handshake lines (-want +got):\n%s", diff)
	}
}

func TestDialVsockBadAnswers(t *testing.T) {
	for _, answer := range []string{"NOPE\n", "OK\n", "OK x\n", "OK 99999999999\n", "ok 5\n"} {
		sock := filepath.Join(t.TempDir(), "v.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			bufio.NewReader(c).ReadString('\n')
			io.WriteString(c, answer)
			c.Close()
		}()
		_, err = DialVsock(context.Background(), sock, 1024)
		if err == nil || errors.Is(err, ErrVsockRefused) || !strings.HasPrefix(err.Error(), "chv: vsock") {
			t.Errorf("answer %q: %v", answer, err)
		}
		ln.Close()
	}
	// A context that ends during the handshake.
	sock := filepath.Join(t.TempDir(), "v.sock")
	ln, _ := net.Listen("unix", sock)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c) // never answers
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := DialVsock(ctx, sock, 1024); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("silent peer: %v", err)
	}
}

// TestStartAgainstFakeBinary runs Start on the re-executed fake
// cloud-hypervisor: it parses the argv Args built as the documentation
// says, serves the API and the hybrid vsock; the control protocol runs
// over the vsock and Stop ends the process through vmm.shutdown.
func TestStartAgainstFakeBinary(t *testing.T) {
	t.Setenv(chvtest.EnvFake, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := fakeConfig(t, self, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	vm, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Kill() })
	if vm.Version != "53.0.0" {
		t.Errorf("version %q", vm.Version)
	}
	if err := vm.API.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.API.Resume(ctx); err != nil {
		t.Fatal(err)
	}

	vc, err := vm.DialCtrl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := ctrl.NewConn(vc)
	if _, err := conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(&ctrl.Task{ID: "c1", Text: "over vsock", Argv: []string{"agent"}}); err != nil {
		t.Fatal(err)
	}
	var res *ctrl.Result
	for res == nil {
		m, err := conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		res, _ = m.(*ctrl.Result)
	}
	if res.Text != "did: over vsock" {
		t.Errorf("result %+v", res)
	}
	conn.Send(&ctrl.Shutdown{})
	conn.Close()

	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("exit: %v (%s)", err, vm.Output())
	}
	if vm.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("the fake exited %d, not through vmm.shutdown: %s", vm.cmd.ProcessState.ExitCode(), vm.Output())
	}
}

func TestStartRefusesBzImage(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinuz")
	os.WriteFile(k, []byte("MZ\x00\x00bzImage"), 0o644)
	cfg := fullConfig()
	cfg.Kernel = k
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "not an ELF vmlinux") {
		t.Fatalf("Start with a bzImage: %v", err)
	}
	// An ELF without the PVH note (the test binary).
	self, _ := os.Executable()
	cfg.Kernel = self
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "has no PVH entry note") {
		t.Fatalf("Start with an ELF without PVH: %v", err)
	}
}

// fakeConfig is fullConfig for the re-executed fake in dir: the test
// binary as cloud-hypervisor, a PVH kernel stand-in.
func fakeConfig(t *testing.T, self, dir string) Config {
	t.Helper()
	cfg := fullConfig()
	cfg.Binary = self
	cfg.Kernel = filepath.Join(dir, "vmlinux")
	if err := chvtest.WritePVHKernel(cfg.Kernel); err != nil {
		t.Fatal(err)
	}
	cfg.Initramfs = filepath.Join(dir, "initramfs.cpio.gz")
	os.WriteFile(cfg.Initramfs, []byte("x"), 0o644)
	cfg.APISocket = filepath.Join(dir, "api.sock")
	cfg.Vsock.Socket = filepath.Join(dir, "vsock.sock")
	cfg.FS.Socket = filepath.Join(dir, "vfs.sock")
	cfg.SerialLog = filepath.Join(dir, "serial.log")
	return cfg
}

func TestStartReportsExit(t *testing.T) {
	// The fake refuses a command line without --vsock... which Args never
	// builds; an extra unknown argument stands in for a refused option.
	t.Setenv(chvtest.EnvFake, "1")
	self, _ := os.Executable()
	cfg := fakeConfig(t, self, t.TempDir())
	cfg.ExtraArgs = []string{"--bogus", "1"}
	_, err := Start(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), `unexpected argument "--bogus"`) {
		t.Fatalf("Start: %v, want the VMM's message", err)
	}
}

// TestClientStatusCodes: how the client reads each answer real releases
// give (the codes of vmm/src/api/http, the bodies of v40's text and
// v48's JSON error chain).
func TestClientStatusCodes(t *testing.T) {
	var status int
	var body string
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c := NewClient(sock)
	defer c.Close()
	for _, tc := range []struct {
		status int
		body   string
		want   error // nil: success
	}{
		{204, "", nil},
		{200, "", nil}, // vmm.shutdown's real answer
		{500, `["Error from API","The VM could not shutdown","VM is not running"]`, ErrWrongState},
		{500, "VM is not running", ErrWrongState}, // before v48: text
		{500, "VM is not booted", ErrWrongState},  // before v41
		{500, `["Error from API","The VM could not be paused","Cannot pause VM","Failed to pause migratable component","Invalid transition: InvalidStateTransition(Paused, Paused)"]`, ErrWrongState},
		{500, `["Error from API","The VM info is not available","VM is not created"]`, ErrNotCreated}, // before v53
		{404, `["Error from API","The VM info is not available","VM is not created"]`, ErrNotCreated}, // v53
		{500, `["Error from API","The VM could not shutdown","Error shutting down VM"]`, ErrAPI},
		{405, "", ErrAPI}, // never sent by Cloud Hypervisor: not read as a state
		{400, `["Bad Request"]`, ErrAPI},
	} {
		status, body = tc.status, tc.body
		err := c.Shutdown(context.Background())
		if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%d %s: %v, want %v", tc.status, tc.body, err, tc.want)
		}
		for _, other := range []error{ErrWrongState, ErrNotCreated, ErrAPI} {
			if other != tc.want && errors.Is(err, other) {
				t.Errorf("%d %s: %v is also %v", tc.status, tc.body, err, other)
			}
		}
	}
}

// TestCmdlineIPv6: the guest's IPv6 address and route go to /init as
// carbd.ip6 and carbd.gw6, after the IPv4 parameters.
func TestCmdlineIPv6(t *testing.T) {
	c := fullConfig()
	n := *c.Net
	n.Addr6, n.Gateway6 = netip.MustParsePrefix("fd00:cb:0:7::2/64"), netip.MustParseAddr("fd00:cb:0:7::1")
	c.Net = &n
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(c.Cmdline(), " ")
	if !strings.Contains(got, " carbd.ip6=fd00:cb:0:7::2/64 carbd.gw6=fd00:cb:0:7::1 ") {
		t.Errorf("cmdline %q lacks carbd.ip6 and carbd.gw6", got)
	}
}
