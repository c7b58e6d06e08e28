package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/carbd/carbd/pkg/calib"
	"github.com/carbd/carbd/pkg/daemon"
	"github.com/carbd/carbd/pkg/decide"
	"github.com/carbd/carbd/pkg/oracle/llm"
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
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on `addr` (e.g. 127.0.0.1:9464) while the run lasts")
	metricsTextfile := fs.String("metrics-textfile", "", "write carbd_<id>.prom for node_exporter's textfile collector into `directory` (every 5 s and at the end: the final counts outlive the run)")
	var vm daemon.VMConfig
	fs.StringVar(&vm.Image, "vm-image", "", "VM backends: the guest image `directory` (make vmimage; default $CARBD_VMIMAGE or ./vmimage/out)")
	fs.StringVar(&vm.Binary, "vm-binary", "", "VM backends: the hypervisor `executable` (default qemu-system-x86_64 or cloud-hypervisor)")
	fs.StringVar(&vm.Virtiofsd, "vm-virtiofsd", "", "VM backends: the virtiofsd `executable` (default /usr/lib/qemu/virtiofsd)")
	fs.IntVar(&vm.CPUs, "vm-cpus", 0, "VM backends: guest vCPUs (default 1)")
	fs.IntVar(&vm.MemoryMiB, "vm-memory", 0, "VM backends: guest memory in `MiB` (default 512)")
	fs.StringVar(&vm.Accel, "vm-accel", "", "qemu: accelerator kvm or tcg (default: probe)")
	vmCA := fs.String("vm-ca", "", "VM backends: PEM `file` of a CA the guest trusts besides carbd's interception CA")
	fs.DurationVar(&vm.BootTimeout, "vm-boot-timeout", 0, "VM backends: launch to the guest's hello (default 5m)")
	pcapPath := fs.String("pcap", "", "stream the run's pcapng audit (every frame with its verdict, the interception's keys) to `file`, mode 0600, as the run goes (default: the working directory's state, "+daemon.DefaultWorkStateRoot+"/<id>/runs/<run>/audit.pcapng; carbd audit --list)")
	stagedMax := fs.Int("staged-content-max", 0, "show one decision at most `bytes` of a staged change (0: 32 MiB; 65536 to 1 GiB); a change with more is kept staged, never committed")
	pcapMax := fs.Int64("pcap-max", 0, "cap the pcapng audit at `bytes` (0: 128 MiB; negative: no cap); frames beyond it are counted, not written")
	holdTimeout := fs.Duration("hold-timeout", 10*time.Second, "longest a packet waits for a decision before it is refused")
	var icpt daemon.InterceptConfig
	intercepting := fs.Bool("intercept", true, "intercept the guest's HTTPS (TCP 443 and the policy's intercept.ports) and decide it request by request; false: TLS is opaque, decided by server name as carrying everything read so far")
	fs.StringVar(&icpt.CACert, "ca-cert", "", "interception CA certificate `file` (PEM; with --ca-key; default: the host's CA, created once under "+daemon.DefaultCADir+")")
	fs.StringVar(&icpt.CAKey, "ca-key", "", "interception CA key `file` (PEM)")
	fs.StringVar(&icpt.KeyLog, "keylog", "", "append the TLS secrets of both legs of every intercepted connection to `file` (NSS key log, SSLKEYLOGFILE; mode 0600); the pcapng audit carries the guest leg's itself")
	fs.Func("upstream-ca", "PEM `file` of a CA trusted for the world's servers besides the host's roots; repeatable", func(s string) error {
		icpt.UpstreamCAs = append(icpt.UpstreamCAs, s)
		return nil
	})
	envs := &envFlag{lookup: os.LookupEnv}
	fs.Var(envs, "env", "pass `NAME[=VALUE][@host[,host]]` to the agent's environment, a credential bound to the policy's parties for NAME and the hosts given (NAME alone: carbd's own value; @*: plain, not a credential); repeatable")
	var envFiles []string
	fs.Func("env-file", "read NAME=VALUE lines for the agent's environment from `file` (credentials, as --env NAME=VALUE); repeatable", func(s string) error {
		envFiles = append(envFiles, s)
		return nil
	})
	err := fs.Parse(args)
	if len(os.Args) > 1 && len(args) > 0 && &os.Args[len(os.Args)-len(args)] == &args[0] {
		scrubArgs(args) // args is os.Args' tail: scrub the process's own argument vector
	}
	if err != nil {
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
	agentEnv, p, err := bindEnv(p, envFiles, envs.vars, e)
	if err != nil {
		return err
	}
	if *vmCA != "" {
		if vm.CA, err = os.ReadFile(*vmCA); err != nil {
			return err
		}
	}
	cfg := daemon.Config{ID: *id, StateDir: *stateDir, PolicyPath: *policyPath, Policy: p, Workdir: *workdir, Task: *task,
		Backend: *backend, Argv: argv, Env: agentEnv, UID: *uid, GID: *gid, Upstream: upstream, Hosts: hosts, HoldTimeout: *holdTimeout,
		AuditPath: *auditPath, Pcap: *pcapPath, PcapMaxBytes: *pcapMax, StagedContentLimit: *stagedMax, Metrics: *metricsAddr, MetricsTextfile: *metricsTextfile, VM: vm, Intercept: icpt, Stdin: os.Stdin, Stdout: e.stdout, Stderr: e.stderr, Log: e.log}
	cfg.Intercept.Off = !*intercepting
	switch *oracleName {
	case "strict":
		cfg.Oracle = decide.Strict{}
	case "operator":
		op := decide.NewOperator(*operatorTimeout)
		cfg.Oracle, cfg.Operator = op, op
	case "llm":
		o, err := llm.FromEnv()
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
	var failed *daemon.ComponentError
	if errors.As(err, &failed) && sum != nil {
		// A component failed and ended the run closed: the summary
		// names it; exit status 3 (docs/operator.md).
		sum.WriteSummary(e.stderr)
		return exitError{code: exitComponentFailed}
	}
	if err != nil {
		return err
	}
	sum.WriteSummary(e.stderr)
	if sum.ExitCode != 0 {
		return exitError{code: sum.ExitCode}
	}
	return nil
}

// exitComponentFailed is carbd run's exit status when one of carbd's own
// components failed and ended the run (the summary's first line names
// it); otherwise carbd run exits with the command's status.
const exitComponentFailed = 3

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

// bindEnv reads the env files, then the --env flags (a later NAME
// replaces an earlier one), and binds the values as credentials to the
// policy. A value too short to be recognised in effects, that neither the
// policy declares nor a binding names, is passed as plain environment
// with a warning. It returns the agent's NAME=VALUE list and the policy
// with the credentials bound.
func bindEnv(p *decide.Policy, files []string, flags []envVar, e *env) ([]string, *decide.Policy, error) {
	var vars []envVar
	for _, f := range files {
		vs, err := readEnvFile(f)
		if err != nil {
			return nil, nil, err
		}
		vars = append(vars, vs...)
	}
	vars = append(vars, flags...)
	last := map[string]int{}
	for i, v := range vars {
		last[v.Name] = i
	}
	declared := map[string]bool{}
	for _, c := range p.Credentials {
		declared[c.Name] = true
	}
	var agentEnv []string
	var creds []decide.CredentialValue
	for i, v := range vars {
		if last[v.Name] != i {
			continue
		}
		agentEnv = append(agentEnv, v.Name+"="+v.Value)
		if len(v.Hosts) == 0 && !declared[v.Name] && len(decide.Norm(v.Value)) < decide.MinCredentialLen {
			e.log.Warn("the value is too short to be recognised in effects: passed as plain environment, not as a credential", "env", v.Name)
			continue
		}
		creds = append(creds, decide.CredentialValue{Name: v.Name, Value: v.Value, Hosts: v.Hosts})
	}
	bound, err := p.WithCredentials(creds)
	if err != nil {
		return nil, nil, err
	}
	for _, c := range bound.Credentials {
		for _, n := range bound.CredentialNames() {
			if n == c.Name && len(c.Parties) == 0 && len(c.Endpoint.Hosts) == 0 && len(c.Endpoint.Prefixes) == 0 {
				e.log.Warn("credential bound to no party: every effect carrying it is refused (bind it with --env NAME@host or the policy's credentials)", "env", c.Name)
			}
		}
	}
	return agentEnv, bound, nil
}
