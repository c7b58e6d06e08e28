//go:build linux

package tcxtest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/carbd/carbd/internal/testutil"
)

// Iperf is an iperf3 server in a namespace, for throughput benchmarks.
type Iperf struct {
	ns   string
	addr netip.AddrPort
	cmd  *exec.Cmd
}

// StartIperf runs `iperf3 -s` on addr's port in ns until the test ends.
func StartIperf(tb testing.TB, ns string, addr netip.AddrPort) *Iperf {
	tb.Helper()
	testutil.RequireTool(tb, "iperf3")
	// ip netns exec execs iperf3: the process is the server itself.
	cmd := exec.Command("ip", "netns", "exec", ns, "iperf3", "-s", "-B", addr.Addr().String(), "-p", strconv.Itoa(int(addr.Port())))
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	time.Sleep(300 * time.Millisecond) // let it listen
	return &Iperf{ns: ns, addr: addr, cmd: cmd}
}

// IperfResult is one iperf3 run.
type IperfResult struct {
	Gbps float64 // received, as the server counted it
	// CPUPerByte is the CPU time of the client and the server, in
	// nanoseconds per byte received. The kernel here charges softirq time
	// to the task it interrupts (no IRQ time accounting), and a veth
	// transmit runs the receiving side's softirq on the sender's CPU, so
	// this includes most of the forwarding path (TC, netfilter, routing).
	// Unlike the rate, it hardly depends on how much CPU other processes
	// leave the benchmark: the figure to compare on a loaded machine.
	CPUPerByte float64
}

// Run sends to the server from ns for seconds (from client port cport
// when not 0) and returns the rate and the CPU cost.
func (s *Iperf) Run(tb testing.TB, ns string, cport uint16, seconds int) IperfResult {
	tb.Helper()
	args := []string{"netns", "exec", ns, "iperf3", "-c", s.addr.Addr().String(), "-p", strconv.Itoa(int(s.addr.Port())),
		"-t", strconv.Itoa(seconds), "-J"}
	if cport != 0 {
		args = append(args, "--cport", strconv.Itoa(int(cport)))
	}
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				Bytes         float64 `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	var out []byte
	var err error
	var client *os.ProcessState
	var server time.Duration
	// The server refuses a test while it finishes the last one (it
	// reopens its listener between tests); iperf3 may then exit 0 with
	// the error in its JSON.
	for try := 0; try < 5; try++ {
		s0 := s.cpu(tb)
		cmd := exec.Command("ip", args...)
		out, err = cmd.Output()
		server = s.cpu(tb) - s0
		client = cmd.ProcessState
		if err == nil {
			r.Error, r.End.SumReceived.Bytes = "", 0
			if err = json.Unmarshal(out, &r); err == nil && (r.Error != "" || r.End.SumReceived.Bytes == 0) {
				err = fmt.Errorf("nothing received (%q)", r.Error)
			}
		}
		if err == nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("iperf3: %v\n%s", err, out)
	}
	cpu := client.UserTime() + client.SystemTime() + server
	return IperfResult{Gbps: r.End.SumReceived.BitsPerSecond / 1e9, CPUPerByte: float64(cpu.Nanoseconds()) / r.End.SumReceived.Bytes}
}

// cpu is the server's CPU time so far (/proc/PID/schedstat: time on a CPU, ns).
func (s *Iperf) cpu(tb testing.TB) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", s.cmd.Process.Pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		tb.Fatalf("schedstat: %q", b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ns)
}
