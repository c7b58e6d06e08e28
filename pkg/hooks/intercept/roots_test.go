package intercept

import (
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The upstream trust is built on first use, but a mistake in the
// upstream CA files is still a configuration error New reports.
func TestNewChecksUpstreamCAFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(filepath.Join(dir, "ca"), LeafOptions{})
	if err != nil {
		t.Fatal(err)
	}
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dec := DeciderFunc(func(context.Context, *Request) Verdict { return Verdict{} })
	for _, tc := range []struct {
		file, want string
	}{
		{filepath.Join(dir, "missing.pem"), "intercept: upstream ca: "},
		{notPEM, "intercept: upstream ca " + notPEM + ": no PEM certificate"},
	} {
		_, err := New(Config{CA: ca, Decider: dec, UpstreamCAFiles: []string{tc.file}})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("New with upstream CA %s: %v, want an error starting %q", tc.file, err, tc.want)
		}
	}
	// A good file joins the host's roots when they are first needed.
	good := filepath.Join(dir, "good.pem")
	if err := os.WriteFile(good, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{CA: ca, Decider: dec, UpstreamCAFiles: []string{good}})
	if err != nil {
		t.Fatal(err)
	}
	roots, err := p.roots()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Cert.Verify(x509.VerifyOptions{Roots: roots}); err != nil {
		t.Errorf("the upstream CA file is not among the upstream roots: %v", err)
	}
}
