//go:build linux

package fileev

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/carbd/carbd/internal/bpffs"
)

// DefaultPinDir is where the host's one file tracer is pinned
// (Config.PinDir): DefaultPinDir/<mechanism>-<digest>/. The name cannot be
// a sandbox's pin directory of pkg/hooks/tcx (those have at most 20
// characters; bpffs refuses names with a dot).
const DefaultPinDir = "/sys/fs/bpf/carbd/host-shared-file-tracer"

// The pins of a shared tracer, in the order they are made: the maps, the
// marker, and last the links (a directory with every link pinned is
// complete).
var (
	pinMaps = []string{"ft_slots", "ft_rings", "ft_gens", "ft_levels", "ft_pids", "ft_cgroups", "ft_counters"}
)

func linkPin(tracepoint string) string { return "link_" + tracepoint }

const markerPin = "prog_ft_marker"

// hostTag names the directory of a tracer built from obj and attached
// with mech: a carbd of another build (another object) or probing another
// mechanism loads its own beside it.
func hostTag(obj []byte, mech string) string {
	h := sha256.New()
	h.Write(obj)
	h.Write([]byte{0})
	h.Write([]byte(mech))
	return mech + "-" + hex.EncodeToString(h.Sum(nil)[:8])
}

// shared is one Tracer's hold on the host's tracer: its slot's lock and
// where to give it back.
type shared struct {
	base, dir string
	lock      *os.File // slot-N, flocked for the Tracer's life
}

// lockDir opens dir and takes its flock (exclusive; nonblocking if nb).
// ok is false when nb and another open file holds it.
func lockDir(dir string, nb bool) (f *os.File, ok bool, err error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, err
	}
	how := unix.LOCK_EX
	if nb {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(fd, how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		if nb && errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", dir, err)
	}
	return os.NewFile(uintptr(fd), dir), true, nil
}

// slotDirs lists the slot numbers of dir (its slot-N directories).
func slotDirs(dir string) ([]uint32, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []uint32
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "slot-")
		if !ok || !e.IsDir() {
			continue
		}
		n, err := strconv.ParseUint(rest, 10, 32)
		if err != nil || n >= maxSlots {
			continue
		}
		out = append(out, uint32(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

func slotDir(dir string, n uint32) string {
	return filepath.Join(dir, "slot-"+strconv.FormatUint(uint64(n), 10))
}

// liveSlots says which slots of dir have an owner (their lock is held),
// and removes the directories of the others after calling gone for each
// (gone may be nil).
func liveSlots(dir string, gone func(n uint32) error) (live map[uint32]bool, err error) {
	ns, err := slotDirs(dir)
	if err != nil {
		return nil, err
	}
	live = map[uint32]bool{}
	for _, n := range ns {
		f, ok, err := lockDir(slotDir(dir, n), true)
		if err != nil {
			return nil, err
		}
		if !ok {
			live[n] = true
			continue
		}
		// Its owner is gone (a crashed carbd): its lock went with it.
		if gone != nil {
			if err := gone(n); err != nil {
				f.Close()
				return nil, fmt.Errorf("reclaim slot %d: %w", n, err)
			}
		}
		err = os.Remove(slotDir(dir, n))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reclaim slot %d: %w", n, err)
		}
	}
	return live, nil
}

// complete reports whether dir holds every pin of a tracer of mech.
func complete(dir, mech string) bool {
	names := append(append([]string{}, pinMaps...), markerPin)
	for _, p := range progNames[mech] {
		names = append(names, linkPin(p[1]))
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			return false
		}
	}
	return true
}

// openPinned opens the tracer pinned in dir: no program is loaded or
// verified, the kernel's BTF is not read.
func openPinned(dir, mech string) (_ *host, err error) {
	h := &host{mech: mech}
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	maps := map[string]**ebpf.Map{"ft_slots": &h.slots, "ft_rings": &h.rings, "ft_gens": &h.gens, "ft_levels": &h.levels,
		"ft_pids": &h.pids, "ft_cgroups": &h.cgroups, "ft_counters": &h.counters}
	for _, name := range pinMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned %s: %w", name, err)
		}
		h.closers = append(h.closers, m)
		*maps[name] = m
	}
	if h.marker, err = ebpf.LoadPinnedProgram(filepath.Join(dir, markerPin), nil); err != nil {
		return nil, fmt.Errorf("open pinned ft_marker: %w", err)
	}
	h.closers = append(h.closers, h.marker)
	return h, nil
}

// pin pins a host this process loaded into dir, links last.
func (h *host) pin(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for _, name := range pinMaps {
		if err := h.coll.Maps[name].Pin(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("pin %s: %w", name, err)
		}
	}
	if err := h.marker.Pin(filepath.Join(dir, markerPin)); err != nil {
		return fmt.Errorf("pin ft_marker: %w", err)
	}
	// h.links were attached exit side first (reverse order of progNames).
	ps := progNames[h.mech]
	for i, l := range h.links {
		tp := ps[len(ps)-1-i][1]
		if err := l.Pin(filepath.Join(dir, linkPin(tp))); err != nil {
			return fmt.Errorf("pin link to %s: %w", tp, err)
		}
	}
	return nil
}

// sharedConfig is what openShared needs besides the slot's settings.
type sharedConfig struct {
	base      string
	order     []string // mechanisms to try, preferred first
	ringBytes int
	gen       *ebpf.Map
	slot      ftSlot
}

// openShared attaches to the host's tracer, loading and pinning it when
// no carbd has (or only another build has), and takes a slot of it:
// everything under the flock of the pin directory, so that loading,
// slot allocation and release are serialised between processes. Slots
// whose owner is gone are reclaimed on the way; so are the tracers of
// other builds that no live carbd uses.
func openShared(sc sharedConfig) (h *host, s *slot, sh *shared, note string, err error) {
	if err := bpffs.Ensure(sc.base); err != nil {
		return nil, nil, nil, "", err
	}
	baseLock, _, err := lockDir(sc.base, false)
	if err != nil {
		return nil, nil, nil, "", err
	}
	defer baseLock.Close() // unlocks

	obj := ftraceObject()
	ours := map[string]string{} // tag -> mech
	for _, m := range sc.order {
		ours[hostTag(obj, m)] = m
	}
	if err := sweep(sc.base, ours); err != nil {
		return nil, nil, nil, "", err
	}
	var dir string
	// A tracer of this build is there: use it.
	for _, m := range sc.order {
		d := filepath.Join(sc.base, hostTag(obj, m))
		if !complete(d, m) {
			continue
		}
		if h, err = openPinned(d, m); err != nil {
			return nil, nil, nil, "", err
		}
		dir = d
		break
	}
	// Load one, probing the mechanisms in order.
	if h == nil {
		var errs []error
		for _, m := range sc.order {
			d := filepath.Join(sc.base, hostTag(obj, m))
			if _, err := os.Lstat(d); err == nil {
				// Incomplete (its loader died while pinning) and
				// unused: sweep left it only if a slot is live.
				return nil, nil, nil, "", fmt.Errorf("shared tracer %s is incomplete but in use", d)
			}
			hh, err := loadHost(m)
			if err == nil {
				if err = hh.pin(d); err != nil {
					os.RemoveAll(d)
					hh.close()
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", m, err))
				continue
			}
			h, dir = hh, d
			break
		}
		if h == nil {
			return nil, nil, nil, "", fmt.Errorf("attach tracing programs: %w", errors.Join(errs...))
		}
		if len(errs) > 0 {
			note = errors.Join(errs...).Error()
		}
	}
	defer func() {
		if err != nil {
			h.close()
			removeIfUnused(dir)
		}
	}()
	// Reclaim the slots of crashed owners, then take the lowest free one.
	live, err := liveSlots(dir, h.clear)
	if err != nil {
		return nil, nil, nil, "", err
	}
	n := uint32(0)
	for ; n < maxSlots && live[n]; n++ {
	}
	if n == maxSlots {
		return nil, nil, nil, "", fmt.Errorf("all %d slots of the shared tracer are in use", maxSlots)
	}
	sd := slotDir(dir, n)
	if err := os.Mkdir(sd, 0o700); err != nil {
		return nil, nil, nil, "", fmt.Errorf("take slot %d: %w", n, err)
	}
	lock, ok, err := lockDir(sd, true)
	if err == nil && !ok {
		err = fmt.Errorf("slot %d is locked", n)
	}
	if err != nil {
		os.Remove(sd)
		return nil, nil, nil, "", fmt.Errorf("take slot %d: %w", n, err)
	}
	sh = &shared{base: sc.base, dir: dir, lock: lock}
	if s, err = h.open(n, sc.slot, sc.ringBytes, sc.gen); err != nil {
		os.Remove(sd)
		lock.Close()
		return nil, nil, nil, "", err
	}
	return h, s, sh, note, nil
}

// sweep removes the tracers of other builds (tags not in ours) that no
// live carbd uses, and the incomplete tracers of this build that none
// uses. Their links unpinned and no handle left, the kernel detaches them.
func sweep(base string, ours map[string]string) error {
	ents, err := os.ReadDir(base)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		d := filepath.Join(base, e.Name())
		if m, ok := ours[e.Name()]; ok && complete(d, m) {
			continue // its stale slots are reclaimed with its maps
		}
		live, err := liveSlots(d, nil)
		if err != nil {
			return fmt.Errorf("sweep %s: %w", d, err)
		}
		if len(live) == 0 {
			if err := os.RemoveAll(d); err != nil {
				return fmt.Errorf("sweep %s: %w", d, err)
			}
		}
	}
	return nil
}

// removeIfUnused unpins the tracer in dir when no slot of it is left.
func removeIfUnused(dir string) {
	if ns, err := slotDirs(dir); err == nil && len(ns) == 0 {
		os.RemoveAll(dir)
	}
}

// locked runs f under the host-wide lock.
func (sh *shared) locked(f func() error) error {
	if sh == nil {
		return ErrClosed
	}
	l, _, err := lockDir(sh.base, false)
	if err != nil {
		return fmt.Errorf("fileev: %w", err)
	}
	defer l.Close()
	return f()
}

// release gives slot s back: its entries leave the host's maps, its lock
// and directory go; the last one out unpins the tracer, which the kernel
// then detaches (once the last handle, possibly this process's, closes).
func (sh *shared) release(h *host, s *slot) error {
	baseLock, _, err := lockDir(sh.base, false)
	if err != nil {
		return err
	}
	defer baseLock.Close()
	var errs []error
	if err := h.clear(s.n); err != nil {
		errs = append(errs, err)
	}
	s.close()
	if err := os.Remove(slotDir(sh.dir, s.n)); err != nil {
		errs = append(errs, fmt.Errorf("remove slot %d: %w", s.n, err))
	}
	sh.lock.Close()
	removeIfUnused(sh.dir)
	h.close()
	return errors.Join(errs...)
}
