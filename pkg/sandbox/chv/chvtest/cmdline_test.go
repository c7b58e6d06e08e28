package chvtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// baseArgs is carbd's command line (chv.Config.Args) with a kernel at k.
func baseArgs(k string) []string {
	return []string{
		"--api-socket", "path=/run/vm/api.sock",
		"--kernel", k,
		"--initramfs", "/img/initramfs.cpio.gz",
		"--cmdline", "console=ttyS0 panic=-1 quiet carbd.vsock=1024",
		"--cpus", "boot=1",
		"--memory", "size=512M,shared=on",
		"--net", "tap=cbtap0,mac=52:54:00:ca:4b:01",
		"--fs", "tag=work,socket=/run/vm/vfs.sock",
		"--vsock", "cid=3,socket=/run/vm/vsock.sock",
		"--serial", "file=/run/vm/console.log",
		"--console", "off",
		"--event-monitor", "fd=3",
		"--pvpanic",
	}
}

// with replaces the value of option name (or appends it) in a copy of
// args.
func with(args []string, name string, vals ...string) []string {
	out := []string{}
	for i := 0; i < len(args); i++ {
		if args[i] == "--"+name {
			if argSpecs[name] != argFlag {
				i++ // and its value
			}
			continue
		}
		out = append(out, args[i])
	}
	for _, v := range vals {
		out = append(out, "--"+name, v)
	}
	return out
}

func TestParseCommandLineAccepts(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinux")
	if err := WritePVHKernel(k); err != nil {
		t.Fatal(err)
	}
	bz := filepath.Join(dir, "bzImage")
	bzData := make([]byte, 0x300)
	copy(bzData[0x202:], "HdrS")
	os.WriteFile(bz, bzData, 0o644)
	base := baseArgs(k)
	for name, args := range map[string][]string{
		"carbd's":                   base,
		"bare api socket path":      with(base, "api-socket", "/run/vm/api.sock"),
		"api socket with a comma":   with(base, "api-socket", "/run/vm,1/api.sock"),
		"net queues":                with(with(base, "cpus", "boot=2"), "net", "tap=cbtap0,num_queues=4,queue_size=512"),
		"fs queues":                 with(base, "fs", "tag=work,socket=/s,num_queues=1,queue_size=256"),
		"shared=true":               with(base, "memory", "size=1G,shared=true"),
		"size in bytes":             with(base, "memory", "size=536870912,shared=ON"),
		"two nets":                  with(base, "net", "tap=a", "tap=b"),
		"two nets after one --net":  append(with(base, "net"), "--net", "tap=a", "tap=b"),
		"two fs":                    with(base, "fs", "tag=a,socket=/a", "tag=b,socket=/b"),
		"36-byte tag":               with(base, "fs", "tag="+strings.Repeat("t", 36)+",socket=/s"),
		"repeated key: last wins":   with(base, "net", "tap=a,tap=cbtap0"),
		"empty value: unset":        with(base, "net", "tap=cbtap0,mac="),
		"quoted value":              with(base, "net", `tap="cbtap0"`),
		"ip with mask":              with(base, "net", "tap=a,ip=10.0.0.1,mask=255.255.255.0"),
		"event monitor path":        with(base, "event-monitor", "path=/run/vm/events"),
		"a bzImage":                 with(base, "kernel", bz),
		"serial null, console pty":  with(with(base, "serial", "null"), "console", "pty"),
		"offloads off with csum on": with(base, "net", "tap=a,offload_tso=off,offload_ufo=off"),
	} {
		if _, err := ParseCommandLine(args); err != nil {
			t.Errorf("%s: refused: %v", name, err)
		}
	}
	cl, err := ParseCommandLine(with(base, "net", "tap=a", "tap=b,mac=52:54:00:00:00:02"))
	if err != nil {
		t.Fatal(err)
	}
	want := []map[string]string{{"tap": "a"}, {"tap": "b", "mac": "52:54:00:00:00:02"}}
	if diff := cmp.Diff(want, cl.Nets); diff != "" || cl.Opts["net"]["tap"] != "a" {
		t.Errorf("nets (-want +got):\n%s", diff)
	}
	if cl, _ := ParseCommandLine(with(base, "api-socket", "/run/vm/api.sock")); cl.APISocket != "/run/vm/api.sock" {
		t.Errorf("bare api socket: %q", cl.APISocket)
	}
}

func TestParseCommandLineRefuses(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinux")
	if err := WritePVHKernel(k); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable() // an ELF without the PVH note
	vmlinuz := filepath.Join(dir, "vmlinuz")
	os.WriteFile(vmlinuz, []byte("MZ no setup header"), 0o644)
	base := baseArgs(k)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"size=banana":            {with(base, "memory", "size=banana,shared=on"), "unable to convert banana for size"},
		"shared=yes":             {with(base, "memory", "size=1G,shared=yes"), "unable to convert yes for shared"},
		"shared and mergeable":   {with(base, "memory", "shared=on,mergeable=on"), "InvalidSharedMemoryWithMergeable"},
		"unknown memory key":     {with(base, "memory", "size=1G,shared=on,huge=on"), "unknown option: huge"},
		"mac=zz":                 {with(base, "net", "tap=a,mac=zz"), "unable to convert zz for mac"},
		"mac with short pairs":   {with(base, "net", "tap=a,mac=52:54:0:ca:4b:01"), "for mac"},
		"37-byte tag":            {with(base, "fs", "tag="+strings.Repeat("t", 37)+",socket=/s"), "longer than 36"},
		"fs without tag":         {with(base, "fs", "socket=/s"), "tag missing"},
		"fs without shared":      {with(base, "memory", "size=1G"), "VhostUserRequiresSharedMemory"},
		"boot=0 with queues":     {with(base, "cpus", "boot=0"), "TooManyQueues"},
		"boot=x":                 {with(base, "cpus", "boot=x"), "unable to convert x for boot"},
		"max below boot":         {with(base, "cpus", "boot=2,max=1"), "CpusMaxLowerThanBoot"},
		"net num_queues=1":       {with(base, "net", "tap=a,num_queues=1"), "VnetQueueLowerThan2"},
		"net queues over vCPUs":  {with(base, "net", "tap=a,num_queues=4"), "TooManyQueues"},
		"net queue_size=100":     {with(base, "net", "tap=a,queue_size=100"), "InvalidQueueSize"},
		"fs queue_size=70000":    {with(base, "fs", "tag=w,socket=/s,queue_size=70000"), "unable to convert 70000 for queue_size"},
		"ip without mask":        {with(base, "net", "tap=a,ip=10.0.0.1"), "ip and mask go together"},
		"tso without csum":       {with(base, "net", "tap=a,offload_csum=off"), "NoHardwareChecksumOffload"},
		"long tap name":          {with(base, "net", "tap=abcdefghijklmnop"), "IFNAMSIZ"},
		"vsock cid 2":            {with(base, "vsock", "cid=2,socket=/v"), "VsockSpecialCid"},
		"vsock without socket":   {with(base, "vsock", "cid=3"), "socket missing"},
		"--cpus twice":           {append(base, "--cpus", "boot=1"), "cannot be used multiple times"},
		"unknown argument":       {append(base, "--bogus", "1"), `unexpected argument "--bogus"`},
		"no value":               {append(with(base, "event-monitor"), "--event-monitor"), "a value is required"},
		"bare event monitor":     {with(base, "event-monitor", "/run/vm/events"), "unknown option"},
		"serial without mode":    {with(base, "serial", "file="), "file mode without a path"},
		"serial unknown mode":    {with(base, "serial", "speaker"), "unknown option"},
		"kernel without PVH":     {with(base, "kernel", self), "Kernel lacks PVH header"},
		"kernel neither":         {with(base, "kernel", vmlinuz), "nor a bzImage"},
		"kernel missing":         {with(base, "kernel", filepath.Join(dir, "none")), "no such file"},
		"unbalanced quote":       {with(base, "net", `tap="a`), "invalid syntax"},
		"key without value":      {with(base, "net", "tap"), "invalid syntax"},
		"no kernel":              {with(base, "kernel"), "MissingBootitem"},
		"pvpanic with a value":   {append(with(base, "pvpanic"), "--pvpanic", "on"), `unexpected argument "on"`},
		"unknown net key (ipv6)": {with(base, "net", "tap=a,ipv6=fd00::1"), "unknown option: ipv6"},
	} {
		_, err := ParseCommandLine(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
}
