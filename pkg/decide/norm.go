package decide

import "github.com/carbd/carbd/pkg/decide/match"

// Norm is Kairos' normalisation (lowercase, whitespace removed); see match.Norm.
func Norm(s string) string { return match.Norm(s) }
