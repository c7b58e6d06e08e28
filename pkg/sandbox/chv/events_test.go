package chv

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/carbd/carbd/pkg/ctrl"
	"github.com/carbd/carbd/pkg/sandbox/chv/chvtest"
)

// monitorStream is what Cloud Hypervisor writes for a guest that panics
// with pvpanic and is rebooted: serde_json's to_string_pretty of each
// Event, then "\n\n" (event_monitor/src/lib.rs, vmm/src/lib.rs).
const monitorStream = `{
  "timestamp": {
    "secs": 0,
    "nanos": 21754399
  },
  "source": "vm",
  "event": "booted",
  "properties": null
}

{
  "timestamp": {
    "secs": 3,
    "nanos": 5000
  },
  "source": "guest",
  "event": "panic",
  "properties": {
    "event": "panic"
  }
}

{
  "timestamp": {
    "secs": 3,
    "nanos": 6000
  },
  "source": "vm",
  "event": "rebooting",
  "properties": null
}

`

func TestReadEvents(t *testing.T) {
	var got []string
	var ended []bool
	err := ReadEvents(strings.NewReader(monitorStream), func(e Event) {
		got = append(got, e.String()+" @"+e.Timestamp.Duration().String())
		ended = append(ended, e.GuestEnded())
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"vm booted @21.754399ms", "guest panic (panic) @3.000005s", "vm rebooting @3.000006s"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{false, true, true}, ended); diff != "" {
		t.Errorf("GuestEnded (-want +got):\n%s", diff)
	}
	for _, bad := range []string{`{"source":"vm"}`, `[1,2]`, `{"source":"vm","event":"booted"} garbage`, `{"timestamp":"now","source":"vm","event":"x"}`} {
		if err := ReadEvents(strings.NewReader(bad), func(Event) {}); !errors.Is(err, ErrBadEvent) {
			t.Errorf("%q: %v, want ErrBadEvent", bad, err)
		}
	}
}

func FuzzReadEvents(f *testing.F) {
	f.Add([]byte(monitorStream))
	f.Add([]byte(`{"source":"vm","event":"rebooted","properties":null}`))
	f.Add([]byte(`{"timestamp":{"secs":1,"nanos":2},"source":"vmm","event":"shutdown"}` + "\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := 0
		err := ReadEvents(strings.NewReader(string(b)), func(e Event) {
			if e.Source == "" || e.Event == "" {
				t.Fatalf("event without source or name: %+v", e)
			}
			n++
		})
		if err != nil && !errors.Is(err, ErrBadEvent) {
			t.Fatalf("error %v is not ErrBadEvent", err)
		}
	})
}

// startFake starts the re-executed fake cloud-hypervisor.
func startFake(t *testing.T) *VM {
	t.Helper()
	t.Setenv(chvtest.EnvFake, "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vm, err := Start(ctx, fakeConfig(t, self, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Kill() })
	return vm
}

// TestGuestPanicAfterHello: the guest panics after its hello; Cloud
// Hypervisor reboots it (it has no option not to) and says so on the
// event monitor. The VM stops the VMM on the first such event, so the
// control connection (which the fake keeps open) ends and Wait says why.
func TestGuestPanicAfterHello(t *testing.T) {
	vm := startFake(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	vc, err := vm.DialCtrl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := ctrl.NewConn(vc)
	defer conn.Close()
	if _, err := conn.RecvHello(); err != nil {
		t.Fatal(err)
	}
	if err := conn.Send(&ctrl.Task{ID: "p1", Text: "panic", Argv: []string{"agent"}}); err != nil {
		t.Fatal(err)
	}
	if m, err := conn.Recv(); err == nil {
		t.Fatalf("the control channel went on after the guest's panic: %v", m)
	}
	werr := vm.Wait()
	if !errors.Is(werr, ErrGuestEnded) || !strings.Contains(werr.Error(), `"guest panic (panic)"`) {
		t.Errorf("Wait: %v, want ErrGuestEnded naming the panic", werr)
	}
	if err := vm.GuestEnd(); !errors.Is(err, ErrGuestEnded) {
		t.Errorf("GuestEnd: %v", err)
	}
	evs, everr := vm.Events()
	var names []string
	for _, e := range evs {
		names = append(names, e.Source+" "+e.Event)
	}
	// The VMM is stopped on the pvpanic event, before or after the
	// reset's "vm rebooting" and "vm rebooted".
	if len(names) > 3 && names[3] == "vm rebooting" {
		names = append(names[:3], names[5:]...)
	}
	want := []string{"vm booting", "vm booted", "guest panic", "vm shutdown", "vm deleted", "vmm shutdown"}
	if diff := cmp.Diff(want, names); diff != "" || everr != nil {
		t.Errorf("events (-want +got):\n%s(stream error %v)", diff, everr)
	}
	// The VMM was stopped through vmm.shutdown; stopping it again is no
	// error.
	if err := vm.Stop(ctx); err != nil {
		t.Errorf("a second stop: %v", err)
	}
}

// TestGuestPanicAtBoot: a guest that panics while it boots (before
// anything listens on the vsock) reboots in a loop; the first reset ends
// the VM, so DialCtrl returns at once instead of waiting out its context.
func TestGuestPanicAtBoot(t *testing.T) {
	t.Setenv(chvtest.EnvFake, "1")
	t.Setenv(chvtest.EnvBoot, "panic")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	// The first reset may come before the API answers (Start fails) or
	// after (DialCtrl fails): either names the guest's end at once.
	vm, err := Start(ctx, fakeConfig(t, self, t.TempDir()))
	if err != nil {
		if !errors.Is(err, ErrGuestEnded) {
			t.Fatalf("Start: %v, want ErrGuestEnded", err)
		}
		return
	}
	t.Cleanup(func() { vm.Kill() })
	_, err = vm.DialCtrl(ctx)
	if !errors.Is(err, ErrGuestEnded) || ctx.Err() != nil {
		t.Fatalf("DialCtrl: %v, want ErrGuestEnded", err)
	}
	if !errors.Is(vm.Wait(), ErrGuestEnded) {
		t.Errorf("Wait: %v", vm.Wait())
	}
}
