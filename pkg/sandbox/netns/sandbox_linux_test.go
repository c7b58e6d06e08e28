package netns

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/carbd/carbd/internal/testutil"
)

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

const testUID = 64123

var nextIndex atomic.Int32

// startTest starts a sandbox running a shell script and returns its output
// and exit status.
func runSandbox(t *testing.T, work string, script string) (string, int) {
	t.Helper()
	plan, err := NewPlan(testutil.UniqueName("s"), 7000+(os.Getpid()*7+int(nextIndex.Add(1)))%6000)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s, err := Start(Config{Plan: plan, Workdir: work, Argv: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"},
		UID: testUID, GID: testUID, Hostname: "sandbox", Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	code, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

func workdir(t *testing.T) string {
	d := t.TempDir()
	// The sandbox's user must be able to reach and own the working directory.
	for p := d; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
		_ = os.Chmod(p, 0o755)
	}
	if err := os.Chown(d, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestIsolation(t *testing.T) {
	testutil.RequireRoot(t)
	work := workdir(t)
	out, code := runSandbox(t, work, `
set -u
echo "uid=$(id -u)"
echo "init=$(tr '\0' ' ' </proc/1/cmdline)"
echo "procs=$(ls /proc | grep -c '^[0-9]')"
echo "host=$(hostname)"
touch /etc/carbd-escape 2>/dev/null && echo "ROOTFS-WRITABLE" || echo "rootfs-readonly"
echo data > "$PWD/result.txt" && echo "work-writable"
echo scratch > /tmp/s && echo "tmp-writable"
cat /etc/shadow >/dev/null 2>&1 && echo "SHADOW-READABLE" || echo "shadow-denied"
ip -o -4 addr show dev eth0 | awk '{print "addr=" $4}'
ls /sys/class/net | tr '\n' ' ' | sed 's/^/links=/'; echo
exit 3`)
	if code != 3 {
		t.Errorf("exit status %d, want the command's 3\n%s", code, out)
	}
	for _, want := range []string{"uid=0", "init=carbd-sandbox-init", "host=sandbox", "rootfs-readonly", "work-writable", "tmp-writable", "shadow-denied", "addr=10.200."} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	if strings.Contains(out, "procs=") && !regexp.MustCompile(`procs=[1-9]\n`).MatchString(out) {
		t.Errorf("the sandbox sees processes other than its own:\n%s", out)
	}
	if strings.Contains(out, "ROOTFS-WRITABLE") || strings.Contains(out, "SHADOW-READABLE") {
		t.Errorf("isolation broken:\n%s", out)
	}
	st, err := os.Stat(filepath.Join(work, "result.txt"))
	if err != nil {
		t.Fatalf("the sandbox's write did not reach the working directory: %v", err)
	}
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != testUID {
		t.Errorf("file owned by uid %d outside, want the unprivileged %d", sys.Uid, testUID)
	}
	if _, err := os.Stat("/etc/carbd-escape"); err == nil {
		os.Remove("/etc/carbd-escape")
		t.Error("the sandbox wrote to the host's /etc")
	}
}

func TestNetworkOnlyThroughVeth(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireTool(t, "ping")
	work := workdir(t)
	// The sandbox reaches the host side of its veth and nothing else: no
	// route is installed on the host for forwarding in this test.
	out, _ := runSandbox(t, work, `ping -c1 -W2 "$(ip route | awk '/default/ {print $3; exit}')" >/dev/null && echo gw-ok; echo "links=$(ls /sys/class/net | tr '\n' ' ')"`)
	if !strings.Contains(out, "gw-ok") {
		t.Errorf("sandbox cannot reach its gateway:\n%s", out)
	}
	if !strings.Contains(out, "links=eth0 lo \n") {
		t.Errorf("want exactly eth0 and lo inside:\n%s", out)
	}
}

// TestCgroupFunc: the cgroup CgroupFunc gives late is where the command
// runs (so it started only after CgroupFunc returned: the init moves
// before starting it, and a started command keeps its cgroup).
func TestCgroupFunc(t *testing.T) {
	testutil.RequireRoot(t)
	mnt := "/sys/fs/cgroup/unified"
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.procs")); err != nil {
		mnt = "/sys/fs/cgroup"
		if _, err := os.Stat(filepath.Join(mnt, "cgroup.controllers")); err != nil {
			t.Skip("no cgroup v2 hierarchy")
		}
	}
	name := testutil.UniqueName("cgf")
	cg := filepath.Join(mnt, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	plan, err := NewPlan(testutil.UniqueName("s"), 7000+(os.Getpid()*7+int(nextIndex.Add(1)))%6000)
	if err != nil {
		t.Fatal(err)
	}
	work := workdir(t)
	var out bytes.Buffer
	var called atomic.Bool
	s, err := Start(Config{Plan: plan, Workdir: work, Argv: []string{"/bin/sh", "-c", "cat /proc/self/cgroup"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		UID: testUID, GID: testUID, Stdout: &out, Stderr: &out,
		CgroupFunc: func() string {
			called.Store(true)
			return cg
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, err := s.Wait(); err != nil || code != 0 {
		t.Fatalf("exit %d, %v\n%s", code, err, out.String())
	}
	if !called.Load() {
		t.Fatal("CgroupFunc was not called")
	}
	if !strings.Contains(out.String(), "/"+name) {
		t.Errorf("the command ran in %q, want cgroup %s", out.String(), name)
	}
}
