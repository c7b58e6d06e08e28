package daemon

import (
	"container/list"
	"time"
)

// lruTable is a map that forgets: at most max entries (the least recently
// touched go first), and an entry not touched for idle is dropped. Each
// operation is O(1) amortized. The caller locks.
type lruTable[K comparable, V any] struct {
	max  int
	idle time.Duration
	now  func() time.Time

	order *list.List // of *lruEntry, most recently touched first
	index map[K]*list.Element
	// evicted counts entries dropped by the bound or by idleness.
	evicted uint64
}

type lruEntry[K comparable, V any] struct {
	key  K
	val  V
	last time.Time
}

func newLRUTable[K comparable, V any](max int, idle time.Duration, now func() time.Time) *lruTable[K, V] {
	if now == nil {
		now = time.Now
	}
	return &lruTable[K, V]{max: max, idle: idle, now: now, order: list.New(), index: map[K]*list.Element{}}
}

// get returns the entry of k and touches it; an idle one is gone.
func (t *lruTable[K, V]) get(k K) (V, bool) {
	var zero V
	now := t.now()
	t.expire(now)
	el, ok := t.index[k]
	if !ok {
		return zero, false
	}
	e := el.Value.(*lruEntry[K, V])
	e.last = now
	t.order.MoveToFront(el)
	return e.val, true
}

// peek returns the entry of k without touching it.
func (t *lruTable[K, V]) peek(k K) (V, bool) {
	var zero V
	t.expire(t.now())
	el, ok := t.index[k]
	if !ok {
		return zero, false
	}
	return el.Value.(*lruEntry[K, V]).val, true
}

// put sets k's entry and touches it, dropping the least recently touched
// entries over the bound.
func (t *lruTable[K, V]) put(k K, v V) {
	now := t.now()
	t.expire(now)
	if el, ok := t.index[k]; ok {
		e := el.Value.(*lruEntry[K, V])
		e.val, e.last = v, now
		t.order.MoveToFront(el)
		return
	}
	t.index[k] = t.order.PushFront(&lruEntry[K, V]{key: k, val: v, last: now})
	for t.max > 0 && t.order.Len() > t.max {
		t.remove(t.order.Back())
		t.evicted++
	}
}

func (t *lruTable[K, V]) len() int { return t.order.Len() }

// expire drops the entries not touched for idle (the oldest are at the
// back).
func (t *lruTable[K, V]) expire(now time.Time) {
	if t.idle <= 0 {
		return
	}
	for el := t.order.Back(); el != nil; el = t.order.Back() {
		if now.Sub(el.Value.(*lruEntry[K, V]).last) < t.idle {
			return
		}
		t.remove(el)
		t.evicted++
	}
}

func (t *lruTable[K, V]) remove(el *list.Element) {
	delete(t.index, el.Value.(*lruEntry[K, V]).key)
	t.order.Remove(el)
}
