package decide

import "strings"

// disabledFixes switches off, for the ablation study of
// docs/evaluation.md (§6), refinements of the policy's questions that the
// engine applies by default. It is empty in every normal build and can
// only be set when the binary is linked:
//
//	go build -ldflags "-X github.com/carbd/carbd/pkg/decide.disabledFixes=embedded,forms" ./cmd/carbd
//
// Names, comma-separated (each says what is switched off):
//
//	revert       RevertMinSimilarity and the role/shape limits of revertValue: any trusted value of the same shape is taken, as before
//	embedded     embedded targets (subfields.go): destinations inside content fields are not gated
//	forms        derivability beyond equality (derive.go): URL forms and calendar dates
//	identity     the destination's own identity counts as carried data in the clearance question
//	tasktokens   sensitive tokens the task itself contains count as carried data
//	distinctive  every sensitive token counts, ordinary words included
var disabledFixes string

// fixOff is disabledFixes as a set, read once at start-up.
var fixOff = func() map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(disabledFixes, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[f] = true
		}
	}
	return m
}()

// DisabledFixes returns the refinements switched off in this build (see
// disabledFixes), for reports; empty in a normal build.
func DisabledFixes() string { return disabledFixes }
