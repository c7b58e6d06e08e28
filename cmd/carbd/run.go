package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/decide"
)

func init() {
	register(&command{name: "run", summary: "run a command in a sandbox with every effect mediated", run: runRun})
}

// hostsFlag collects --host name=addr[,addr...].
type hostsFlag map[string][]netip.Addr

func (h hostsFlag) String() string { return "" }
func (h hostsFlag) Set(s string) error {
	name, addrs, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("want name=address[,address...], got %q", s)
	}
	key := strings.ToLower(strings.TrimSuffix(name, "."))
	for _, a := range strings.Split(addrs, ",") {
		ad, err := netip.ParseAddr(strings.TrimSpace(a))
		if err != nil {
			return err
		}
		h[key] = append(h[key], ad)
	}
	return nil
}

func runRun(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "run", "--policy FILE --workdir DIR [--task TEXT | --task-file F] [flags] -- COMMAND [ARGS...]")
	policyPath := fs.String("policy", "", "policy `file` (YAML, docs/policy.md)")
	workdir := fs.String("workdir", "", "the working `directory` the agent may change (mediated: staged, committed on release)")
	task := fs.String("task", "", "the principal's task `text` (trusted values T0)")
	taskFile := fs.String("task-file", "", "read the task from `file`")
	backend := fs.String("backend", "netns", "sandbox backend: netns (embedded default), qemu or cloud-hypervisor")
	oracleName := fs.String("oracle", "strict", "oracle for deferred effects: strict, operator (carbd approve/deny) or llm")
	operatorTimeout := fs.Duration("operator-timeout", 2*time.Minute, "operator oracle: an effect not approved in time is refused")
	calibPath := fs.String("calib", "", "calibration artifact `file` (carbd calib): per-role thresholds and the ledger gate")
	id := fs.String("id", "", "sandbox `id` (default: derived from the working directory)")
	stateDir := fs.String("state-dir", daemon.DefaultStateDir, "state `directory` (sockets, audit log)")
	auditPath := fs.String("audit", "", "also write the JSON-lines decision log to `file`")
	uid := fs.Int("uid", 0, "host uid the sandbox's root maps to (default: the working directory's owner)")
	gid := fs.Int("gid", 0, "host gid the sandbox's root maps to (default: the working directory's group)")
	var upstream []netip.AddrPort
	fs.Func("dns", "upstream `resolver` (addr:port) for the sandbox's resolver; repeatable", func(s string) error {
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return err
		}
		upstream = append(upstream, ap)
		return nil
	})
	hosts := hostsFlag{}
	fs.Var(hosts, "host", "static `name=addr[,addr]` answered by the sandbox's resolver; repeatable")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on `addr` (e.g. 127.0.0.1:9464)")
	var vm daemon.VMConfig
	fs.StringVar(&vm.Image, "vm-image", "", "VM backends: the guest image `directory` (make vmimage; default $CARBD_VMIMAGE or ./vmimage/out)")
	fs.StringVar(&vm.Binary, "vm-binary", "", "VM backends: the hypervisor `executable` (default qemu-system-x86_64 or cloud-hypervisor)")
	fs.StringVar(&vm.Virtiofsd, "vm-virtiofsd", "", "VM backends: the virtiofsd `executable` (default /usr/lib/qemu/virtiofsd)")
	fs.IntVar(&vm.CPUs, "vm-cpus", 0, "VM backends: guest vCPUs (default 1)")
	fs.IntVar(&vm.MemoryMiB, "vm-memory", 0, "VM backends: guest memory in `MiB` (default 512)")
	fs.StringVar(&vm.Accel, "vm-accel", "", "qemu: accelerator kvm or tcg (default: probe)")
	vmCA := fs.String("vm-ca", "", "VM backends: PEM `file` of the interception CA the guest trusts")
	fs.DurationVar(&vm.BootTimeout, "vm-boot-timeout", 0, "VM backends: launch to the guest's hello (default 5m)")
	holdTimeout := fs.Duration("hold-timeout", 10*time.Second, "longest a packet waits for a decision before it is refused")
	if err := fs.Parse(args); err != nil {
		return err
	}
	argv := fs.Args()
	if *policyPath == "" || *workdir == "" || len(argv) == 0 {
		fs.Usage()
		return fmt.Errorf("%w: --policy, --workdir and a command are required", errUsage)
	}
	if *task != "" && *taskFile != "" {
		return fmt.Errorf("%w: --task and --task-file are exclusive", errUsage)
	}
	if *taskFile != "" {
		b, err := os.ReadFile(*taskFile)
		if err != nil {
			return err
		}
		*task = string(b)
	}
	p, err := decide.LoadPolicy(*policyPath)
	if err != nil {
		return err
	}
	if *vmCA != "" {
		if vm.CA, err = os.ReadFile(*vmCA); err != nil {
			return err
		}
	}
	cfg := daemon.Config{ID: *id, StateDir: *stateDir, PolicyPath: *policyPath, Policy: p, Workdir: *workdir, Task: *task,
		Backend: *backend, Argv: argv, UID: *uid, GID: *gid, Upstream: upstream, Hosts: hosts, HoldTimeout: *holdTimeout,
		AuditPath: *auditPath, Metrics: *metricsAddr, VM: vm, Stdin: os.Stdin, Stdout: e.stdout, Stderr: e.stderr, Log: e.log}
	switch *oracleName {
	case "strict":
		cfg.Oracle = decide.Strict{}
	case "operator":
		op := decide.NewOperator(*operatorTimeout)
		cfg.Oracle, cfg.Operator = op, op
	case "llm":
		o, err := decide.LLMFromEnv()
		if err != nil {
			return err
		}
		cfg.Oracle = o
	default:
		return fmt.Errorf("%w: unknown oracle %q (want strict, operator or llm)", errUsage, *oracleName)
	}
	if *calibPath != "" {
		a, err := calib.ReadArtifact(*calibPath)
		if err != nil {
			return err
		}
		cfg.Calibration = a
	}
	if upstream == nil {
		cfg.Upstream = systemResolvers()
	}
	sum, err := daemon.Run(ctx, cfg)
	if err != nil {
		return err
	}
	sum.WriteSummary(e.stderr)
	if sum.ExitCode != 0 {
		return exitError{code: sum.ExitCode}
	}
	return nil
}

// systemResolvers reads the host's resolvers from /etc/resolv.conf.
func systemResolvers() []netip.AddrPort {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && !a.IsLoopback() {
				out = append(out, netip.AddrPortFrom(a, 53))
			}
		}
	}
	return out
}
