package staging

import (
	"sort"
	"strings"
	"sync"

	"github.com/carbd/carbd/pkg/decide"
)

// Labels are the labels of paths of W (Kairos §III-C): a path written
// by the agent carries the combined label of everything the agent had
// read before writing it, and a later read of the path carries it.
//
// Committed labels are persisted in the state directory's index file,
// which Commit replaces atomically under the same journal as W; pending
// labels belong to staged, uncommitted writes and live in memory only:
// Commit makes them permanent, Abort discards them.
//
// Labels is safe for concurrent use.
type Labels struct {
	mu        sync.RWMutex
	committed map[string]indexEntry   // guarded by mu; replaced, never mutated, by commits
	pending   map[string]decide.Label // guarded by mu
	// sorted lists committed's paths in order, built by the first Under
	// after a commit replaced the index; guarded by mu (nil: not built).
	sorted []string
	// base is the index as Open loaded it: the labels of the content of
	// the frozen base B (a commit replaces committed, never base).
	base map[string]indexEntry
	// bySize lists B's labelled regular files by size and baseSums their
	// contents' SHA-256, built on first use by Stager.SourceLabel.
	sourceMu sync.Mutex
	bySize   map[int64][]string  // guarded by sourceMu
	baseSums map[string][32]byte // guarded by sourceMu
}

func newLabels(idx map[string]indexEntry) *Labels {
	return &Labels{committed: idx, base: idx, pending: make(map[string]decide.Label)}
}

// baseLabel returns the label path had when the run opened: the label of
// B's content at path.
func (l *Labels) baseLabel(path string) (decide.Label, bool) {
	e, ok := l.base[path]
	if !ok || !e.HasLabel {
		return decide.Label{}, false
	}
	return e.Label, true
}

// pendingSnapshot copies the pending labels.
func (l *Labels) pendingSnapshot() map[string]decide.Label {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make(map[string]decide.Label, len(l.pending))
	for k, v := range l.pending {
		out[k] = v
	}
	return out
}

// Get returns the label a read of path carries: the pending label of a
// staged write if there is one (the guest reads the staged content),
// else the committed label.
func (l *Labels) Get(path string) (decide.Label, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if lb, ok := l.pending[path]; ok {
		return lb, true
	}
	e, ok := l.committed[path]
	if !ok || !e.HasLabel {
		return decide.Label{}, false
	}
	return e.Label, true
}

// Committed returns the persisted label of path.
func (l *Labels) Committed(path string) (decide.Label, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	e, ok := l.committed[path]
	if !ok || !e.HasLabel {
		return decide.Label{}, false
	}
	return e.Label, true
}

// Under returns the labels of the paths strictly below dir (committed
// and pending; a path with both has their join), keyed by their full
// paths: a rename or a link of dir carries them to its new name
// (decide.Options.LocationLabelsUnder).
func (l *Labels) Under(dir string) map[string]decide.Label {
	out := map[string]decide.Label{}
	if dir == "" {
		return out
	}
	prefix := dir + "/"
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sorted == nil {
		l.sorted = make([]string, 0, len(l.committed))
		for p, e := range l.committed {
			if e.HasLabel {
				l.sorted = append(l.sorted, p)
			}
		}
		sort.Strings(l.sorted)
	}
	for i := sort.SearchStrings(l.sorted, prefix); i < len(l.sorted) && strings.HasPrefix(l.sorted[i], prefix); i++ {
		out[l.sorted[i]] = l.committed[l.sorted[i]].Label
	}
	for p, lb := range l.pending {
		if strings.HasPrefix(p, prefix) {
			if o, ok := out[p]; ok {
				lb = lb.Combine(o)
			}
			out[p] = lb
		}
	}
	return out
}

// Pending returns the staged label of path.
func (l *Labels) Pending(path string) (decide.Label, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	lb, ok := l.pending[path]
	return lb, ok
}

// Len returns the number of committed labels.
func (l *Labels) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := 0
	for _, e := range l.committed {
		if e.HasLabel {
			n++
		}
	}
	return n
}

// stage records a pending label; several writes to one path combine
// towards the conservative label.
func (l *Labels) stage(path string, lb decide.Label) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.pending[path]; ok {
		lb = old.Combine(lb)
	}
	l.pending[path] = lb
}

// drop discards the pending labels of path and everything below it.
func (l *Labels) drop(path string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, path)
	for p := range l.pending {
		if under(p, path) {
			delete(l.pending, p)
		}
	}
}

// snapshot returns the committed index (not to be modified).
func (l *Labels) snapshot() map[string]indexEntry {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.committed
}

// clearPending discards every pending label.
func (l *Labels) clearPending() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.pending)
}

// install replaces the committed index and removes the pending labels
// that the commit made permanent.
func (l *Labels) install(idx map[string]indexEntry, committedPending []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed = idx
	l.sorted = nil
	for _, p := range committedPending {
		delete(l.pending, p)
	}
}
