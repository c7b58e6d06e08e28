package decide

// Calibration is what the engine takes from a calibration artifact
// (built and validated by package calib, see docs/calibration.md).
//
// Score names the similarity kind the thresholds were calibrated for
// (package score's Kind: "token", "ngram" or "max"); fields must be scored
// with the same kind. A gated field of role r with score s is within its
// calibrated risk budget iff s <= Threshold[r]. A threshold of -Inf
// blocks every field of the role (its stratum could not be certified
// even pooled). A role absent from Threshold was not calibrated: the
// CRC layer has no threshold for it and must not allow it on a score.
// Stratum names the final calibration stratum of each calibrated role
// (its own name, or "pooled"), for audit records. LedgerLambda is the
// G-CARB stop threshold λ̂, meaningful only when HasLedger is set.
type Calibration struct {
	Score        string
	Threshold    map[Role]float64
	Stratum      map[Role]string
	LedgerLambda float64
	HasLedger    bool
}
