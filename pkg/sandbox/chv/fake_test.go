package chv

// The fake Cloud Hypervisor these tests run against is package chvtest:
// it implements the documented contract strictly (the command line, the
// REST API, the hybrid vsock). Here it runs in the test process
// (chvtest.NewAPI, chvtest.StartVsock) and, for Start, as the re-executed
// test binary (TestMain with CARBD_FAKE_CHV=1) with a guest that echoes
// the task.

import (
	"os"
	"testing"

	"github.com/carbd/carbd/pkg/sandbox/chv/chvtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(chvtest.EnvFake) == "1" {
		os.Exit(chvtest.Main(os.Args[1:], chvtest.EchoGuest))
	}
	os.Exit(m.Run())
}
