package daemon

import (
	"os"
	"path/filepath"
	"strconv"
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

// An id that cannot name the host-wide resources is refused before any
// directory is made from it.
func TestValidateSandboxID(t *testing.T) {
	for _, id := range []string{"../../etc/x", "UPPER", "a/b", "-lead", "twelve-chars"} {
		c := Config{ID: id, Workdir: t.TempDir(), Policy: &decide.Policy{}, Argv: []string{"true"}, StateDir: t.TempDir()}
		err := c.validate()
		if err == nil || !strings.Contains(err.Error(), "sandbox id "+strconv.Quote(id)) {
			t.Errorf("id %q: %v", id, err)
		}
	}
}
