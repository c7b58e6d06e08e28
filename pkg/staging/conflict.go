package staging

import "fmt"

// Conflict is a staged change that was not committed because W's entry
// is no longer the one the agent's view was based on (the user changed,
// replaced, removed or created it during the run), or because its commit
// could not happen before the run ended. W keeps the user's version; the
// agent's version is kept at Kept.
type Conflict struct {
	Path   string
	Op     Op
	Reason string
	// Kept is where the agent's version is: a file, symlink or directory
	// under <StateDir>/conflicts/<run>/files. Empty for a removal (the
	// agent's version is the absence) or when it could not be kept (the
	// reason then says why; the change also stays staged).
	Kept string
}

func (c Conflict) String() string {
	s := fmt.Sprintf("%s %q: %s", c.Op, c.Path, c.Reason)
	if c.Kept != "" {
		s += " (the agent's version is kept at " + c.Kept + ")"
	}
	return s
}

// Conflict reasons.
const (
	ConflictCreated  = "conflict: the path was created in the working directory during the run"
	ConflictRemoved  = "conflict: the path was removed or renamed in the working directory during the run"
	ConflictReplaced = "conflict: the path was replaced in the working directory during the run"
	ConflictWritten  = "conflict: the file was changed in place in the working directory during the run"
	ConflictBelow    = "conflict: the directory holds entries changed or added in the working directory during the run"
	ConflictParent   = "conflict: a parent directory is in conflict"
	ConflictGone     = "conflict: the parent directory is no longer in the working directory"
	ConflictEnded    = "released but not committed when the run ended"
)
