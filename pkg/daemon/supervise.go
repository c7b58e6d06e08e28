package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/carbd/carbd/pkg/decide"
)

// ComponentError is the failure of one of the daemon's long-running
// components (the verdict loop, the TC program's lease, the file tracer,
// ...): it ended the run closed. Run returns it with the summary.
type ComponentError struct {
	Component string    // e.g. "verdict-loop"
	Err       error     // what it returned
	At        time.Time // when the supervisor saw it
}

func (e *ComponentError) Error() string {
	return fmt.Sprintf("component %s failed: %v", e.Component, e.Err)
}

func (e *ComponentError) Unwrap() error { return e.Err }

// errReturned is the error of a component that returned nil while the
// run went on: nothing does its job any more.
var errReturned = errors.New("daemon: returned while the run went on")

// errNotStarted is returned by a component that never came up: its
// start-up error is reported by whoever started it, not as a failure.
var errNotStarted = errors.New("daemon: component did not start")

// errKilled is the error of a component whose own context was cancelled
// while the run went on.
var errKilled = errors.New("daemon: stopped while the run went on")

// codeComponentFailed is the reason code of an effect refused because a
// component failed (held when it failed, or proposed after).
const codeComponentFailed = "component-failed"

// supervisor runs the daemon's long-running components, each under a
// name. The first one that fails (returns an error, or returns at all
// while the run goes on) ends the run: Failed is closed, and from then on
// failure() is set, which every decision path checks (fail closed). A
// component that returns after its context ended (teardown) or after the
// run ended (end) is not failing. Safe for concurrent use.
type supervisor struct {
	log     *slog.Logger
	onFail  func(*ComponentError) // called once, on the first failure, on the failing goroutine
	failure atomic.Pointer[ComponentError]
	failed  chan struct{} // closed on the first failure

	mu     sync.Mutex                    // guards the fields below
	ending bool                          // the run is over: returns are expected
	stops  map[string]context.CancelFunc // each component's own context
}

func newSupervisor(log *slog.Logger, onFail func(*ComponentError)) *supervisor {
	return &supervisor{log: log, onFail: onFail, failed: make(chan struct{}), stops: map[string]context.CancelFunc{}}
}

// Go runs f on a new goroutine as the component name, with a context
// derived from ctx (cancelled when ctx is: the component's teardown).
// wg, if not nil, is done when f has returned.
func (s *supervisor) Go(wg *sync.WaitGroup, ctx context.Context, name string, f func(context.Context) error) {
	cctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	s.stops[name] = cancel
	s.mu.Unlock()
	if wg != nil {
		wg.Add(1)
	}
	// A component whose own context ends while ctx goes on was killed:
	// that is its failure, reported at once, not when it has wound down
	// (which can wait for decisions in flight, and those for the oracle,
	// which only the failure's stop cancels).
	reported := make(chan struct{})
	stopReport := context.AfterFunc(cctx, func() {
		defer close(reported)
		if ctx.Err() == nil {
			s.Fail(name, errKilled)
		}
	})
	go func() {
		if wg != nil {
			defer wg.Done()
		}
		defer cancel()
		err := f(cctx)
		if !stopReport() {
			// Its context ended first: killed (reported) or torn down.
			<-reported
			return
		}
		switch {
		case ctx.Err() != nil:
			// Torn down: an error now is the teardown's.
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Debug("component stopped", "component", name, "err", err)
			}
			return
		case cctx.Err() != nil:
			err = errKilled // killed, and it returned before the report ran
		case errors.Is(err, errNotStarted):
			return
		}
		s.Fail(name, err)
	}()
}

// Fail reports that the component name ended with err (nil: it returned
// while the run went on). After end it is only logged.
func (s *supervisor) Fail(name string, err error) {
	if err == nil {
		err = errReturned
	}
	s.mu.Lock()
	ending := s.ending
	s.mu.Unlock()
	if ending {
		s.log.Debug("component stopped after the run ended", "component", name, "err", err)
		return
	}
	cf := &ComponentError{Component: name, Err: err, At: time.Now()}
	if !s.failure.CompareAndSwap(nil, cf) {
		if first := s.failure.Load(); first.Component != name {
			s.log.Error("component failed (the run is already ending)", "component", name, "err", err)
		}
		return
	}
	s.log.Error("component failed: the run ends closed (held effects refused, staged changes kept staged)", "component", name, "err", err)
	close(s.failed)
	if s.onFail != nil {
		s.onFail(cf)
	}
}

// Failed is closed when a component has failed.
func (s *supervisor) Failed() <-chan struct{} { return s.failed }

// Err is the first failure, nil while every component runs.
func (s *supervisor) Err() *ComponentError {
	if s == nil {
		return nil
	}
	return s.failure.Load()
}

// end marks the run over: components returning from now on (teardown)
// are not failing.
func (s *supervisor) end() {
	s.mu.Lock()
	s.ending = true
	s.mu.Unlock()
}

// stop cancels the component's own context, as if it had been killed
// (tests: a component that returns while the run goes on).
func (s *supervisor) stop(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.stops[name]
	if ok {
		c()
	}
	return ok
}

// failedDecision is dec refused because cf failed: what an effect held or
// decided when a component failed becomes (fail closed).
func failedDecision(dec decide.Decision, cf *ComponentError) decide.Decision {
	dec.Verdict = decide.Refuse
	dec.Reason = decide.Reason{Code: codeComponentFailed}
	dec.Justification = fmt.Sprintf("carbd's %s failed (%v): refused, fail closed", cf.Component, cf.Err)
	return dec
}

// failedResolution is r with every effect refused, when a component has
// failed: nothing held is released after a failure.
func failedResolution(r *decide.Resolution, cf *ComponentError) *decide.Resolution {
	out := *r
	out.Effects = make([]decide.Decision, len(r.Effects))
	for i, e := range r.Effects {
		if e.Verdict == decide.Refuse {
			out.Effects[i] = e
			continue
		}
		out.Effects[i] = failedDecision(e, cf)
	}
	out.Committed = false
	return &out
}
