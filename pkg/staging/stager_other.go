//go:build !linux

package staging

import (
	"context"
	"errors"
	"io"

	"github.com/carbd/carbd/pkg/decide"
)

// errUnsupported: staging needs Linux (overlayfs, openat2).
var errUnsupported = errors.New("staging: needs Linux (overlayfs, openat2)")

// Stager is unavailable off Linux; Open fails.
type Stager struct{}

// Scope is unavailable off Linux.
type Scope struct{}

// Recovery says what Open found in the journal.
type Recovery struct {
	Found  bool
	Action string
	Ops    int
}

func Open(Config) (*Stager, error)                                { return nil, errUnsupported }
func OpenLayout(*Layout) (*Stager, error)                         { return nil, errUnsupported }
func Mount(*Layout) error                                         { return errUnsupported }
func Unmount(*Layout) error                                       { return errUnsupported }
func Mounted(*Layout) (bool, error)                               { return false, errUnsupported }
func (*Stager) Layout() *Layout                                   { return nil }
func (*Stager) Labels() *Labels                                   { return newLabels(nil) }
func (*Stager) Recovery() Recovery                                { return Recovery{} }
func (*Stager) Close() error                                      { return nil }
func (*Stager) Mount() error                                      { return errUnsupported }
func (*Stager) Unmount() error                                    { return errUnsupported }
func (*Stager) Begin() (*Scope, error)                            { return nil, errUnsupported }
func (*Stager) Stage(string, decide.Label) error                  { return errUnsupported }
func (*Stager) Scan(context.Context, func(Change) error) error    { return errUnsupported }
func (*Stager) Changes(context.Context) ([]Change, error)         { return nil, errUnsupported }
func (*Stager) Commit(context.Context, []Change) (*Result, error) { return nil, errUnsupported }
func (*Stager) Abort(context.Context, []Change) (*Result, error)  { return nil, errUnsupported }
func (*Stager) Event(c Change) (decide.Event, error)              { return c.Event(), errUnsupported }
func (*Stager) OpenStaged(Change) (io.ReadCloser, error)          { return nil, errUnsupported }
func (*Stager) RunID() string                                     { return "" }
func (*Stager) Fresh() bool                                       { return false }
func (*Stager) Discard() error                                    { return errUnsupported }
func (*Stager) Finish(context.Context, func(Change) bool) ([]Conflict, error) {
	return nil, errUnsupported
}
func (*Scope) Stage(string, decide.Label) error          { return errUnsupported }
func (*Scope) Changes(context.Context) ([]Change, error) { return nil, errUnsupported }
func (*Scope) Commit(context.Context) (*Result, error)   { return nil, errUnsupported }
func (*Scope) Abort(context.Context) (*Result, error)    { return nil, errUnsupported }
