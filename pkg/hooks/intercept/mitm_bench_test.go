package intercept

import (
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// mitmdump starts mitmproxy's mitmdump (Debian's mitmproxy package), the
// field's reference for an intercepting proxy, as a reverse proxy to the
// world over TLS: it terminates the client's TLS with a certificate of
// its own CA and connects upstream verifying the world's, as carbd's
// proxy does. It returns the base URL (host localhost) and the CA to
// trust. The benchmarks compare the two in the same run; without
// mitmdump installed it returns "" and the comparison is left out.
func mitmdump(b *testing.B, w *world) (string, *x509.CertPool) {
	b.Helper()
	bin, err := exec.LookPath("mitmdump")
	if err != nil {
		return "", nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf := b.TempDir()
	cmd := exec.Command(bin, "-q", "--mode", fmt.Sprintf("reverse:https://localhost:%d", w.addr.Port()),
		"--listen-host", "127.0.0.1", "--listen-port", fmt.Sprint(port),
		"--set", "confdir="+conf, "--set", "ssl_verify_upstream_trusted_ca="+w.caFile,
		"--set", "keep_host_header=true", "--set", "flow_detail=0", "--set", "stream_large_bodies=1m")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	caFile := filepath.Join(conf, "mitmproxy-ca-cert.pem")
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
			if _, err := os.Stat(caFile); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("mitmdump did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("https://localhost:%d", port), newPoolFromFile(b, caFile)
}
