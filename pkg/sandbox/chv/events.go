package chv

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// EventMonitorFD is the descriptor the cloud-hypervisor process writes
// its events to (--event-monitor fd=3): Start passes it the write end of
// a pipe as its first extra file.
const EventMonitorFD = 3

// Event is one record of Cloud Hypervisor's event monitor
// (event_monitor/src/lib.rs, event_log): the time since the VMM started,
// the source ("vm", "vmm", "guest", "virtio-device", ...), the event and
// its properties. The monitor writes each as pretty-printed JSON followed
// by a blank line (start_event_monitor_thread in vmm/src/lib.rs).
type Event struct {
	Timestamp  EventTime         `json:"timestamp"`
	Source     string            `json:"source"`
	Event      string            `json:"event"`
	Properties map[string]string `json:"properties"`
}

// EventTime is a serialized Rust Duration.
type EventTime struct {
	Secs  uint64 `json:"secs"`
	Nanos uint32 `json:"nanos"`
}

// Duration is the time as a time.Duration.
func (t EventTime) Duration() time.Duration {
	return time.Duration(t.Secs)*time.Second + time.Duration(t.Nanos)
}

func (e Event) String() string {
	s := e.Source + " " + e.Event
	if v, ok := e.Properties["event"]; ok {
		s += " (" + v + ")"
	}
	return s
}

// GuestEnded reports whether e ends carbd's guest: a reset ("vm
// rebooting", "vm rebooted": Vmm::vm_reboot, which Cloud Hypervisor runs
// for every guest reset, including the one a kernel panic with panic=-1
// makes, as it has no option not to reboot) or a panic the pvpanic
// device reported ("guest panic", devices/src/pvpanic.rs; only with
// --pvpanic and a guest driver for it).
func (e Event) GuestEnded() bool {
	switch e.Source + " " + e.Event {
	case "vm rebooting", "vm rebooted", "guest panic":
		return true
	}
	return false
}

// ErrBadEvent is returned by ReadEvents for a stream that is not
// Cloud Hypervisor's event records.
var ErrBadEvent = errors.New("chv: event monitor: not an event record")

// ReadEvents reads the event monitor's stream: JSON objects separated by
// white space, each passed to fn in order. It returns nil at the end of
// the stream, ErrBadEvent (wrapped) for anything else than a record. The
// stream comes from the VMM (the guest reaches it only through the
// pvpanic device's one byte), so a record's size is not bounded here.
func ReadEvents(r io.Reader, fn func(Event)) error {
	dec := json.NewDecoder(r)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("%w: %v", ErrBadEvent, err)
		}
		var e Event
		if err := json.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("%w: %v", ErrBadEvent, err)
		}
		if e.Source == "" || e.Event == "" {
			return fmt.Errorf("%w: %.100s", ErrBadEvent, raw)
		}
		fn(e)
	}
}
