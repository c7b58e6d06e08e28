package nfq

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A /proc/net/netfilter/nfnetlink_queue as Linux 6.x prints it.
const sampleProc = `    0  12345     0 2 65535     0     0        0  1
 4242 -4000000     3 2 65535   171     9      812  1
`

func TestParseQueueProc(t *testing.T) {
	q, err := parseQueueProc([]byte(sampleProc), 0)
	if err != nil {
		t.Fatal(err)
	}
	want := QueueProc{Queue: 0, PortID: 12345, CopyMode: 2, CopyLen: 65535}
	if diff := cmp.Diff(want, q); diff != "" {
		t.Errorf("queue 0 (-want +got):\n%s", diff)
	}
	// A number that is not one (the kernel prints them all %u) is an
	// error that names the line and field.
	if _, err := parseQueueProc([]byte(sampleProc), 4242); err == nil || !strings.Contains(err.Error(), "line 2 field 2") {
		t.Errorf("negative port id: %v, want an error naming line 2 field 2", err)
	}
	line := " 4242  4000000     3 2 65535   171     9      812  1\n"
	q, err = parseQueueProc([]byte(line), 4242)
	if err != nil {
		t.Fatal(err)
	}
	want = QueueProc{Queue: 4242, PortID: 4000000, Total: 3, CopyMode: 2, CopyLen: 65535, Dropped: 171, UserDropped: 9, IDSequence: 812}
	if diff := cmp.Diff(want, q); diff != "" {
		t.Errorf("queue 4242 (-want +got):\n%s", diff)
	}
	if _, err := parseQueueProc([]byte(line), 7); !errors.Is(err, ErrNoQueue) {
		t.Errorf("absent queue: %v, want ErrNoQueue", err)
	}
	for _, bad := range []string{"1 2 3\n", " 70000 1 1 1 1 1 1 1 1\n", "x 1 1 1 1 1 1 1 1\n"} {
		if _, err := parseQueueProc([]byte(bad), 1); err == nil || errors.Is(err, ErrNoQueue) {
			t.Errorf("%q: %v, want a parse error", bad, err)
		}
	}
}

// FuzzParseQueueProc: never panics; a line it reads back gives the
// numbers that were written.
func FuzzParseQueueProc(f *testing.F) {
	f.Add([]byte(sampleProc), uint16(0))
	f.Add([]byte(" 7 1 2 2 65535 3 4 5 1\n"), uint16(7))
	f.Add([]byte("\n\n 1 1\n"), uint16(1))
	f.Fuzz(func(t *testing.T, b []byte, num uint16) {
		q, err := parseQueueProc(b, num)
		if err != nil {
			return
		}
		if q.Queue != num {
			t.Fatalf("asked for queue %d, got %d", num, q.Queue)
		}
		line := fmt.Sprintf("%d %d %d %d %d %d %d %d 1\n", q.Queue, q.PortID, q.Total, q.CopyMode, q.CopyLen, q.Dropped, q.UserDropped, q.IDSequence)
		q2, err := parseQueueProc([]byte(line), num)
		if err != nil || q2 != q {
			t.Fatalf("round trip %q: %+v %v, want %+v", line, q2, err, q)
		}
	})
}
