package tcx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	carbdbpf "github.com/carbd/carbd/bpf"
	"github.com/carbd/carbd/internal/bpffs"
)

// DefaultPinDir is where datapaths are pinned, one directory per sandbox.
const DefaultPinDir = "/sys/fs/bpf/carbd"

// DefaultMaxFlows is the size of the flow and verdict tables.
const DefaultMaxFlows = 16384

// Names of the pinned objects inside a sandbox's directory. The maps are
// pinned under their own names: flows, verdicts, config, counters,
// read_gen.
const (
	pinProg = "prog"
	pinLink = "link"
)

const progName = "carbd_ingress"

var mapNames = []string{"flows", "verdicts", "config", "counters", readGenName}

// readGenName is the map of the read generation (bpf/include/carbd/read_gen.h).
const readGenName = "read_gen"

// Config says where to attach the datapath of one sandbox.
type Config struct {
	// SandboxID names the pin directory PinDir/SandboxID: 1 to 20 of
	// [A-Za-z0-9_-]. Required.
	SandboxID string
	// Ifname or Ifindex is the host side of the guest's interface (tap or
	// veth). One is required; when both are given they must agree.
	Ifname  string
	Ifindex int
	// NetNS is the path of the network namespace holding the interface
	// (/run/netns/NAME, /proc/PID/ns/net). Empty: the caller's.
	NetNS string
	// PinDir holds the per-sandbox directories; it must be on a bpf
	// filesystem. Empty: DefaultPinDir, mounting /sys/fs/bpf if needed.
	PinDir string
	// Mode forces TCX or the legacy clsact filter. ModeAuto (zero) uses
	// TCX where the kernel has it.
	Mode Mode
	// MaxFlows sizes the flow and verdict tables (LRU). Zero:
	// DefaultMaxFlows.
	MaxFlows uint32
	// ReadGen is the sandbox's read generation (NewReadGen), the map the
	// file tracer bumps (pkg/hooks/fileev Config.ReadGen). Nil: the
	// program gets a map of its own, which nothing bumps (a flow released
	// with ReleaseFlowAt then passes until the generation is set by
	// hand). It is pinned with the other maps.
	ReadGen *ebpf.Map
}

func (c Config) ifaceName() string {
	if c.Ifname != "" {
		return c.Ifname
	}
	return fmt.Sprintf("ifindex %d", c.Ifindex)
}

func (c Config) pinDir() string {
	d := c.PinDir
	if d == "" {
		d = DefaultPinDir
	}
	return filepath.Join(d, c.SandboxID)
}

// Validate checks the configuration without touching the system.
func (c Config) Validate() error {
	if err := validSandboxID(c.SandboxID); err != nil {
		return err
	}
	if c.Ifname == "" && c.Ifindex <= 0 {
		return errors.New("tcx: config: Ifname or Ifindex is required")
	}
	if c.Mode > ModeLegacy {
		return fmt.Errorf("tcx: config: unknown mode %d", c.Mode)
	}
	if c.PinDir != "" && !filepath.IsAbs(c.PinDir) {
		return fmt.Errorf("tcx: config: PinDir %q is not absolute", c.PinDir)
	}
	return nil
}

// Datapath is the program of one sandbox attached to its interface, with
// its maps. Its methods are safe for concurrent use; after Close or Leave
// they return ErrClosed.
type Datapath struct {
	dir     string
	id      string
	netns   string
	mode    Mode
	ifindex int

	legacyAttached bool // during Attach: the filter is ours to delete on failure

	mu     sync.RWMutex // guards the fields below; map methods hold it for reading
	closed bool
	prog   *ebpf.Program
	link   link.Link // ModeTCX only
	objs   objects
}

// objects are the program's maps.
type objects struct {
	flows, verdicts, config, counters, readGen *ebpf.Map
}

func (o *objects) byName() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{"flows": o.flows, "verdicts": o.verdicts, "config": o.config, "counters": o.counters,
		readGenName: o.readGen}
}

func (o *objects) close() {
	for _, m := range o.byName() {
		if m != nil {
			m.Close()
		}
	}
}

// loadSpec returns the program's spec with its tables sized.
func loadSpec(maxFlows uint32) (*ebpf.CollectionSpec, error) {
	spec, err := carbdbpf.LoadTc()
	if err != nil {
		return nil, fmt.Errorf("tcx: load program spec: %w", err)
	}
	if maxFlows == 0 {
		maxFlows = DefaultMaxFlows
	}
	spec.Maps["flows"].MaxEntries = maxFlows
	spec.Maps["verdicts"].MaxEntries = maxFlows
	return spec, nil
}

// load creates the program and its maps. With pinDir set, the maps are
// pinned there by name, and maps already pinned there are reused. With
// replace set, those maps are used instead (its nil ones are created).
func load(maxFlows uint32, pinDir string, replace *objects) (*ebpf.Program, objects, error) {
	spec, err := loadSpec(maxFlows)
	if err != nil {
		return nil, objects{}, err
	}
	var opts ebpf.CollectionOptions
	if pinDir != "" {
		for _, n := range mapNames {
			spec.Maps[n].Pinning = ebpf.PinByName
		}
		opts.Maps.PinPath = pinDir
	}
	if replace != nil {
		opts.MapReplacements = map[string]*ebpf.Map{}
		for n, m := range replace.byName() {
			if m != nil {
				opts.MapReplacements[n] = m
			}
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, objects{}, fmt.Errorf("tcx: load program: %+v", ve)
		}
		return nil, objects{}, fmt.Errorf("tcx: load program: %w", err)
	}
	defer coll.Close()
	prog := coll.DetachProgram(progName)
	o := objects{
		flows:    coll.DetachMap("flows"),
		verdicts: coll.DetachMap("verdicts"),
		config:   coll.DetachMap("config"),
		counters: coll.DetachMap("counters"),
		readGen:  coll.DetachMap(readGenName),
	}
	if prog == nil || o.flows == nil || o.verdicts == nil || o.config == nil || o.counters == nil || o.readGen == nil {
		prog.Close()
		o.close()
		return nil, objects{}, errors.New("tcx: program spec lacks the program or one of its maps")
	}
	return prog, o, nil
}

// Attach loads the program, pins it with its maps under
// PinDir/SandboxID, and attaches it first on the interface's ingress.
//
// The program starts with a lease of zero: it drops every packet but ARP
// and neighbour discovery until RenewLease. Attach before the interface
// carries traffic (before the guest starts), so no packet ever crosses
// the interface undecided. Attach fails with ErrExists when the
// directory is in use: Adopt it instead.
func Attach(cfg Config) (_ *Datapath, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	dir := cfg.pinDir()
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("%w: %s", ErrExists, dir)
	}
	if err := bpffs.Ensure(filepath.Dir(dir)); err != nil {
		return nil, fmt.Errorf("tcx: %w", err)
	}
	ifindex, err := resolveIfindex(cfg)
	if err != nil {
		return nil, fmt.Errorf("tcx: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %s", ErrExists, dir)
		}
		return nil, fmt.Errorf("tcx: make pin dir: %w", err)
	}
	d := &Datapath{dir: dir, id: cfg.SandboxID, netns: cfg.NetNS, ifindex: ifindex}
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()

	var replace *objects
	if cfg.ReadGen != nil {
		replace = &objects{readGen: cfg.ReadGen}
	}
	d.prog, d.objs, err = load(cfg.MaxFlows, dir, replace)
	if err != nil {
		return nil, err
	}
	if cfg.ReadGen != nil {
		// A replacement is not pinned by the load: pin it with the
		// others, for an adopter and ReplaceProgram.
		if err := d.objs.readGen.Pin(filepath.Join(dir, readGenName)); err != nil {
			return nil, fmt.Errorf("tcx: pin %s: %w", readGenName, err)
		}
	}

	// Pin the program and write the config (lease 0: drop) before
	// attaching, so that once the program is attached everything an
	// adopter needs is pinned; the link pin comes last (a TCX link that is
	// not pinned dies with this process, detaching the program).
	if err := d.prog.Pin(filepath.Join(dir, pinProg)); err != nil {
		return nil, fmt.Errorf("tcx: pin program: %w", err)
	}
	mode := cfg.Mode
	if mode == ModeAuto || mode == ModeTCX {
		d.mode = ModeTCX
		if err := d.writeConfig(0); err != nil {
			return nil, err
		}
		d.link, err = attachTCX(cfg.NetNS, ifindex, d.prog)
		switch {
		case err == nil:
			if err := d.link.Pin(filepath.Join(dir, pinLink)); err != nil {
				return nil, fmt.Errorf("tcx: pin link: %w", err)
			}
		case mode == ModeAuto && errors.Is(err, ebpf.ErrNotSupported):
			mode = ModeLegacy
		default:
			return nil, fmt.Errorf("tcx: attach program to %s: %w", cfg.ifaceName(), err)
		}
	}
	if mode == ModeLegacy {
		d.mode = ModeLegacy
		if err := d.writeConfig(0); err != nil {
			return nil, err
		}
		if err := attachLegacy(cfg.NetNS, ifindex, d.prog, d.filterName()); err != nil {
			return nil, fmt.Errorf("tcx: attach program to %s: %w", cfg.ifaceName(), err)
		}
		d.legacyAttached = true
	}
	return d, nil
}

// teardown undoes a partial Attach: it detaches and removes every pin.
func (d *Datapath) teardown() {
	if d.link != nil {
		_ = d.link.Unpin()
		_ = d.link.Close()
	}
	if d.legacyAttached {
		_ = detachLegacy(d.netns, d.ifindex)
	}
	if d.prog != nil {
		d.prog.Close()
	}
	d.objs.close()
	_ = os.RemoveAll(d.dir)
}

func (d *Datapath) filterName() string { return "carbd-" + d.id }

// Adopt takes over the datapath a previous carbd pinned for
// cfg.SandboxID under cfg.PinDir, without detaching it: the program goes
// on enforcing (and, once its lease lapses, dropping) throughout. For a
// legacy attachment cfg.NetNS must name the interface's namespace; the
// interface fields of cfg are ignored (the index is read from the pins).
// Call ReplaceProgram to run this binary's program.
func Adopt(cfg Config) (_ *Datapath, err error) {
	if err := validSandboxID(cfg.SandboxID); err != nil {
		return nil, err
	}
	dir := cfg.pinDir()
	if _, err := os.Stat(filepath.Join(dir, "config")); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrNotPinned, dir)
	}
	d := &Datapath{dir: dir, id: cfg.SandboxID, netns: cfg.NetNS}
	defer func() {
		if err != nil {
			d.release()
		}
	}()
	for _, n := range mapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, n), nil)
		if err != nil {
			return nil, fmt.Errorf("tcx: adopt map %s: %w", n, err)
		}
		switch n {
		case "flows":
			d.objs.flows = m
		case "verdicts":
			d.objs.verdicts = m
		case "config":
			d.objs.config = m
		case "counters":
			d.objs.counters = m
		case readGenName:
			d.objs.readGen = m
		}
	}
	if err := checkMaps(&d.objs); err != nil {
		return nil, err
	}
	var c rawConfig
	if err := d.objs.config.Lookup(uint32(0), &c); err != nil {
		return nil, fmt.Errorf("tcx: adopt: read config: %w", err)
	}
	d.mode, d.ifindex = Mode(c.AttachMode), int(c.Ifindex)
	if d.prog, err = ebpf.LoadPinnedProgram(filepath.Join(dir, pinProg), nil); err != nil {
		return nil, fmt.Errorf("tcx: adopt program: %w", err)
	}
	switch d.mode {
	case ModeTCX:
		if d.link, err = link.LoadPinnedLink(filepath.Join(dir, pinLink), nil); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				// A carbd died between loading and pinning the link: the
				// link died with it and nothing is attached.
				return nil, fmt.Errorf("%w: %s has no link (nothing is attached; Remove it and Attach)", ErrNotPinned, dir)
			}
			return nil, fmt.Errorf("tcx: adopt link: %w", err)
		}
	case ModeLegacy:
		if err := findLegacy(cfg.NetNS, d.ifindex, d.filterName()); err != nil {
			return nil, fmt.Errorf("tcx: adopt: %w", err)
		}
	default:
		return nil, fmt.Errorf("tcx: adopt: pinned config has attach mode %d", c.AttachMode)
	}
	return d, nil
}

// checkMaps verifies adopted maps have the layout this binary expects.
func checkMaps(o *objects) error {
	spec, err := loadSpec(0)
	if err != nil {
		return err
	}
	for n, m := range o.byName() {
		s := spec.Maps[n]
		if m.Type() != s.Type || m.KeySize() != s.KeySize || m.ValueSize() != s.ValueSize {
			return fmt.Errorf("tcx: adopt: pinned map %s (%s, key %d, value %d) does not match this carbd's (%s, key %d, value %d): stop the sandbox",
				n, m.Type(), m.KeySize(), m.ValueSize(), s.Type, s.KeySize, s.ValueSize)
		}
	}
	return nil
}

// ReplaceProgram loads this binary's program against the pinned maps and
// swaps it in atomically (link update for TCX, filter replace for legacy):
// every packet runs either the old or the new program, never neither.
func (d *Datapath) ReplaceProgram() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	prog, _, err := load(d.objs.flows.MaxEntries(), "", &d.objs)
	if err != nil {
		return err
	}
	switch d.mode {
	case ModeTCX:
		err = d.link.Update(prog)
	case ModeLegacy:
		err = replaceLegacy(d.netns, d.ifindex, prog, d.filterName())
	}
	if err != nil {
		prog.Close()
		return fmt.Errorf("tcx: replace program: %w", err)
	}
	// Repin: pin the new program beside the old pin, then rename over it.
	tmp := filepath.Join(d.dir, pinProg+"_new") // bpffs refuses names with a dot
	_ = os.Remove(tmp)
	if err := prog.Pin(tmp); err != nil {
		prog.Close()
		return fmt.Errorf("tcx: pin new program: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, pinProg)); err != nil {
		prog.Close()
		return fmt.Errorf("tcx: pin new program: %w", err)
	}
	d.prog.Close()
	d.prog = prog
	return nil
}

// Mode reports how the program is attached.
func (d *Datapath) Mode() Mode { return d.mode }

// Ifindex is the interface the program is attached to.
func (d *Datapath) Ifindex() int { return d.ifindex }

// PinDir is the directory of the pinned objects.
func (d *Datapath) PinDir() string { return d.dir }

// ProgramID is the kernel's id of the program this Datapath attached or
// last swapped in.
func (d *Datapath) ProgramID() (ebpf.ProgramID, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, ErrClosed
	}
	info, err := d.prog.Info()
	if err != nil {
		return 0, fmt.Errorf("tcx: program info: %w", err)
	}
	id, _ := info.ID()
	return id, nil
}

func (d *Datapath) writeConfig(aliveUntil uint64) error {
	c := rawConfig{AliveUntilNs: aliveUntil, Ifindex: uint32(d.ifindex), AttachMode: uint32(d.mode)}
	if err := d.objs.config.Update(uint32(0), c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("tcx: write config: %w", err)
	}
	return nil
}

// RenewLease lets the program forward for ttl from now. When the lease
// lapses (carbd stopped, hung or crashed), the program drops every packet
// but ARP and neighbour discovery. RenewLease(0) ends it now.
func (d *Datapath) RenewLease(ttl time.Duration) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return ErrClosed
	}
	if ttl < 0 {
		return fmt.Errorf("tcx: negative lease %v", ttl)
	}
	now, err := monotonicNow()
	if err != nil {
		return fmt.Errorf("tcx: %w", err)
	}
	return d.writeConfig(now + uint64(ttl))
}

// LeaseRemaining reports how long the current lease has left (zero or
// negative: expired).
func (d *Datapath) LeaseRemaining() (time.Duration, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, ErrClosed
	}
	var c rawConfig
	if err := d.objs.config.Lookup(uint32(0), &c); err != nil {
		return 0, fmt.Errorf("tcx: read config: %w", err)
	}
	now, err := monotonicNow()
	if err != nil {
		return 0, fmt.Errorf("tcx: %w", err)
	}
	return time.Duration(int64(c.AliveUntilNs - now)), nil
}

// KeepAlive renews the lease for ttl every period until ctx is done, then
// returns nil (the lease then runs out by itself), or returns the first
// renewal error. A period of a quarter of ttl (250 ms for 1 s) rides out
// a late tick or two.
func (d *Datapath) KeepAlive(ctx context.Context, period, ttl time.Duration) error {
	if period <= 0 || ttl < period {
		return fmt.Errorf("tcx: keepalive period %v must be positive and at most the lease %v", period, ttl)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if err := d.RenewLease(ttl); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// SetVerdict writes a flow's verdict.
func (d *Datapath) SetVerdict(k FlowKey, v Verdict) error {
	raw, err := k.Raw()
	if err != nil {
		return err
	}
	if v.Action > Refused {
		return fmt.Errorf("tcx: verdict for %v: unknown action %d", k, v.Action)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return ErrClosed
	}
	if v.Action == Undecided {
		if err := d.objs.verdicts.Delete(&raw); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("tcx: forget verdict for %v: %w", k, err)
		}
		return nil
	}
	if err := d.objs.verdicts.Update(&raw, v.raw(), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("tcx: set verdict for %v: %w", k, err)
	}
	return nil
}

// Release lets the flow's packets pass on the fast path. For TCP only the
// client bytes before tcpSeqEnd pass (the sequence number after the last
// decided byte); a packet carrying later bytes is queued, and so is a SYN
// (a new connection on the same ports), which also clears the verdict.
// Call it again with a later tcpSeqEnd as each request is decided. For
// other protocols tcpSeqEnd is ignored.
func (d *Datapath) Release(k FlowKey, tcpSeqEnd uint32) error {
	v := Verdict{Action: Released}
	if k.Proto == ProtoTCP {
		v.TCPRange, v.SeqEnd = true, tcpSeqEnd
	}
	return d.SetVerdict(k, v)
}

// ReleaseFlow lets every packet of the flow pass on the fast path, TCP
// included, with no byte range: for flows whose every effect policy
// releases (an internal channel such as the model provider).
func (d *Datapath) ReleaseFlow(k FlowKey) error {
	return d.SetVerdict(k, Verdict{Action: Released})
}

// ReleaseFlowAt is ReleaseFlow for a flow whose content carbd does not
// see, decided when the read generation was gen (Generation, read before
// the decision brought the file tracer up to date): its packets with data
// pass only until the agent reads again, then they are queued
// (QueueRead) for the flow to be released again at the new generation or
// decided again.
func (d *Datapath) ReleaseFlowAt(k FlowKey, gen uint64) error {
	return d.SetVerdict(k, Verdict{Action: Released, ReadGen: true, Gen: gen})
}

// Generation reads the sandbox's read generation (Config.ReadGen).
func (d *Datapath) Generation() (uint64, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, ErrClosed
	}
	return readGeneration(d.objs.readGen)
}

// ReadGen is the read generation map the program compares against: the
// one of Config.ReadGen, or the pinned one an adopter found, to hand to
// the file tracer (pkg/hooks/fileev Config.ReadGen). The Datapath owns
// it: it is closed with the Datapath.
func (d *Datapath) ReadGen() *ebpf.Map { return d.objs.readGen }

func readGeneration(m *ebpf.Map) (uint64, error) {
	var g uint64
	if err := m.Lookup(uint32(0), &g); err != nil {
		return 0, fmt.Errorf("tcx: read the read generation: %w", err)
	}
	return g, nil
}

// NewReadGen creates a read generation map for one sandbox, to hand to
// both Config.ReadGen and the file tracer (pkg/hooks/fileev
// Config.ReadGen). The caller closes it once both are loaded (they hold
// their own references).
func NewReadGen() (*ebpf.Map, error) {
	spec, err := loadSpec(0)
	if err != nil {
		return nil, err
	}
	m, err := ebpf.NewMap(spec.Maps[readGenName].Copy())
	if err != nil {
		return nil, fmt.Errorf("tcx: create %s: %w", readGenName, err)
	}
	return m, nil
}

// Refuse drops the flow's packets in the program.
func (d *Datapath) Refuse(k FlowKey) error {
	return d.SetVerdict(k, Verdict{Action: Refused})
}

// Forget removes the flow's verdict and state: its next packet is queued
// as undecided. Forgetting an unknown flow is not an error.
func (d *Datapath) Forget(k FlowKey) error {
	raw, err := k.Raw()
	if err != nil {
		return err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return ErrClosed
	}
	for _, m := range []*ebpf.Map{d.objs.verdicts, d.objs.flows} {
		if err := m.Delete(&raw); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("tcx: forget %v: %w", k, err)
		}
	}
	return nil
}

// Verdict returns the flow's verdict (Undecided when it has none).
func (d *Datapath) Verdict(k FlowKey) (Verdict, error) {
	raw, err := k.Raw()
	if err != nil {
		return Verdict{}, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return Verdict{}, ErrClosed
	}
	return d.lookupVerdict(&raw)
}

func (d *Datapath) lookupVerdict(raw *RawFlowKey) (Verdict, error) {
	var rv rawVerdict
	if err := d.objs.verdicts.Lookup(raw, &rv); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Verdict{}, nil
		}
		return Verdict{}, fmt.Errorf("tcx: read verdict: %w", err)
	}
	return rv.verdict(), nil
}

// Counters reads the global counters, summed over CPUs.
func (d *Datapath) Counters() (Counters, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return Counters{}, ErrClosed
	}
	return readCounters(d.objs.counters)
}

func readCounters(m *ebpf.Map) (Counters, error) {
	var c Counters
	var per []rawCounter
	for r := Reason(0); r < NumReasons; r++ {
		if err := m.Lookup(uint32(r), &per); err != nil {
			return Counters{}, fmt.Errorf("tcx: read counter %s: %w", r, err)
		}
		for _, p := range per {
			c[r] = c[r].add(Count(p))
		}
	}
	return c, nil
}

// Flows lists the flow table with each flow's verdict. The table changes
// while it is read; a flow may be missed or seen twice.
func (d *Datapath) Flows() ([]Flow, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return nil, ErrClosed
	}
	mono, err := monotonicNow()
	if err != nil {
		return nil, fmt.Errorf("tcx: %w", err)
	}
	wall := time.Now()
	var (
		raw RawFlowKey
		st  rawFlowStats
		out []Flow
	)
	it := d.objs.flows.Iterate()
	for it.Next(&raw, &st) {
		k, err := raw.FlowKey()
		if err != nil {
			return nil, err
		}
		v, err := d.lookupVerdict(&raw)
		if err != nil {
			return nil, err
		}
		out = append(out, Flow{
			Key: k, Packets: st.Packets, Bytes: st.Bytes,
			FirstSeen: wallFromMono(st.FirstNs, mono, wall),
			LastSeen:  wallFromMono(st.LastNs, mono, wall),
			Verdict:   v,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("tcx: read flows: %w", err)
	}
	return out, nil
}

// Close is the clean stop: it detaches the program, removes the pins and
// the sandbox's directory. The interface then carries traffic unmarked,
// which carbd's netfilter rules drop (pkg/hooks/nfrules).
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.closed = true
	var errs []error
	switch d.mode {
	case ModeTCX:
		if err := d.link.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach link: %w", err))
		}
		if err := d.link.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
		d.link.Close()
	case ModeLegacy:
		if err := detachLegacy(d.netns, d.ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	d.prog.Close()
	d.objs.close()
	if err := os.RemoveAll(d.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove pins: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tcx: close %s: %w", d.id, err)
	}
	return nil
}

// Leave closes this process's handles and leaves the program attached
// and pinned, as a crash would: it goes on enforcing the verdicts, and
// drops everything once its lease lapses, until a new carbd Adopts it.
func (d *Datapath) Leave() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.closed = true
	d.release()
	return nil
}

// Remove detaches and unpins the datapath pinned for cfg.SandboxID,
// whether or not some process holds it: the clean stop of a sandbox whose
// carbd is gone, and the cleanup of pins a carbd left half made. For a
// legacy attachment cfg.NetNS must name the interface's namespace.
// Nothing pinned is not an error.
func Remove(cfg Config) error {
	if err := validSandboxID(cfg.SandboxID); err != nil {
		return err
	}
	dir := cfg.pinDir()
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	if d, err := Adopt(cfg); err == nil {
		return d.Close()
	}
	// Adopt failed (half-made pins, or maps of another carbd version):
	// detach what can be found, then drop the pins.
	var errs []error
	if l, err := link.LoadPinnedLink(filepath.Join(dir, pinLink), nil); err == nil {
		if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach link: %w", err))
		}
		l.Close()
	}
	if m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "config"), nil); err == nil {
		var c rawConfig
		if m.Lookup(uint32(0), &c) == nil && Mode(c.AttachMode) == ModeLegacy {
			if err := detachLegacy(cfg.NetNS, int(c.Ifindex)); err != nil {
				errs = append(errs, err)
			}
		}
		m.Close()
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove pins: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tcx: remove %s: %w", cfg.SandboxID, err)
	}
	return nil
}

// release closes the handles without detaching anything.
func (d *Datapath) release() {
	if d.link != nil {
		d.link.Close()
	}
	if d.prog != nil {
		d.prog.Close()
	}
	d.objs.close()
}
