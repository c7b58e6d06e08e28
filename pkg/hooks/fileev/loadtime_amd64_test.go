//go:build linux && amd64

package fileev

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/carbd/carbd/internal/testutil"
)

// TestExitWalkIsACall checks that ft_exit_btf reaches the task's file
// table through the global function fd_info_btf, not an inlined walk:
// inlined at its two descriptors, the walk's loads through the trusted
// task made the verifier search the kernel's BTF by name on every path,
// 10 -> 46 ms of a cold tracer's load (docs/file-events.md, Load time).
// ft_enter_btf keeps it inlined (one call site).
func TestExitWalkIsACall(t *testing.T) {
	spec, err := loadSpec()
	if err != nil {
		t.Fatal(err)
	}
	calls := func(prog string) bool {
		p := spec.Programs[prog]
		if p == nil {
			t.Fatalf("no program %s", prog)
		}
		for _, ins := range p.Instructions {
			if ins.Symbol() == "fd_info_btf" {
				return true
			}
		}
		return false
	}
	if !calls("ft_exit_btf") {
		t.Error("ft_exit_btf does not call fd_info_btf: the descriptor walk is inlined again")
	}
	for _, prog := range []string{"ft_enter_btf", "ft_exit_raw", "ft_enter_raw"} {
		if calls(prog) {
			t.Errorf("%s calls fd_info_btf", prog)
		}
	}
}

var (
	verifiedInsns = regexp.MustCompile(`processed (\d+) insns`)
	verifyTime    = regexp.MustCompile(`verification time (\d+) usec`)
)

// BenchmarkVerify loads each tracing program alone with the verifier's
// statistics and reports its verification time (verify-ms/op) and the
// instructions it processed (insns/op): the part of a cold tracer's
// load that depends on the programs' code.
func BenchmarkVerify(b *testing.B) {
	testutil.RequireRoot(b)
	for _, mech := range []string{MechTPBTF, MechRawTP} {
		for _, p := range progNames[mech] {
			b.Run(p[0], func(b *testing.B) {
				var usec, insns float64
				for b.Loop() {
					u, n := verifyOne(b, mech, p[0])
					usec += u
					insns = n
				}
				b.ReportMetric(usec/1000/float64(b.N), "verify-ms/op")
				b.ReportMetric(insns, "insns/op")
			})
		}
	}
}

// verifyOne loads program name of mech with its maps and returns the
// verifier's time in microseconds and the instructions it processed.
func verifyOne(b *testing.B, mech, name string) (usec, insns float64) {
	spec, err := loadSpec()
	if err != nil {
		b.Fatal(err)
	}
	for n := range spec.Programs {
		if n != name {
			delete(spec.Programs, n)
		}
	}
	delete(spec.Maps, unusedInflight[mech])
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	})
	if err != nil {
		b.Fatalf("load %s: %v", name, err)
	}
	defer coll.Close()
	log := coll.Programs[name].VerifierLog
	m, n := verifyTime.FindStringSubmatch(log), verifiedInsns.FindStringSubmatch(log)
	if m == nil || n == nil {
		b.Fatalf("%s: no statistics in the verifier's log: %q", name, log)
	}
	usec, _ = strconv.ParseFloat(m[1], 64)
	insns, _ = strconv.ParseFloat(n[1], 64)
	return usec, insns
}
