package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultAuditLogMaxBytes is the size from which a run starts the
// sandbox's decision log afresh (Config.AuditLogMaxBytes).
const DefaultAuditLogMaxBytes = 64 << 20

// auditLogName is the decision log in the sandbox's state directory.
const auditLogName = "audit.jsonl"

// openAuditLog opens the decision log in dir (<state>/sandboxes/<id>) for
// appending. The directory outlives the run and every run of a working
// directory has the same sandbox id, so the log gathered every run's
// decisions for as long as the host was up, in /run, a tmpfs: memory
// (about 85 KiB a run of the soak's agent, docs/soak.md). A log of max
// bytes or more is renamed to audit.jsonl.1 (replacing the one there)
// before the run appends to it, so the two hold at most about 2*max plus
// one run's decisions. max 0: DefaultAuditLogMaxBytes; negative: never.
// The record of every run is elsewhere: the pcapng audit of the
// working directory's state, and --audit FILE.
func openAuditLog(dir string, max int64) (*os.File, error) {
	if max == 0 {
		max = DefaultAuditLogMaxBytes
	}
	p := filepath.Join(dir, auditLogName)
	if fi, err := os.Lstat(p); err == nil && max > 0 && fi.Mode().IsRegular() && fi.Size() >= max {
		if err := os.Rename(p, p+".1"); err != nil {
			return nil, fmt.Errorf("audit log: rotate: %w", err)
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return f, nil
}
