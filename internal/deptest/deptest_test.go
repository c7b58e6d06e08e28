// Package deptest checks the import rules of the repository: the pure
// packages never import kernel-facing code.
package deptest

import (
	"os/exec"
	"strings"
	"testing"
)

// forbidden are the kernel-facing packages (prefixes).
var forbidden = []string{
	"github.com/cilium/ebpf",
	"github.com/florianl/go-nfqueue",
	"github.com/vishvananda/netlink",
	"github.com/vishvananda/netns",
	"github.com/google/gopacket",
	"github.com/google/nftables",
	"github.com/mdlayher/netlink",
	"golang.org/x/sys/unix",
	"github.com/carbd/carbd/pkg/hooks",
	"github.com/carbd/carbd/pkg/staging",
	"github.com/carbd/carbd/bpf",
}

func TestPurePackagesImportNoKernelCode(t *testing.T) {
	for _, pkg := range []string{"github.com/carbd/carbd/pkg/decide/...", "github.com/carbd/carbd/pkg/calib/..."} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			path, _, _ := strings.Cut(line, " ")
			for _, f := range forbidden {
				if path == f || strings.HasPrefix(path, f+"/") {
					t.Errorf("%s depends on kernel-facing package %s", pkg, path)
				}
			}
		}
		// The standard library's syscall is reachable through os and time;
		// what is forbidden is using it directly.
		out, err = exec.Command("go", "list", "-f", "{{.ImportPath}}: {{join .Imports \" \"}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			p, imports, _ := strings.Cut(line, ": ")
			for _, imp := range strings.Fields(imports) {
				if imp == "syscall" || imp == "unsafe" {
					t.Errorf("%s imports %s directly", p, imp)
				}
			}
		}
	}
}

// The kernel adapters and the staging layer are below the daemon: none of
// them imports it (or the command), so they stay usable and testable on
// their own.
func TestLowerLayersImportNoDaemon(t *testing.T) {
	upper := []string{"github.com/carbd/carbd/pkg/daemon", "github.com/carbd/carbd/cmd"}
	for _, pkg := range []string{"github.com/carbd/carbd/pkg/hooks/...", "github.com/carbd/carbd/pkg/staging/...", "github.com/carbd/carbd/pkg/sandbox/..."} {
		out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		for _, path := range strings.Fields(string(out)) {
			for _, u := range upper {
				if path == u || strings.HasPrefix(path, u+"/") {
					t.Errorf("%s depends on %s", pkg, path)
				}
			}
		}
	}
}
