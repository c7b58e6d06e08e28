package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/carbd/carbd/pkg/decide"
)

// A missing working directory is one error that says so, not three.
func TestValidateMissingWorkdir(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	c := Config{Workdir: missing, Policy: &decide.Policy{}, Argv: []string{"true"}}
	err := c.validate()
	if err == nil {
		t.Fatal("no error for a missing working directory")
	}
	msg := err.Error()
	if os.Geteuid() != 0 {
		msg = strings.Replace(msg, "carbd run needs root (BPF, netfilter, namespaces, overlayfs mounts)\n", "", 1)
	}
	if msg != "working directory "+missing+": no such file or directory" {
		t.Errorf("got %q", msg)
	}
}
