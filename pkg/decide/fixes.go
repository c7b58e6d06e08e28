package decide

import (
	"fmt"
	"strings"
)

// Ablation switches off refinements of the policy's questions that the
// engine applies by default, for the ablation study of
// docs/evaluation.md (§6.3): engines with different ablations can run
// side by side in one process. The zero value switches nothing off, the
// default of every engine. Each field says what it switches off.
type Ablation struct {
	// Revert: RevertMinSimilarity and the role/shape limits of
	// revertValue; any trusted value of the same shape is taken.
	Revert bool
	// Embedded: embedded targets (subfields.go); destinations inside
	// content fields are not gated.
	Embedded bool
	// Forms: derivability beyond equality (derive.go); URL forms and
	// calendar dates are not recognised.
	Forms bool
	// Identity: the destination's own identity counts as carried data in
	// the clearance question.
	Identity bool
	// TaskTokens: sensitive tokens the task itself contains count as
	// carried data.
	TaskTokens bool
	// Distinctive: every sensitive token counts, ordinary words included.
	Distinctive bool
	// Classes: the value classes of docs/provenance.md ("Value classes"):
	// times of day as distinctive tokens again, URL forms not in the
	// clearance question, list items scored as one value, the principal's
	// declared identity not trusted, and no look-alike gate.
	Classes bool
	// Fields: field-level trust (fieldtrust.go); the policy's fields
	// section is ignored, sources are trusted or not as a whole.
	Fields bool
}

// AblationNames are the refinements' names, in the order String lists
// them: revert, embedded, forms, identity, tasktokens, distinctive,
// classes, fields.
var AblationNames = []string{"revert", "embedded", "forms", "identity", "tasktokens", "distinctive", "classes", "fields"}

func (a *Ablation) switchNamed(name string) *bool {
	switch name {
	case "revert":
		return &a.Revert
	case "embedded":
		return &a.Embedded
	case "forms":
		return &a.Forms
	case "identity":
		return &a.Identity
	case "tasktokens":
		return &a.TaskTokens
	case "distinctive":
		return &a.Distinctive
	case "classes":
		return &a.Classes
	case "fields":
		return &a.Fields
	}
	return nil
}

// ParseAblation parses a comma-separated list of refinement names
// (AblationNames) to switch off; "" switches nothing off.
func ParseAblation(s string) (Ablation, error) {
	var a Ablation
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		p := a.switchNamed(name)
		if p == nil {
			return Ablation{}, fmt.Errorf("decide: unknown refinement %q (want %s)", name, strings.Join(AblationNames, ", "))
		}
		if *p {
			return Ablation{}, fmt.Errorf("decide: refinement %q named twice", name)
		}
		*p = true
	}
	return a, nil
}

// String lists the refinements switched off, comma-separated in the
// order of AblationNames; "" when none is.
func (a Ablation) String() string {
	var off []string
	for _, name := range AblationNames {
		if *a.switchNamed(name) {
			off = append(off, name)
		}
	}
	return strings.Join(off, ",")
}
