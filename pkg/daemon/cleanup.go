package daemon

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/mountinfo"
	"github.com/carbd/carbd/pkg/hooks/fileev"
	"github.com/carbd/carbd/pkg/hooks/nfrules"
	"github.com/carbd/carbd/pkg/hooks/tcx"
	"github.com/carbd/carbd/pkg/sandbox/netns"
	"github.com/carbd/carbd/pkg/staging"
)

// This file is what a crashed run leaves on the host, found and removed
// (carbd cleanup, docs/operator.md "Cleanup"). A new run with the same
// sandbox id removes a crashed run's state with the same functions
// (removeCrashedLink, removeStaleCgroup here; tcx.Remove, nfrules.Remove
// and nfrules.ApplyNAT's replacement of its tables).

// Kinds of host-wide resources a run creates.
const (
	ResIDLock       = "id-lock"          // IndexDir/id-<id>.lock
	ResLink         = "link"             // cbh-<id>: veth host side or tap
	ResTCPins       = "tc-pins"          // tcx.DefaultPinDir/<id>: the TC program, its link and maps
	ResChain        = "xtables-chain"    // CARBD-<id>-F/-I in filter (ip, ip6)
	ResJump         = "xtables-jump"     // FORWARD/INPUT's jump to one of them
	ResTable        = "nft-table"        // inet carbd-<id>, inet carbd-raw-<id>, ip/ip6 carbd-nat-<id>
	ResCgroup       = "cgroup"           // <cgroup2>/carbd-<id>
	ResMount        = "overlay-mount"    // <state>/sandboxes/<id>/merged
	ResSysctlHolder = "sysctl-holder"    // nfrules.DefaultSysctlDir/<netns>/<key>/holders/<id>
	ResSocket       = "operator-socket"  // <state>/sandboxes/<id>/operator.sock
	ResStateDir     = "state-dir"        // <state>/sandboxes/<id> (kept: the run's audit.jsonl)
	ResTracerSlot   = "file-tracer-slot" // fileev.DefaultPinDir/<tag>/slot-N: shared, reclaimed by the next tracer
)

// CleanupOptions says where to look for what runs leave. Zero values are
// the places carbd run uses.
type CleanupOptions struct {
	// StateDirs are the --state-dir of the runs (DefaultStateDir when
	// empty); the state directories of mounted merged views are found
	// whatever they are.
	StateDirs []string
	// WorkStateRoot holds the working directories' state
	// (DefaultWorkStateRoot): only read, to name what needs recovery.
	WorkStateRoot string
	// IDs, when set, limits the report and the removal to these
	// sandbox ids.
	IDs []string
}

func (o CleanupOptions) stateDirs() []string {
	if len(o.StateDirs) == 0 {
		return []string{DefaultStateDir}
	}
	return o.StateDirs
}

// HostResource is one resource a run created on the host.
type HostResource struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Kept is set on what cleanup never removes (the state directory
	// with the run's decision log).
	Kept bool `json:"kept,omitempty"`
	// Live is set on a shared resource (a slot of the host's file
	// tracer, a demo world) whose owner is alive.
	Live bool `json:"live,omitempty"`
}

// Recovery is a working directory whose last run did not finish: its
// staged writes, journal and pending labels wait for the next run there.
type Recovery struct {
	Workdir  string    `json:"workdir"`
	Run      string    `json:"run"`
	Started  time.Time `json:"started"`
	Staging  string    `json:"staging,omitempty"` // the layer directory, when it has staged state
	Command  string    `json:"command"`           // how to recover it
	StateDir string    `json:"work_state_dir"`
}

// SandboxLeftovers is what one sandbox id has on the host.
type SandboxLeftovers struct {
	ID string `json:"id"`
	// State: "live" (a carbd holds the id's lock), "stale" (nobody does,
	// and removable resources are left: a crashed run), or "ended"
	// (nobody does and only the lock file is left).
	State     string         `json:"state"`
	Pid       int            `json:"pid,omitempty"` // the live holder
	Resources []HostResource `json:"resources"`
	Recovery  []Recovery     `json:"needs_recovery,omitempty"`
}

// Removable says whether the id has anything cleanup removes besides its
// lock file.
func (s *SandboxLeftovers) Removable() bool {
	for _, r := range s.Resources {
		if !r.Kept && r.Kind != ResIDLock {
			return true
		}
	}
	return false
}

// HostLeftovers is the report of carbd cleanup.
type HostLeftovers struct {
	Sandboxes []*SandboxLeftovers `json:"sandboxes"`
	// Shared are resources of no one sandbox: the slots of the host's
	// file tracer (a stale one is reclaimed by the next run's tracer).
	Shared []HostResource `json:"shared,omitempty"`
}

// Stale lists the stale sandboxes.
func (h *HostLeftovers) Stale() []*SandboxLeftovers {
	var out []*SandboxLeftovers
	for _, s := range h.Sandboxes {
		if s.State == "stale" {
			out = append(out, s)
		}
	}
	return out
}

// leftoverIDRE is what a sandbox id found in a resource's name may be:
// what nfrules and tcx accept (netns.CheckID is stricter; tests and older
// runs made others).
var leftoverIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,20}$`)

// ScanHost lists what carbd runs left on the host, by sandbox id, and
// whether each id's run is alive. It changes nothing and takes no lock:
// liveness is read from /proc/locks.
func ScanHost(o CleanupOptions) (*HostLeftovers, error) {
	locks, err := heldFlocks()
	if err != nil {
		return nil, fmt.Errorf("cleanup: %w", err)
	}
	byID := map[string]*SandboxLeftovers{}
	want := map[string]bool{}
	for _, id := range o.IDs {
		want[id] = true
	}
	add := func(id string, r HostResource) {
		if !leftoverIDRE.MatchString(id) || len(want) > 0 && !want[id] {
			return
		}
		s := byID[id]
		if s == nil {
			s = &SandboxLeftovers{ID: id}
			byID[id] = s
		}
		s.Resources = append(s.Resources, r)
	}
	var errs []error

	// Id locks.
	if ents, err := os.ReadDir(IndexDir); err == nil {
		for _, e := range ents {
			if id, ok := strings.CutSuffix(strings.TrimPrefix(e.Name(), "id-"), ".lock"); ok && strings.HasPrefix(e.Name(), "id-") {
				add(id, HostResource{Kind: ResIDLock, Name: filepath.Join(IndexDir, e.Name())})
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// Links (veth host sides and taps are both cbh-<id>).
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if id, ok := strings.CutPrefix(l.Attrs().Name, "cbh-"); ok {
				add(id, HostResource{Kind: ResLink, Name: l.Attrs().Name + " (" + l.Type() + ")"})
			}
		}
	} else {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	// TC pins.
	if ents, err := os.ReadDir(tcx.DefaultPinDir); err == nil {
		for _, e := range ents {
			if e.IsDir() {
				add(e.Name(), HostResource{Kind: ResTCPins, Name: filepath.Join(tcx.DefaultPinDir, e.Name())})
			}
		}
	}
	// Netfilter.
	if err := scanNetfilter(add); err != nil {
		errs = append(errs, err)
	}
	// Cgroups.
	if mnt, err := fileev.Cgroup2Mount(); err == nil {
		if ents, err := os.ReadDir(mnt); err == nil {
			for _, e := range ents {
				if id, ok := strings.CutPrefix(e.Name(), "carbd-"); ok && e.IsDir() {
					add(id, HostResource{Kind: ResCgroup, Name: filepath.Join(mnt, e.Name())})
				}
			}
		}
	}
	// Merged views still mounted; their state directories are scanned
	// too.
	stateDirs := map[string]bool{}
	for _, d := range o.stateDirs() {
		stateDirs[filepath.Clean(d)] = true
	}
	mounts, err := stagingMounts()
	if err != nil {
		errs = append(errs, err)
	}
	for _, m := range mounts {
		add(m.id, HostResource{Kind: ResMount, Name: m.point})
		stateDirs[m.stateDir] = true
	}
	// Forwarding-sysctl holders.
	holders, _ := filepath.Glob(filepath.Join(nfrules.DefaultSysctlDir, "*", "*", "holders", "*"))
	for _, h := range holders {
		add(filepath.Base(h), HostResource{Kind: ResSysctlHolder, Name: h})
	}
	// State directories.
	for d := range stateDirs {
		ents, err := os.ReadDir(filepath.Join(d, "sandboxes"))
		if err != nil {
			continue
		}
		for _, e := range ents {
			dir := filepath.Join(d, "sandboxes", e.Name())
			if _, err := os.Lstat(filepath.Join(dir, "operator.sock")); err == nil {
				add(e.Name(), HostResource{Kind: ResSocket, Name: filepath.Join(dir, "operator.sock")})
			}
			add(e.Name(), HostResource{Kind: ResStateDir, Name: dir, Kept: true})
		}
	}

	h := &HostLeftovers{}
	for id, s := range byID {
		if pid, ok := locks[lockKey(filepath.Join(IndexDir, "id-"+id+".lock"))]; ok {
			s.State, s.Pid = "live", pid
		} else if s.Removable() {
			s.State = "stale"
		} else {
			s.State = "ended"
		}
		h.Sandboxes = append(h.Sandboxes, s)
	}
	// Working directories whose last run did not finish, and whose
	// sandbox is not running.
	if runs, err := ListRuns(o.workStateRoot()); err == nil {
		last := map[string]RunInfo{}
		for _, r := range runs {
			last[filepath.Dir(filepath.Dir(r.Dir))] = r // oldest first: the newest stays
		}
		for ws, r := range last {
			if r.Finished || !leftoverIDRE.MatchString(r.Sandbox) || len(want) > 0 && !want[r.Sandbox] {
				continue
			}
			s := byID[r.Sandbox]
			if s != nil && s.State == "live" {
				continue // that run is the one going on
			}
			if s == nil {
				s = &SandboxLeftovers{ID: r.Sandbox, State: "ended"}
				byID[r.Sandbox] = s
				h.Sandboxes = append(h.Sandboxes, s)
			}
			s.Recovery = append(s.Recovery, recoveryOf(r, ws))
		}
	}
	for _, s := range h.Sandboxes {
		sort.Slice(s.Resources, func(i, j int) bool {
			if s.Resources[i].Kind != s.Resources[j].Kind {
				return s.Resources[i].Kind < s.Resources[j].Kind
			}
			return s.Resources[i].Name < s.Resources[j].Name
		})
	}
	sort.Slice(h.Sandboxes, func(i, j int) bool { return h.Sandboxes[i].ID < h.Sandboxes[j].ID })
	h.Shared = tracerSlots(locks)
	return h, errors.Join(errs...)
}

func (o CleanupOptions) workStateRoot() string {
	if o.WorkStateRoot == "" {
		return DefaultWorkStateRoot
	}
	return o.WorkStateRoot
}

// recoveryOf says how the unfinished run r of the working directory
// whose state is ws is recovered: carbd run in the same working
// directory with the same sandbox id (the staging layers are
// <parent of W>/.carbd/<id> by default), which recovers the journal
// (an interrupted commit rolled back or completed), resumes the staged
// layers and decides their changes in that run.
func recoveryOf(r RunInfo, ws string) Recovery {
	rec := Recovery{Workdir: r.Workdir, Run: r.Run, Started: r.Started, StateDir: ws}
	cmd := "carbd run --workdir " + r.Workdir
	if r.Sandbox != DefaultID(r.Workdir) {
		cmd += " --id " + r.Sandbox
	}
	rec.Command = cmd + " --policy ... -- AGENT..."
	if _, err := os.Stat(r.Workdir); err != nil {
		rec.Command = "none: the working directory is gone (" + err.Error() + ")"
		return rec
	}
	if r.Workdir != "" {
		layers := filepath.Join(filepath.Dir(r.Workdir), ".carbd", r.Sandbox)
		if _, err := os.Stat(filepath.Join(layers, "upper")); err == nil {
			rec.Staging = layers
		}
	}
	return rec
}

// scanNetfilter finds carbd's nftables tables and iptables-nft chains
// (and the jumps to them) in the caller's network namespace.
func scanNetfilter(add func(id string, r HostResource)) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer conn.CloseLasting()
	tables, err := conn.ListTables()
	if err != nil {
		return fmt.Errorf("nftables: list tables: %w", err)
	}
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "inet"}
	for _, t := range tables {
		name := fam[t.Family] + " " + t.Name
		switch {
		case strings.HasPrefix(t.Name, "carbd-raw-") && t.Family == nftables.TableFamilyINet:
			add(strings.TrimPrefix(t.Name, "carbd-raw-"), HostResource{Kind: ResTable, Name: name})
		case strings.HasPrefix(t.Name, "carbd-nat-") && t.Family != nftables.TableFamilyINet:
			add(strings.TrimPrefix(t.Name, "carbd-nat-"), HostResource{Kind: ResTable, Name: name})
		case strings.HasPrefix(t.Name, "carbd-probe-"):
		case strings.HasPrefix(t.Name, "carbd-") && t.Family == nftables.TableFamilyINet:
			add(strings.TrimPrefix(t.Name, "carbd-"), HostResource{Kind: ResTable, Name: name})
		}
	}
	chains, err := conn.ListChains()
	if err != nil {
		return fmt.Errorf("nftables: list chains: %w", err)
	}
	chainID := func(c string) (string, bool) {
		rest, ok := strings.CutPrefix(c, "CARBD-")
		if !ok {
			return "", false
		}
		if id, ok := strings.CutSuffix(rest, "-F"); ok {
			return id, true
		}
		return strings.CutSuffix(rest, "-I")
	}
	for _, c := range chains {
		if c.Table.Name != "filter" || c.Table.Family != nftables.TableFamilyIPv4 && c.Table.Family != nftables.TableFamilyIPv6 {
			continue
		}
		if id, ok := chainID(c.Name); ok {
			add(id, HostResource{Kind: ResChain, Name: fam[c.Table.Family] + " filter " + c.Name})
			continue
		}
		if c.Name != "FORWARD" && c.Name != "INPUT" {
			continue
		}
		rules, err := conn.GetRules(c.Table, c)
		if err != nil {
			return fmt.Errorf("nftables: list %s filter %s: %w", fam[c.Table.Family], c.Name, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Kind == expr.VerdictJump {
					if id, ok := chainID(v.Chain); ok {
						add(id, HostResource{Kind: ResJump, Name: fmt.Sprintf("%s filter %s -j %s", fam[c.Table.Family], c.Name, v.Chain)})
					}
				}
			}
		}
	}
	return nil
}

type stagingMount struct{ id, point, stateDir string }

// stagingMounts lists the merged views mounted at <state>/sandboxes/<id>/merged.
func stagingMounts() ([]stagingMount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseStagingMounts(f)
}

// parseStagingMounts reads a mountinfo table (proc(5)) for the overlays
// mounted at <state>/sandboxes/<id>/merged.
func parseStagingMounts(r io.Reader) ([]stagingMount, error) {
	ms, err := mountinfo.Parse(r)
	var out []stagingMount
	for _, m := range ms {
		if m.FSType != "overlay" || !filepath.IsAbs(m.Point) || filepath.Base(m.Point) != "merged" {
			continue
		}
		point := filepath.Clean(m.Point)
		sbDir := filepath.Dir(point)
		if filepath.Base(filepath.Dir(sbDir)) != "sandboxes" {
			continue
		}
		out = append(out, stagingMount{id: filepath.Base(sbDir), point: point, stateDir: filepath.Dir(filepath.Dir(sbDir))})
	}
	return out, err
}

// heldFlocks maps each file with an flock(2) held to its holder's pid
// (/proc/locks), keyed by lockKey.
func heldFlocks() (map[string]int, error) {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil, err
	}
	return parseFlocks(b), nil
}

// parseFlocks reads /proc/locks (proc(5)): "1: FLOCK  ADVISORY  WRITE
// 1234 00:1a:5678 0 EOF" for each lock held; a waiter's line has "->"
// after the number and is skipped.
func parseFlocks(b []byte) map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil {
			continue
		}
		out[f[5]] = pid
	}
	return out
}

// lockKey is a file's "MAJ:MIN:INO" as /proc/locks shows it ("" if it
// cannot be read).
func lockKey(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return ""
	}
	return fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
}

// tracerSlots lists the slots of the host's shared file tracer.
func tracerSlots(locks map[string]int) []HostResource {
	var out []HostResource
	slots, _ := filepath.Glob(filepath.Join(fileev.DefaultPinDir, "*", "slot-*"))
	for _, s := range slots {
		_, live := locks[lockKey(s)]
		out = append(out, HostResource{Kind: ResTracerSlot, Name: s, Live: live})
	}
	return out
}

// RemovalFailure is one resource cleanup could not remove.
type RemovalFailure struct {
	ID       string `json:"id"`
	Resource string `json:"resource"`
	Err      string `json:"error"`
}

// RemoveLeftovers removes what the sandbox s (stale or ended, as ScanHost
// found it) left, holding the id's lock meanwhile (claimID, as a run
// does): a run starting with this id at the same moment is refused, and
// a run that took the id since the scan makes this return without
// touching anything. The state directory (the run's decision log) and
// the working directory's state are never removed. The lock file goes
// last, still held (claimID takes the lock of the file at its path).
func RemoveLeftovers(s *SandboxLeftovers) []RemovalFailure {
	var fails []RemovalFailure
	fail := func(res string, err error) {
		if err != nil {
			fails = append(fails, RemovalFailure{ID: s.ID, Resource: res, Err: err.Error()})
		}
	}
	if s.State == "live" {
		fail("sandbox", errors.New("live: not removed"))
		return fails
	}
	unlock, err := claimID(IndexDir, s.ID)
	if err != nil {
		if locks, lerr := heldFlocks(); lerr == nil {
			if _, held := locks[lockKey(filepath.Join(IndexDir, "id-"+s.ID+".lock"))]; held {
				return nil // a run took the id since the scan: live, not ours
			}
		}
		fail(ResIDLock, err)
		return fails
	}
	defer unlock()
	has := map[string][]HostResource{}
	for _, r := range s.Resources {
		has[r.Kind] = append(has[r.Kind], r)
	}
	hostIf := "cbh-" + s.ID
	ruleIf := hostIf // what the rules' plans name; removal goes by chain and table names
	if len(ruleIf) > 15 {
		ruleIf = "cbh-" + s.ID[:11] // an id longer than a run's (tests'): no link of its own
	}
	// In a new run's order (startNetChannel): the link first, so that a
	// surviving guest cannot send once its program and rules are gone.
	if len(has[ResLink]) > 0 {
		fail(ResLink+" "+hostIf, removeCrashedLink(hostIf))
	}
	if len(has[ResTCPins]) > 0 {
		fail(ResTCPins+" "+filepath.Join(tcx.DefaultPinDir, s.ID), tcx.Remove(tcx.Config{SandboxID: s.ID, Ifname: hostIf}))
	}
	if len(has[ResChain])+len(has[ResJump]) > 0 || hasTable(has[ResTable], "inet carbd-") {
		fail("netfilter rules of "+s.ID, nfrules.Remove(nfrules.Config{SandboxID: s.ID, Iface: ruleIf, QueueNum: netns.QueueBase}))
	}
	if hasTable(has[ResTable], "ip carbd-nat-") || hasTable(has[ResTable], "ip6 carbd-nat-") {
		fail("nat tables carbd-nat-"+s.ID, nfrules.RemoveNAT(nfrules.NATConfig{SandboxID: s.ID, Iface: ruleIf,
			Subnets: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/30"), netip.MustParsePrefix("fd00:cb::/64")}}))
	}
	if len(has[ResCgroup]) > 0 {
		fail(ResCgroup+" carbd-"+s.ID, removeStaleCgroup("carbd-"+s.ID))
	}
	// After the cgroup: no process of the sandbox holds the view.
	for _, m := range has[ResMount] {
		if err := staging.Unmount(&staging.Layout{Merged: m.Name}); err != nil && !errors.Is(err, staging.ErrNotMounted) {
			fail(ResMount+" "+m.Name, err)
		}
	}
	if len(has[ResSysctlHolder]) > 0 {
		// The holders of the host's namespace (the one runs use) as a
		// run's end releases them; others (of a namespace gone) are
		// files naming a dead pid.
		fail(ResSysctlHolder+" "+s.ID, nfrules.ReleaseSysctls(nfrules.DefaultSysctlDir, s.ID))
		for _, h := range has[ResSysctlHolder] {
			if err := os.Remove(h.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
				fail(ResSysctlHolder+" "+h.Name, err)
			}
		}
	}
	for _, r := range has[ResSocket] {
		if err := os.Remove(r.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
			fail(ResSocket+" "+r.Name, err)
		}
	}
	if len(fails) == 0 {
		if err := os.Remove(filepath.Join(IndexDir, "id-"+s.ID+".lock")); err != nil && !errors.Is(err, os.ErrNotExist) {
			fail(ResIDLock, err)
		}
	}
	return fails
}

func hasTable(rs []HostResource, prefix string) bool {
	for _, r := range rs {
		if strings.HasPrefix(r.Name, prefix) {
			return true
		}
	}
	return false
}

// removeCrashedLink removes the host side of a crashed run's guest link
// (veth or tap): while it exists, the surviving sandbox can send (a
// retransmission of a held request), and once its program and rules are
// gone nothing would stop that.
func removeCrashedLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("look up the crashed run's link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("remove the crashed run's link %s: %w", name, err)
	}
	return nil
}

// removeStaleCgroup removes the cgroup a crashed carbd left for this
// sandbox (its processes died with that carbd; any left are killed), so
// that the new run can trace its own. No such cgroup is not an error.
func removeStaleCgroup(name string) error {
	mnt, err := fileev.Cgroup2Mount()
	if err != nil {
		return nil
	}
	cg, err := fileev.OpenCgroup(filepath.Join(mnt, name))
	if err != nil {
		return nil
	}
	_ = cg.Kill()
	// cgroup.kill is asynchronous: the directory can be removed once the
	// last process is gone.
	for i := 0; ; i++ {
		err := cg.Remove()
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if i == 100 {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
