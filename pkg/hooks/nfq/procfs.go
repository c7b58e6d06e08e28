package nfq

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// QueueProc is one line of /proc/net/netfilter/nfnetlink_queue: the
// kernel's view of a queue.
type QueueProc struct {
	Queue    uint16
	PortID   uint32 // the netlink port id of the listener
	Total    uint32 // packets queued now (waiting for a verdict)
	CopyMode uint8
	CopyLen  uint32
	// Dropped: packets the kernel dropped because the queue was full
	// (MaxQueueLen).
	Dropped uint32
	// UserDropped: packets the kernel could not deliver to the listener
	// (the socket's receive buffer was full); dropped too.
	UserDropped uint32
	IDSequence  uint32 // the last packet id handed out
}

// ErrNoQueue: the queue has no line in the proc file (nobody is bound to
// it).
var ErrNoQueue = errors.New("nfq: queue not in /proc/net/netfilter/nfnetlink_queue")

// parseQueueProc finds queue num in the contents of
// /proc/net/netfilter/nfnetlink_queue. Each line has nine fields:
// queue_number peer_portid queue_total copy_mode copy_range queue_dropped
// queue_user_dropped id_sequence 1.
func parseQueueProc(b []byte, num uint16) (QueueProc, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 8 {
			return QueueProc{}, fmt.Errorf("nfq: nfnetlink_queue line %d: %d fields, want 9", line, len(f))
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil {
				return QueueProc{}, fmt.Errorf("nfq: nfnetlink_queue line %d field %d: %w", line, i+1, err)
			}
			v[i] = n
		}
		if v[0] > 0xffff || v[3] > 0xff {
			return QueueProc{}, fmt.Errorf("nfq: nfnetlink_queue line %d: queue %d or copy mode %d out of range", line, v[0], v[3])
		}
		if uint16(v[0]) != num {
			continue
		}
		return QueueProc{
			Queue: uint16(v[0]), PortID: uint32(v[1]), Total: uint32(v[2]), CopyMode: uint8(v[3]),
			CopyLen: uint32(v[4]), Dropped: uint32(v[5]), UserDropped: uint32(v[6]), IDSequence: uint32(v[7]),
		}, nil
	}
	if err := sc.Err(); err != nil {
		return QueueProc{}, fmt.Errorf("nfq: read nfnetlink_queue: %w", err)
	}
	return QueueProc{}, fmt.Errorf("%w: queue %d", ErrNoQueue, num)
}
