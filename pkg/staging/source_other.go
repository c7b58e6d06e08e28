//go:build !linux

package staging

import "github.com/carbd/carbd/pkg/decide"

// SourceLabel is unavailable off Linux.
func (*Stager) SourceLabel(Change) (string, decide.Label, bool, error) {
	return "", decide.Label{}, false, errUnsupported
}
