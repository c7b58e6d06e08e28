//go:build linux

package fileev

import (
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Sizes of bpf/include/ftrace_events.h.
const (
	maxSlots    = 256 // FT_MAX_SLOTS
	counterKeys = 4   // FT_C_MAX: counters per slot
)

// ftTarget is struct ft_target.
type ftTarget struct {
	ID    uint32
	Flags uint32
	Slot  uint32
	Level uint32
	Epoch uint32
}

const ftFollow = 1

// ftSlot is struct ft_slot.
type ftSlot struct {
	WakeupNS    uint64
	WakeupBytes uint64
	LastWakeup  uint64
	OwnerTgid   uint32
	GenDev      uint32
	DataMax     uint32
	Epoch       uint32
}

// host is the file tracer's programs and maps: one instance serves every
// Tracer (every sandbox) through slots.
type host struct {
	mech string

	slots, rings, gens, levels, pids, cgroups, counters *ebpf.Map
	marker                                              *ebpf.Program
	// progs are the tracing programs when this process loaded them
	// (for their statistics); nil otherwise.
	progs map[string]*ebpf.Program

	coll    *ebpf.Collection // loaded by this process
	links   []link.Link      // attached by this process
	closers []io.Closer      // opened from pins by this process
}

// progNames are the programs of each mechanism and the tracepoint each
// attaches to.
var progNames = map[string][][2]string{
	MechTPBTF: {{"ft_enter_btf", "sys_enter"}, {"ft_exit_btf", "sys_exit"},
		{"ft_fork_btf", "sched_process_fork"}, {"ft_pexit_btf", "sched_process_exit"}},
	MechRawTP: {{"ft_enter_raw", "sys_enter"}, {"ft_exit_raw", "sys_exit"},
		{"ft_fork_raw", "sched_process_fork"}, {"ft_pexit_raw", "sched_process_exit"}},
}

// unusedInflight names, per mechanism, the in-flight map its programs do
// not use.
var unusedInflight = map[string]string{MechTPBTF: "ft_inflight", MechRawTP: "ft_task"}

// loadHost loads the programs of mech and their maps and attaches them.
// Nothing is traced until a slot's targets are added.
func loadHost(mech string) (_ *host, err error) {
	spec, err := loadSpec()
	if err != nil {
		return nil, err
	}
	keep := map[string]bool{"ft_marker": true}
	for _, p := range progNames[mech] {
		keep[p[0]] = true
	}
	for name := range spec.Programs {
		if !keep[name] {
			delete(spec.Programs, name)
		}
	}
	// The syscalls in flight: task-local storage for tp_btf, a hash map
	// by thread id for raw_tracepoint; the other mechanism's map is not
	// created (a kernel without BTF-typed tracing may lack task storage).
	delete(spec.Maps, unusedInflight[mech])
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	h := &host{mech: mech, coll: coll}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	h.fromCollection(coll)
	// Attach the exit side first: an enter without its exit would leave
	// entries that nothing removes.
	for i := len(progNames[mech]) - 1; i >= 0; i-- {
		p := progNames[mech][i]
		var l link.Link
		if mech == MechTPBTF {
			l, err = link.AttachTracing(link.TracingOptions{Program: coll.Programs[p[0]], AttachType: ebpf.AttachTraceRawTp})
		} else {
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: p[1], Program: coll.Programs[p[0]]})
		}
		if err != nil {
			return nil, fmt.Errorf("attach program to %s: %w", p[1], err)
		}
		h.links = append(h.links, l)
	}
	return h, nil
}

func (h *host) fromCollection(coll *ebpf.Collection) {
	h.slots, h.rings, h.gens, h.levels = coll.Maps["ft_slots"], coll.Maps["ft_rings"], coll.Maps["ft_gens"], coll.Maps["ft_levels"]
	h.pids, h.cgroups, h.counters = coll.Maps["ft_pids"], coll.Maps["ft_cgroups"], coll.Maps["ft_counters"]
	h.marker = coll.Programs["ft_marker"]
	h.progs = map[string]*ebpf.Program{}
	for name, p := range coll.Programs {
		h.progs[name] = p
	}
}

// close detaches what this process attached and closes its handles.
func (h *host) close() {
	for i := len(h.links) - 1; i >= 0; i-- {
		h.links[i].Close()
	}
	h.links = nil
	if h.coll != nil {
		h.coll.Close()
		h.coll = nil
	}
	for _, c := range h.closers {
		c.Close()
	}
	h.closers = nil
}

// slot is one Tracer's share of a host.
type slot struct {
	h     *host
	n     uint32
	epoch uint32    // ftSlot.Epoch: this owner's, carried by its targets
	ring  *ebpf.Map // the slot's ring buffer, made by this process
	gen   *ebpf.Map // the slot's read generation
	own   bool      // gen was made here
}

// open sets slot n up: its settings, zeroed counters, its ring and read
// generation inserted. gen nil: a read generation of its own.
func (h *host) open(n uint32, cfg ftSlot, ringBytes int, gen *ebpf.Map) (_ *slot, err error) {
	s := &slot{h: h, n: n, gen: gen}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.ring, err = ebpf.NewMap(&ebpf.MapSpec{Name: "ft_ring", Type: ebpf.RingBuf, MaxEntries: uint32(ringBytes)})
	if err != nil {
		return nil, fmt.Errorf("create ring buffer: %w", err)
	}
	if s.gen == nil {
		s.gen, err = ebpf.NewMap(&ebpf.MapSpec{Name: "read_gen", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
		if err != nil {
			return nil, fmt.Errorf("create read generation: %w", err)
		}
		s.own = true
	}
	var prev ftSlot
	if err := h.slots.Lookup(n, &prev); err != nil {
		return nil, fmt.Errorf("read slot %d: %w", n, err)
	}
	cfg.Epoch = prev.Epoch + 1
	s.epoch = cfg.Epoch
	if err := h.slots.Update(n, cfg, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("set slot %d: %w", n, err)
	}
	zero := make([]uint64, runtime.NumCPU())
	if ncpu, err := ebpf.PossibleCPU(); err == nil {
		zero = make([]uint64, ncpu)
	}
	for i := range uint32(counterKeys) {
		if err := h.counters.Update(n*counterKeys+i, zero, ebpf.UpdateAny); err != nil {
			return nil, fmt.Errorf("zero counters of slot %d: %w", n, err)
		}
	}
	if err := h.gens.Update(n, s.gen, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("insert read generation of slot %d: %w", n, err)
	}
	if err := h.rings.Update(n, s.ring, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("insert ring buffer of slot %d: %w", n, err)
	}
	return s, nil
}

// clear removes every trace of slot n from the host's maps: its targets,
// its ring and its read generation. The cgroup levels are recomputed.
func (h *host) clear(n uint32) error {
	var errs []error
	for _, m := range []*ebpf.Map{h.rings, h.gens} {
		if err := m.Delete(n); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	if err := deleteWhere(h.pids, func(v ftTarget) bool { return v.Slot == n }, new(uint32)); err != nil {
		errs = append(errs, err)
	}
	if err := deleteWhere(h.cgroups, func(v ftTarget) bool { return v.Slot == n }, new(uint64)); err != nil {
		errs = append(errs, err)
	}
	if err := h.syncLevels(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clear slot %d: %w", n, err)
	}
	return nil
}

// deleteWhere deletes the entries of m whose value matches; key is a
// pointer to a key of m's type.
func deleteWhere[K uint32 | uint64](m *ebpf.Map, match func(ftTarget) bool, key *K) error {
	var val ftTarget
	var drop []K
	it := m.Iterate()
	for it.Next(key, &val) {
		if match(val) {
			drop = append(drop, *key)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range drop {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// syncLevels writes the union of the traced cgroups' levels, read from
// the cgroup map itself (every slot's entries), to ft_levels.
func (h *host) syncLevels() error {
	var mask uint32
	var key uint64
	var val ftTarget
	it := h.cgroups.Iterate()
	for it.Next(&key, &val) {
		if val.Level < maxCgroupLevel {
			mask |= 1 << val.Level
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("fileev: read traced cgroups: %w", err)
	}
	if err := h.levels.Update(uint32(0), mask, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("fileev: set cgroup levels: %w", err)
	}
	return nil
}

// lastWakeup reads the kernel side's last forced wake-up of the slot.
func (s *slot) lastWakeup() (uint64, error) {
	var v ftSlot
	if err := s.h.slots.Lookup(s.n, &v); err != nil {
		return 0, err
	}
	return v.LastWakeup, nil
}

// close closes the slot's own maps (the host's references, if any, stay
// until the slot is cleared).
func (s *slot) close() {
	if s.ring != nil {
		s.ring.Close()
	}
	if s.own && s.gen != nil {
		s.gen.Close()
	}
}
