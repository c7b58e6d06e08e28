package nfq

import (
	"fmt"
	"os"

	"github.com/carbd/carbd/internal/netnsx"
)

// inNetNS runs fn inside the network namespace at path (the caller's when
// path is empty), on a thread that never returns to the pool in the wrong
// namespace (see internal/netnsx).
func inNetNS(path string, fn func() error) error { return netnsx.Do(path, fn) }

// readQueueProc reads the queue's line of /proc/net/netfilter/nfnetlink_queue
// in the namespace at nsPath.
func readQueueProc(nsPath string, num uint16) (QueueProc, error) {
	var b []byte
	err := inNetNS(nsPath, func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/netfilter/nfnetlink_queue")
		return err
	})
	if err != nil {
		return QueueProc{}, fmt.Errorf("nfq: %w", err)
	}
	return parseQueueProc(b, num)
}
