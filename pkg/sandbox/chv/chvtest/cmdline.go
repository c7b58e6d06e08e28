package chvtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/carbd/carbd/pkg/sandbox/chv/internal/pvh"
)

// Options is a parsed command line: option name -> key -> value ("" is
// the key of a plain value, e.g. --kernel PATH; a flag such as --pvpanic
// has an empty map). For --net and --fs, which may be repeated, it holds
// the first device; CommandLine has them all.
type Options map[string]map[string]string

// CommandLine is the command line as the fake understood it.
type CommandLine struct {
	Opts Options
	// Nets and FS are every --net and --fs device, in order.
	Nets, FS []map[string]string
	// APISocket is the API socket's path (--api-socket path=P, or the
	// bare --api-socket P).
	APISocket string
	// EventMonitor is the event monitor's target: "fd=N" or "path=P".
	EventMonitor string
}

// argSpec is one option of cloud-hypervisor's clap command line
// (cloud-hypervisor/src/main.rs, get_cli_options_sorted) that carbd may
// use: whether it takes no value (a flag), one value, or one or more
// values (ArgAction::Append with num_args(1..): --net A B, or --net A
// --net B).
type argSpec int

const (
	argFlag argSpec = iota
	argOne
	argMany
)

var argSpecs = map[string]argSpec{
	"api-socket": argOne, "kernel": argOne, "initramfs": argOne, "cmdline": argOne,
	"cpus": argOne, "memory": argOne, "net": argMany, "fs": argMany, "vsock": argOne,
	"serial": argOne, "console": argOne, "event-monitor": argOne, "pvpanic": argFlag,
}

// optionKeys are the keys each option's OptionParser registers
// (vmm/src/config.rs: CpusConfig::parse, MemoryConfig::parse,
// NetConfig::parse, FsConfig::parse, VsockConfig::parse, ConsoleConfig and
// SerialConfig; PciDeviceCommonConfig::OPTIONS_IOMMU). A key outside them
// is "Unknown option".
var optionKeys = map[string][]string{
	"cpus":   {"boot", "max", "topology", "kvm_hyperv", "max_phys_bits", "affinity", "features", "nested", "core_scheduling", "profile"},
	"memory": {"size", "file", "mergeable", "hotplug_method", "hotplug_size", "hotplugged_size", "shared", "hugepages", "hugepage_size", "prefault", "reserve", "thp"},
	"net": {"tap", "ip", "mask", "mac", "host_mac", "offload_tso", "offload_ufo", "offload_csum", "mtu", "queue_size", "num_queues",
		"vhost_user", "socket", "vhost_mode", "fd", "bw_size", "bw_one_time_burst", "bw_refill_time", "ops_size", "ops_one_time_burst",
		"ops_refill_time", "id", "iommu", "pci_segment", "pci_device_id"},
	"fs":            {"tag", "queue_size", "num_queues", "socket", "id", "pci_segment", "pci_device_id"},
	"vsock":         {"socket", "cid", "id", "iommu", "pci_segment", "pci_device_id"},
	"event-monitor": {"path", "fd"},
}

// parseOptionList is option_parser's OptionParser::parse: split at commas
// outside quotes and brackets; each part is key=value (the value trimmed,
// quotes removed; an empty value leaves the key unset) or, for a
// valueless key, the bare key; an unknown key is an error; a repeated key
// takes the last value.
func parseOptionList(s string, keys, valueless []string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	parts, err := splitCommas(s)
	if err != nil {
		return nil, err
	}
	for _, part := range parts {
		k, v, hasValue := strings.Cut(part, "=")
		switch {
		case contains(valueless, k):
			out[k] = ""
		case contains(keys, k):
			if !hasValue {
				return nil, fmt.Errorf("invalid syntax: %s", part)
			}
			if v = dequote(strings.TrimSpace(v)); v == "" {
				delete(out, k)
			} else {
				out[k] = v
			}
		default:
			return nil, fmt.Errorf("unknown option: %s", k)
		}
	}
	return out, nil
}

func splitCommas(s string) ([]string, error) {
	var list []string
	var cur strings.Builder
	brackets, quoted := 0, false
	for _, c := range strings.TrimSpace(s) {
		switch {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '[':
			brackets++
		case c == ']':
			if brackets == 0 {
				return nil, fmt.Errorf("invalid syntax: %s", s)
			}
			brackets--
		case c == ',' && brackets == 0:
			list = append(list, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteRune(c)
	}
	if quoted || brackets != 0 {
		return nil, fmt.Errorf("invalid syntax: %s", s)
	}
	return append(list, cur.String()), nil
}

func dequote(s string) string { return strings.ReplaceAll(s, `"`, "") }

// toggle is option_parser's Toggle: on, off, true, false (any case).
func toggle(opt, key, v string, def bool) (bool, error) {
	switch strings.ToLower(v) {
	case "":
		return def, nil
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, fmt.Errorf("--%s: unable to convert %s for %s", opt, v, key)
}

// byteSized is option_parser's ByteSized: an unsigned integer with an
// optional K, M or G suffix (binary).
func byteSized(opt, key, v string) (uint64, error) {
	s := strings.TrimSpace(v)
	shift := 0
	switch {
	case strings.HasSuffix(s, "K"):
		shift = 10
	case strings.HasSuffix(s, "M"):
		shift = 20
	case strings.HasSuffix(s, "G"):
		shift = 30
	}
	n, err := strconv.ParseUint(strings.TrimRight(s, "KMG"), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("--%s: unable to convert %s for %s", opt, v, key)
	}
	return n << shift, nil
}

// uintOpt converts an integer option of the given bit size (Rust's
// FromStr for u8/u16/u32/usize: decimal digits, an optional '+').
func uintOpt(opt, key, v string, def uint64, bits int) (uint64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(v, "+"), 10, bits)
	if err != nil {
		return 0, fmt.Errorf("--%s: unable to convert %s for %s", opt, v, key)
	}
	return n, nil
}

// parseMAC is net_util's MacAddr::parse_str: six ':'-separated pairs of
// hex digits.
func parseMAC(opt, key, v string) error {
	parts := strings.Split(v, ":")
	if len(parts) != 6 {
		return fmt.Errorf("--%s: unable to convert %s for %s", opt, v, key)
	}
	for _, p := range parts {
		if len(p) != 2 || strings.Trim(p, "0123456789abcdefABCDEF") != "" {
			return fmt.Errorf("--%s: unable to convert %s for %s", opt, v, key)
		}
	}
	return nil
}

// ParseArgs parses a cloud-hypervisor command line as the real one does
// (clap, then vmm/src/config.rs's parsers and VmConfig::validate) for the
// options carbd uses, and checks the kernel file as Vm::load_kernel
// does. It returns the first option of each name (see ParseCommandLine).
func ParseArgs(args []string) (Options, error) {
	cl, err := ParseCommandLine(args)
	if err != nil {
		return nil, err
	}
	return cl.Opts, nil
}

// ParseCommandLine is ParseArgs with every --net and --fs device.
func ParseCommandLine(args []string) (*CommandLine, error) {
	cl := &CommandLine{Opts: Options{}}
	raw := map[string][]string{}
	var order []string
	for i := 0; i < len(args); {
		name, ok := strings.CutPrefix(args[i], "--")
		spec, known := argSpecs[name]
		if !ok || !known {
			return nil, fmt.Errorf("unexpected argument %q", args[i])
		}
		i++
		if _, dup := raw[name]; dup && spec != argMany {
			return nil, fmt.Errorf("the argument '--%s' cannot be used multiple times", name)
		}
		if _, seen := raw[name]; !seen {
			order = append(order, name)
		}
		if spec == argFlag {
			raw[name] = nil
			continue
		}
		n := 0
		for i < len(args) && (n == 0 || (spec == argMany && !strings.HasPrefix(args[i], "--"))) {
			raw[name] = append(raw[name], args[i])
			i++
			n++
		}
		if n == 0 {
			return nil, fmt.Errorf("a value is required for '--%s' but none was supplied", name)
		}
	}
	for _, name := range order {
		vals := raw[name]
		if argSpecs[name] == argFlag {
			cl.Opts[name] = map[string]string{}
			continue
		}
		for _, v := range vals {
			kv, err := parseOption(cl, name, v)
			if err != nil {
				return nil, err
			}
			switch name {
			case "net":
				cl.Nets = append(cl.Nets, kv)
			case "fs":
				cl.FS = append(cl.FS, kv)
			}
			if cl.Opts[name] == nil {
				cl.Opts[name] = kv
			}
		}
	}
	if err := cl.validate(); err != nil {
		return nil, err
	}
	return cl, nil
}

// parseOption parses one option's value.
func parseOption(cl *CommandLine, name, v string) (map[string]string, error) {
	switch name {
	case "kernel", "initramfs", "cmdline":
		return map[string]string{"": v}, nil
	case "api-socket":
		// parse_api_socket: path= or fd=; anything else (its parse error
		// is ignored) is the path itself.
		kv, _ := parseOptionList(v, []string{"path", "fd"}, nil)
		switch {
		case kv["fd"] != "":
			if _, err := strconv.ParseInt(kv["fd"], 10, 32); err != nil {
				return nil, fmt.Errorf("--api-socket: fd %q: %w", kv["fd"], err)
			}
		case kv["path"] != "":
			cl.APISocket = kv["path"]
		default:
			cl.APISocket = v
			kv = map[string]string{"path": v}
		}
		return kv, nil
	case "serial", "console":
		kv, err := parseOptionList(v, []string{"file", "socket"}, []string{"off", "pty", "tty", "null"})
		if err != nil {
			return nil, fmt.Errorf("--%s: %w", name, err)
		}
		for _, k := range []string{"file", "socket"} {
			if _, ok := kv[k]; !ok && strings.Contains(v, k+"=") {
				return nil, fmt.Errorf("--%s: %s mode without a path (ConsoleFileMissing)", name, k)
			}
		}
		if len(kv) == 0 {
			return nil, fmt.Errorf("--%s %q: no console mode given (ParseConsoleInvalidModeGiven)", name, v)
		}
		return kv, nil
	}
	kv, err := parseOptionList(v, optionKeys[name], nil)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", name, err)
	}
	switch name {
	case "event-monitor":
		switch {
		case kv["fd"] != "":
			if _, err := strconv.ParseInt(kv["fd"], 10, 32); err != nil {
				return nil, fmt.Errorf("--event-monitor: fd %q: %w", kv["fd"], err)
			}
			cl.EventMonitor = "fd=" + kv["fd"]
		case kv["path"] != "":
			cl.EventMonitor = "path=" + kv["path"]
		default:
			return nil, errors.New("--event-monitor: path= or fd= is required")
		}
	case "memory":
		for _, k := range []string{"size", "hotplug_size", "hotplugged_size", "hugepage_size"} {
			if v, ok := kv[k]; ok {
				if _, err := byteSized(name, k, v); err != nil {
					return nil, err
				}
			}
		}
		for _, k := range []string{"mergeable", "shared", "hugepages", "prefault", "reserve", "thp"} {
			if _, err := toggle(name, k, kv[k], false); err != nil {
				return nil, err
			}
		}
	case "cpus":
		if _, err := uintOpt(name, "boot", kv["boot"], 1, 32); err != nil {
			return nil, err
		}
		if _, err := uintOpt(name, "max", kv["max"], 1, 32); err != nil {
			return nil, err
		}
	case "net":
		for _, k := range []string{"mac", "host_mac"} {
			if v, ok := kv[k]; ok {
				if err := parseMAC(name, k, v); err != nil {
					return nil, err
				}
			}
		}
		for _, k := range []string{"ip", "mask"} {
			if v, ok := kv[k]; ok {
				if _, err := netip.ParseAddr(v); err != nil {
					return nil, fmt.Errorf("--net: unable to convert %s for %s", v, k)
				}
			}
		}
		for _, k := range []string{"offload_tso", "offload_ufo", "offload_csum", "vhost_user", "iommu"} {
			if _, err := toggle(name, k, kv[k], false); err != nil {
				return nil, err
			}
		}
		if _, err := uintOpt(name, "queue_size", kv["queue_size"], 256, 16); err != nil {
			return nil, err
		}
		if _, err := uintOpt(name, "num_queues", kv["num_queues"], 2, 64); err != nil {
			return nil, err
		}
		if _, err := uintOpt(name, "mtu", kv["mtu"], 1500, 16); err != nil {
			return nil, err
		}
	case "fs":
		if kv["tag"] == "" {
			return nil, errors.New("--fs: error parsing --fs: tag missing")
		}
		if len(kv["tag"]) > 36 { // VIRTIO_FS_TAG_LEN
			return nil, fmt.Errorf("--fs: tag %q is longer than 36 bytes", kv["tag"])
		}
		if kv["socket"] == "" {
			return nil, errors.New("--fs: error parsing --fs: socket missing")
		}
		if _, err := uintOpt(name, "queue_size", kv["queue_size"], 1024, 16); err != nil {
			return nil, err
		}
		if _, err := uintOpt(name, "num_queues", kv["num_queues"], 1, 64); err != nil {
			return nil, err
		}
	case "vsock":
		if kv["socket"] == "" {
			return nil, errors.New("--vsock: socket missing")
		}
		if kv["cid"] == "" {
			return nil, errors.New("--vsock: cid missing")
		}
		if _, err := uintOpt(name, "cid", kv["cid"], 0, 32); err != nil {
			return nil, err
		}
	}
	return kv, nil
}

// validate is VmConfig::validate for what carbd uses, and what the VMM
// needs before it boots.
func (cl *CommandLine) validate() error {
	o := cl.Opts
	if cl.APISocket == "" && o["api-socket"]["fd"] == "" {
		// carbd drives the VMM through its API: without one it could
		// not (the real VMM would run without an API).
		return errors.New("--api-socket missing (carbd needs the API)")
	}
	if o["kernel"] == nil {
		return errors.New("payload: no kernel, firmware or igvm given (MissingBootitem)")
	}
	if o["vsock"] == nil {
		return errors.New("--vsock missing (carbd's control channel)")
	}
	boot, _ := uintOpt("cpus", "boot", o["cpus"]["boot"], 1, 32)
	max, _ := uintOpt("cpus", "max", o["cpus"]["max"], boot, 32)
	if max < boot {
		return fmt.Errorf("--cpus: max %d lower than boot %d (CpusMaxLowerThanBoot)", max, boot)
	}
	shared, _ := toggle("memory", "shared", o["memory"]["shared"], false)
	hugepages, _ := toggle("memory", "hugepages", o["memory"]["hugepages"], false)
	mergeable, _ := toggle("memory", "mergeable", o["memory"]["mergeable"], false)
	if shared && mergeable {
		return errors.New("--memory: shared and mergeable (InvalidSharedMemoryWithMergeable)")
	}
	for _, n := range cl.Nets {
		q, _ := uintOpt("net", "num_queues", n["num_queues"], 2, 64)
		size, _ := uintOpt("net", "queue_size", n["queue_size"], 256, 16)
		if q < 2 {
			return fmt.Errorf("--net: num_queues %d lower than 2 (VnetQueueLowerThan2)", q)
		}
		if q/2 > boot {
			return fmt.Errorf("--net: %d queues for %d vCPUs (TooManyQueues)", q, boot)
		}
		if size == 0 || size&(size-1) != 0 {
			return fmt.Errorf("--net: queue_size %d is not a power of 2 (InvalidQueueSize)", size)
		}
		csum, _ := toggle("net", "offload_csum", n["offload_csum"], true)
		tso, _ := toggle("net", "offload_tso", n["offload_tso"], true)
		ufo, _ := toggle("net", "offload_ufo", n["offload_ufo"], true)
		if !csum && (tso || ufo) {
			return errors.New("--net: TSO or UFO without checksum offload (NoHardwareChecksumOffload)")
		}
		if (n["ip"] == "") != (n["mask"] == "") {
			return errors.New("--net: ip and mask go together (IpProvidedWithoutMask, MaskProvidedWithoutIp)")
		}
		if len(n["tap"]) > 15 {
			return fmt.Errorf("--net: tap name %q is longer than IFNAMSIZ-1", n["tap"])
		}
	}
	if len(cl.FS) > 0 && !shared && !hugepages {
		return errors.New("--fs needs --memory shared=on (VhostUserRequiresSharedMemory)")
	}
	for _, f := range cl.FS {
		q, _ := uintOpt("fs", "num_queues", f["num_queues"], 1, 64)
		size, _ := uintOpt("fs", "queue_size", f["queue_size"], 1024, 16)
		if q > boot {
			return fmt.Errorf("--fs: %d queues for %d vCPUs (TooManyQueues)", q, boot)
		}
		if size == 0 || size&(size-1) != 0 {
			return fmt.Errorf("--fs: queue_size %d is not a power of 2 (InvalidQueueSize)", size)
		}
	}
	if cid, _ := strconv.ParseUint(o["vsock"]["cid"], 10, 32); cid <= 2 || cid == 0xffffffff {
		return fmt.Errorf("--vsock: cid %d is reserved (VsockSpecialCid)", cid)
	}
	return checkKernel(o["kernel"][""])
}

// checkKernel is what Vm::load_kernel accepts on x86_64: an ELF with a
// PVH entry (a Xen ELF note of type XEN_ELFNOTE_PHYS32_ENTRY), else a
// bzImage (the setup header's "HdrS"); an ELF without the PVH note is
// KernelMissingPvhHeader.
func checkKernel(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--kernel %s: %w", path, err)
	}
	defer f.Close()
	head := make([]byte, 0x206)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if bytes.HasPrefix(head, []byte("\x7fELF")) {
		ok, err := pvh.HasEntry(path)
		if err != nil {
			return fmt.Errorf("--kernel %s: %w", path, err)
		}
		if !ok {
			return fmt.Errorf("--kernel %s: Kernel lacks PVH header", path)
		}
		return nil
	}
	if len(head) >= 0x206 && string(head[0x202:0x206]) == "HdrS" {
		return nil
	}
	return fmt.Errorf("--kernel %s: not an ELF kernel with a PVH entry nor a bzImage", path)
}

// WritePVHKernel writes a minimal ELF64 x86-64 file with the PVH entry
// note, which the fake (and chv.Start) accept as a kernel: a test
// stand-in for the image's vmlinux.
func WritePVHKernel(path string) error { return pvh.WriteKernel(path) }

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
