package qemu

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/vmimage"
)

// requireVM skips without root and fails in CI when QEMU or virtiofsd is
// missing.
func requireVM(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireTool(t, DefaultBinary)
	if _, err := os.Stat(fileev.DefaultVirtiofsd); err != nil {
		if os.Getenv("CARBD_CI") != "" {
			t.Fatalf("%s missing but CI must have it (qemu-system-common)", fileev.DefaultVirtiofsd)
		}
		t.Skipf("skipping: %s is not installed (run make setup)", fileev.DefaultVirtiofsd)
	}
}

var buildOnce struct {
	sync.Once
	img vmimage.Image
	err error
}

// image builds the guest image with `make -C vmimage` (incremental: the
// kernel package is downloaded once) and returns it.
func image(t *testing.T) vmimage.Image {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			buildOnce.err = err
			return
		}
		for !fileExists(filepath.Join(dir, "go.mod")) {
			if dir == "/" {
				buildOnce.err = errors.New("no go.mod above the test")
				return
			}
			dir = filepath.Dir(dir)
		}
		// Other packages' tests build the image too (pkg/daemon): one
		// build at a time.
		lock, err := os.OpenFile(filepath.Join(os.TempDir(), "carbd-vmimage-build.lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			buildOnce.err = err
			return
		}
		defer lock.Close()
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			buildOnce.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		goBin := testutil.GoTool()
		out, err := exec.CommandContext(ctx, "make", "-C", filepath.Join(dir, "vmimage"), "GO="+goBin).CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("make -C vmimage: %v\n%s", err, out)
			return
		}
		buildOnce.img, buildOnce.err = vmimage.Find(filepath.Join(dir, "vmimage", "out"))
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.img
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// subnet returns a /30 for a tap, derived from its unique name: .1 is
// the host, .2 the guest.
func subnet(name string) (host, guest netip.Prefix) {
	h := fnv.New32a()
	h.Write([]byte(name))
	v := h.Sum32()
	base := netip.AddrFrom4([4]byte{10, 201, byte(v >> 8), byte(v) &^ 3})
	return netip.PrefixFrom(base.Next(), 30), netip.PrefixFrom(base.Next().Next(), 30)
}

// recv receives one message or fails the test after d.
func recv(t *testing.T, vm *VM, d time.Duration) ctrl.Message {
	t.Helper()
	type r struct {
		m   ctrl.Message
		err error
	}
	ch := make(chan r, 1)
	go func() {
		m, err := vm.Ctrl.Recv()
		ch <- r{m, err}
	}()
	select {
	case x := <-ch:
		if x.err != nil {
			con, _ := vm.Console()
			t.Fatalf("recv: %v\nconsole:\n%s\nqemu: %s", x.err, con, vm.Output())
		}
		return x.m
	case <-time.After(d):
		vm.Stop() // closes the channel: the goroutine ends
		con, _ := vm.Console()
		t.Fatalf("no message in %v\nconsole:\n%s\nqemu: %s", d, con, vm.Output())
	}
	return nil
}

// TestBootRunTask is the slow, real test: the guest image boots under
// QEMU (KVM where a stock guest runs under it, TCG here) with a tap, a
// virtio-fs export of a temporary directory and the control port; the
// task writes into the export and fetches a page from a server on the
// host side of the tap; the guest powers off at the end.
func TestBootRunTask(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: boots a VM")
	}
	requireVM(t)
	img := image(t)
	dir := t.TempDir()
	shared := filepath.Join(dir, "work")
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}

	// The tap and the host's HTTP server on it.
	tapName := testutil.UniqueName("cbq")
	hostAddr, guestAddr := subnet(tapName)
	tap, err := CreateTap(tapName, hostAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tap.Delete(); err != nil {
			t.Error(err)
		}
	})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(hostAddr.Addr(), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	token := fmt.Sprintf("tok%d", time.Now().UnixNano())
	var mu sync.Mutex
	var seen []string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.RequestURI()+" from "+r.RemoteAddr)
		mu.Unlock()
		io.WriteString(w, "pong "+r.URL.Query().Get("token"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// virtiofsd, one per boot.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	vfsSock := filepath.Join(dir, "vfs.sock")
	vfs, err := fileev.StartVirtiofsd(ctx, fileev.VirtiofsdConfig{SocketPath: vfsSock, Source: shared})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vfs.Stop() })

	// The per-boot overlay: a CA certificate in the image's slot.
	initrd := filepath.Join(dir, "initrd.img")
	const fakeCA = "-----BEGIN CERTIFICATE-----\nQ0FSQkQtVEVTVC1DQQ==\n-----END CERTIFICATE-----\n"
	if err := vmimage.WithOverlay(initrd, img.Initramfs, []vmimage.File{{Path: vmimage.CAPath, Data: []byte(fakeCA)}}); err != nil {
		t.Fatal(err)
	}

	cfg := Config{
		Kernel:     img.Kernel,
		Initrd:     initrd,
		CtrlSocket: filepath.Join(dir, "ctl.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"),
		Net:        &Net{Tap: tapName, Addr: guestAddr, Gateway: hostAddr.Addr(), DNS: hostAddr.Addr()},
		FS:         &FS{Socket: vfsSock},
	}
	vm, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Stop() })
	t.Logf("accel %s: %s", vm.Accel, vm.AccelReason)

	m := recv(t, vm, 5*time.Minute)
	hello, ok := m.(*ctrl.Hello)
	if !ok || hello.Version != ctrl.Version {
		t.Fatalf("first message %#v, want hello version %d", m, ctrl.Version)
	}
	bootTime := time.Since(vm.Started)
	t.Logf("boot time (launch to hello): %v", bootTime.Round(time.Millisecond))

	url := fmt.Sprintf("http://%s/probe?token=%s", ln.Addr(), token)
	script := `set -e
echo "$CARBD_TASK" > from-guest.txt
curl -sS --max-time 60 -o page.txt "` + url + `"
grep -c CARBD-TEST-CA /etc/ssl/certs/ca-certificates.crt || base64 -d /etc/ssl/certs/ca-certificates.crt 2>/dev/null | true
sed -n 2p /etc/ssl/certs/ca-certificates.crt
echo "guest done"
printf 'task complete' > "$CARBD_RESULT"`
	task := &ctrl.Task{ID: "boot-1", Text: "write the task and fetch " + token, Argv: []string{"sh", "-c", script}}
	if err := vm.Ctrl.Send(task); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	var result *ctrl.Result
	started := false
	for result == nil {
		switch m := recv(t, vm, 3*time.Minute).(type) {
		case *ctrl.Started:
			started = m.PID > 0
		case *ctrl.Output:
			if m.Stream == ctrl.Stdout {
				stdout.Write(m.Data)
			} else {
				stderr.Write(m.Data)
			}
		case *ctrl.Result:
			result = m
		default:
			t.Fatalf("unexpected %s", m.Type())
		}
	}
	if !started {
		t.Error("no started message")
	}
	if result.Status != 0 || result.Text != "task complete" {
		t.Fatalf("result %+v\nstdout:\n%s\nstderr:\n%s", result, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "Q0FSQkQtVEVTVC1DQQ==") || !strings.HasSuffix(stdout.String(), "guest done\n") {
		t.Errorf("stdout %q: the CA overlay is not the guest's bundle", stdout.String())
	}
	if err := vm.Ctrl.Send(&ctrl.Shutdown{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.Done():
	case <-time.After(2 * time.Minute):
		con, _ := vm.Console()
		t.Fatalf("the VM did not power off\nconsole:\n%s", con)
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("qemu exit: %v", err)
	}
	t.Logf("launch to power-off: %v", time.Since(vm.Started).Round(time.Millisecond))

	// What the guest did, seen from the host.
	if b, err := os.ReadFile(filepath.Join(shared, "from-guest.txt")); err != nil || string(b) != task.Text+"\n" {
		t.Errorf("shared file: %q %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(shared, "page.txt")); err != nil || string(b) != "pong "+token {
		t.Errorf("fetched page in the shared directory: %q %v", b, err)
	}
	mu.Lock()
	defer mu.Unlock()
	wantReq := "GET /probe?token=" + token + " from " + guestAddr.Addr().String() + ":"
	if len(seen) != 1 || !strings.HasPrefix(seen[0], wantReq) {
		t.Errorf("the server saw %q, want one %q...", seen, wantReq)
	}
}

// TestStopEndsQEMU stops a VM that is still booting.
func TestStopEndsQEMU(t *testing.T) {
	requireVM(t)
	img := image(t)
	dir := t.TempDir()
	vm, err := Start(context.Background(), Config{
		Accel:      TCG,
		Kernel:     img.Kernel,
		Initrd:     img.Initramfs,
		CtrlSocket: filepath.Join(dir, "ctl.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"),
		StopGrace:  10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Stop() })
	pid := vm.PID()
	if err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-vm.Done():
	default:
		t.Fatal("Stop returned before QEMU exited")
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("Wait after Stop: %v", err)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("qemu (pid %d) still exists", pid)
	}
	if _, err := vm.Ctrl.Recv(); err == nil {
		t.Error("the control channel is still open")
	}
	if err := vm.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestStartReportsQEMUFailure(t *testing.T) {
	requireVM(t)
	img := image(t)
	dir := t.TempDir()
	cfg := Config{
		Accel:      TCG,
		Kernel:     filepath.Join(dir, "missing-kernel"),
		Initrd:     img.Initramfs,
		CtrlSocket: filepath.Join(dir, "ctl.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"),
	}
	if _, err := Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "missing-kernel") {
		t.Fatalf("Start with a missing kernel: %v, want an error naming it", err)
	}
	// QEMU refuses its command line: the error, from Start or from Wait,
	// carries QEMU's message.
	cfg.Kernel = img.Kernel
	cfg.ExtraArgs = []string{"-device", "no-such-device"}
	vm, err := Start(context.Background(), cfg)
	if err == nil {
		t.Cleanup(func() { vm.Stop() })
		err = vm.Wait()
	}
	if err == nil || !strings.Contains(err.Error(), "no-such-device") {
		t.Fatalf("QEMU failure: %v, want its message", err)
	}
}

func TestProbeAccel(t *testing.T) {
	a, why := ProbeAccel()
	t.Logf("%s: %s", a, why)
	if a != KVM && a != TCG {
		t.Fatalf("accel %q", a)
	}
	// The decision follows the host's modules.
	pvm := dirExists("/sys/module/kvm_pvm") && !dirExists("/sys/module/kvm_intel") && !dirExists("/sys/module/kvm_amd")
	if pvm && a != TCG {
		t.Errorf("PVM host: %s, want tcg", a)
	}
	// On a fake /sys/module with only kvm_pvm, the answer is TCG.
	old := SysModule
	defer func() { SysModule = old }()
	SysModule = t.TempDir()
	os.Mkdir(filepath.Join(SysModule, "kvm_pvm"), 0o755)
	if a, why := ProbeAccel(); a != TCG || !strings.Contains(why, "PVM") {
		t.Errorf("fake PVM host: %s (%s)", a, why)
	}
}

func TestCreateTap(t *testing.T) {
	testutil.RequireRoot(t)
	name := testutil.UniqueName("cbq")
	host, _ := subnet(name)
	tap, err := CreateTap(name, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Delete() })
	ifi, err := net.InterfaceByName(name)
	if err != nil || ifi.Index != tap.Index {
		t.Fatalf("interface %s: %v %v", name, ifi, err)
	}
	if b, err := os.ReadFile("/sys/class/net/" + name + "/tun_flags"); err != nil || !strings.Contains(string(b), "0x") {
		t.Errorf("tun_flags %q %v", b, err)
	}
	addrs, _ := ifi.Addrs()
	if len(addrs) != 1 || addrs[0].String() != host.String() {
		t.Errorf("addresses %v, want %v", addrs, host)
	}
	if _, err := CreateTap(name, netip.Prefix{}); err == nil {
		t.Error("a second tap of the same name was created")
	}
	if err := tap.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.InterfaceByName(name); err == nil {
		t.Error("the tap still exists")
	}
	if err := tap.Delete(); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

// TestQMPPauseResume pauses and resumes a real QEMU through its QMP
// socket (the daemon pauses a VM on a ledger stop).
func TestQMPPauseResume(t *testing.T) {
	requireVM(t)
	img := image(t)
	dir := t.TempDir()
	vm, err := Start(context.Background(), Config{
		Accel:      TCG,
		Kernel:     img.Kernel,
		Initrd:     img.Initramfs,
		CtrlSocket: filepath.Join(dir, "ctl.sock"),
		QMPSocket:  filepath.Join(dir, "qmp.sock"),
		ConsoleLog: filepath.Join(dir, "console.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, step := range []struct {
		do   func(context.Context) error
		want string
	}{
		{nil, "running"},
		{vm.Pause, "paused"},
		{vm.Resume, "running"},
		{vm.Pause, "paused"},
	} {
		if step.do != nil {
			if err := step.do(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if st, err := vm.Status(ctx); err != nil || st != step.want {
			t.Fatalf("status %q %v, want %s", st, err, step.want)
		}
	}
	// A paused QEMU still stops.
	if err := vm.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("wait: %v", err)
	}
}

func TestCreateTapDown(t *testing.T) {
	testutil.RequireRoot(t)
	name := testutil.UniqueName("cbq")
	host, _ := subnet(name)
	tap, err := CreateTapDown(name, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tap.Delete() })
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if ifi.Flags&net.FlagUp != 0 {
		t.Errorf("tap %s is up before Up: %v", name, ifi.Flags)
	}
	if addrs, _ := ifi.Addrs(); len(addrs) != 1 || addrs[0].String() != host.String() {
		t.Errorf("addresses %v, want %v", addrs, host)
	}
	if err := tap.Up(); err != nil {
		t.Fatal(err)
	}
	if ifi, err = net.InterfaceByName(name); err != nil || ifi.Flags&net.FlagUp == 0 {
		t.Errorf("tap %s not up after Up: %v %v", name, ifi, err)
	}
}
