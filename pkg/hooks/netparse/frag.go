package netparse

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// maxDatagram is the largest reassembled IP payload accepted.
const maxDatagram = 65535

// errFragDup marks an exact duplicate of a fragment already held.
var errFragDup = errors.New("netparse: duplicate fragment")

type fragPart struct {
	off, end int
	data     []byte
}

type fragQueue struct {
	first   time.Time
	parts   []fragPart // sorted by offset, disjoint
	total   int        // datagram length, -1 until the last fragment arrives
	bytes   int
	refused bool // an overlap or a bound refused it: later fragments are refused too
	head    Packet
	hasHead bool
}

// reassembler reassembles IP fragments with bounded memory. Overlapping
// fragments refuse the whole datagram, including fragments still to come
// (RFC 5722, applied to IPv4 as well). It never reads the clock.
type reassembler struct {
	cfg    *Config
	queues map[FragKey]*fragQueue
	bytes  int
	buf    []byte
}

func newReassembler(cfg *Config) *reassembler {
	return &reassembler{cfg: cfg, queues: make(map[FragKey]*fragQueue)}
}

// add adds the fragment p. It returns the reassembled payload (valid until
// the next call) and the first fragment's packet when the datagram is
// complete, nil when more fragments are needed, errFragDup for an exact
// duplicate, or an error that refuses the datagram.
func (r *reassembler) add(now time.Time, p *Packet) ([]byte, *Packet, error) {
	key := p.Datagram
	q := r.queues[key]
	if q == nil {
		if len(r.queues) >= r.cfg.MaxFragDatagrams {
			r.expire(now, nil)
			if len(r.queues) >= r.cfg.MaxFragDatagrams {
				return nil, nil, fmt.Errorf("%w: %d datagrams under reassembly", ErrFragFull, len(r.queues))
			}
		}
		q = &fragQueue{first: now, total: -1}
		r.queues[key] = q
	}
	if q.refused {
		return nil, nil, ErrFragRefused
	}
	off, n := p.Frag.Offset, len(p.Payload)
	end := off + n
	switch {
	case n == 0:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: empty fragment at offset %d", ErrFragBad, off))
	case p.Frag.More && n%8 != 0:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: non-last fragment of %d bytes (not a multiple of 8)", ErrFragBad, n))
	case end > maxDatagram:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: fragment ends at %d", ErrFragTooBig, end))
	case !p.Frag.More && q.total >= 0 && end != q.total:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: second last fragment ends at %d, first at %d", ErrFragBad, end, q.total))
	case q.total >= 0 && end > q.total:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: fragment ends at %d past the datagram end %d", ErrFragBad, end, q.total))
	case !p.Frag.More && len(q.parts) > 0 && q.parts[len(q.parts)-1].end > end:
		return nil, nil, r.refuse(q, fmt.Errorf("%w: last fragment ends at %d before data held up to %d", ErrFragBad, end, q.parts[len(q.parts)-1].end))
	}
	// Find the insertion point and check for overlaps.
	i := 0
	for i < len(q.parts) && q.parts[i].end <= off {
		i++
	}
	if i < len(q.parts) && q.parts[i].off < end {
		h := q.parts[i]
		if h.off == off && h.end == end && bytes.Equal(h.data, p.Payload) {
			return nil, nil, errFragDup
		}
		return nil, nil, r.refuse(q, fmt.Errorf("%w: bytes %d-%d overlap bytes %d-%d", ErrFragOverlap, off, end, h.off, h.end))
	}
	if len(q.parts) >= r.cfg.MaxFragments {
		return nil, nil, r.refuse(q, fmt.Errorf("%w: more than %d", ErrFragTooMany, r.cfg.MaxFragments))
	}
	if r.bytes+n > r.cfg.MaxFragBytes {
		return nil, nil, r.refuse(q, fmt.Errorf("%w: %d bytes held", ErrFragFull, r.bytes))
	}
	data := append([]byte(nil), p.Payload...)
	q.parts = append(q.parts, fragPart{})
	copy(q.parts[i+1:], q.parts[i:])
	q.parts[i] = fragPart{off: off, end: end, data: data}
	q.bytes += n
	r.bytes += n
	if !p.Frag.More {
		q.total = end
	}
	if off == 0 {
		q.head = *p
		q.head.Payload = nil
		q.hasHead = true
	}
	if q.total < 0 || !q.hasHead {
		return nil, nil, nil
	}
	at := 0
	for _, part := range q.parts {
		if part.off != at {
			return nil, nil, nil
		}
		at = part.end
	}
	if at != q.total {
		return nil, nil, nil
	}
	if cap(r.buf) < q.total {
		r.buf = make([]byte, q.total, max(q.total, 2048))
	}
	r.buf = r.buf[:q.total]
	for _, part := range q.parts {
		copy(r.buf[part.off:], part.data)
	}
	head := q.head
	r.drop(key, q)
	return r.buf, &head, nil
}

// refuse marks the datagram refused and frees its data; the entry stays
// until it expires so that later fragments are refused too.
func (r *reassembler) refuse(q *fragQueue, err error) error {
	r.bytes -= q.bytes
	q.bytes, q.parts, q.refused = 0, nil, true
	return err
}

func (r *reassembler) drop(key FragKey, q *fragQueue) {
	r.bytes -= q.bytes
	delete(r.queues, key)
}

// expire drops datagrams older than FragTimeout and appends the keys of
// the incomplete ones (whose held fragments the caller must drop) to out.
func (r *reassembler) expire(now time.Time, out []FragKey) []FragKey {
	for k, q := range r.queues {
		if now.Sub(q.first) >= r.cfg.FragTimeout {
			if !q.refused {
				out = append(out, k)
			}
			r.drop(k, q)
		}
	}
	return out
}
