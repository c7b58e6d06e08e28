package intercept

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestCACreateOnceAndLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	// Several goroutines at once: one CA results.
	const n = 8
	cas := make([]*CA, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { cas[i], errs[i] = LoadOrCreateCA(dir, LeafOptions{}) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("LoadOrCreateCA #%d: %v", i, errs[i])
		}
		if !bytes.Equal(cas[i].CertPEM, cas[0].CertPEM) {
			t.Fatalf("LoadOrCreateCA #%d made another CA", i)
		}
	}
	st, err := os.Stat(filepath.Join(dir, CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != CACertFile && e.Name() != CAKeyFile && e.Name() != caLockFile {
			t.Errorf("left behind: %s", e.Name())
		}
	}
	again, err := LoadCA(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile), LeafOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Cert.Equal(cas[0].Cert) || !again.Cert.IsCA {
		t.Fatal("LoadCA gave another certificate")
	}
	// A half-made CA is reported, not replaced.
	if err := os.Remove(filepath.Join(dir, CACertFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateCA(dir, LeafOptions{}); err == nil {
		t.Fatal("a key without its certificate was accepted")
	}
}

// TestCACreateTwoProcesses runs LoadOrCreateCA in two processes at once.
func TestCACreateTwoProcesses(t *testing.T) {
	if d := os.Getenv("INTERCEPT_CA_CHILD"); d != "" {
		ca, err := LoadOrCreateCA(d, LeafOptions{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Stdout.Write(ca.CertPEM)
		os.Exit(0)
	}
	dir := t.TempDir()
	var outs [2]bytes.Buffer
	var cmds [2]*exec.Cmd
	for i := range cmds {
		cmds[i] = exec.Command(os.Args[0], "-test.run=^TestCACreateTwoProcesses$")
		cmds[i].Env = append(os.Environ(), "INTERCEPT_CA_CHILD="+dir)
		cmds[i].Stdout = &outs[i]
		cmds[i].Stderr = os.Stderr
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range cmds {
		if err := cmds[i].Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	if outs[0].Len() == 0 || !bytes.Equal(outs[0].Bytes(), outs[1].Bytes()) {
		t.Fatalf("two processes ended with different CAs:\n%s\n%s", outs[0].String(), outs[1].String())
	}
}

func TestLeaf(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	clock := now
	ca, err := LoadOrCreateCA(t.TempDir(), LeafOptions{Validity: 4 * time.Hour, CacheSize: 2, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	roots := ca.Pool()
	for _, tc := range []struct{ name, verify string }{
		{"api.example.com", "api.example.com"},
		{"API.Example.com.", "api.example.com"},
		{"192.0.2.7", "192.0.2.7"},
		{"2001:db8::1", "2001:db8::1"},
	} {
		c, err := ca.Leaf(tc.name)
		if err != nil {
			t.Fatalf("Leaf(%q): %v", tc.name, err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{DNSName: tc.verify, Roots: roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("Leaf(%q) does not verify for %q: %v", tc.name, tc.verify, err)
		}
		if err := c.Leaf.VerifyHostname("other.example.com"); err == nil {
			t.Errorf("Leaf(%q) also valid for other.example.com", tc.name)
		}
		if got := c.Leaf.NotAfter.Sub(now); got != 4*time.Hour {
			t.Errorf("Leaf(%q) valid for %v after minting, want 4h", tc.name, got)
		}
	}
	if ca.Cached() != 2 {
		t.Errorf("cache holds %d leaves, want its bound 2", ca.Cached())
	}
	a, _ := ca.Leaf("a.example")
	if b, _ := ca.Leaf("a.example"); b != a {
		t.Error("a cached leaf was minted again")
	}
	clock = now.Add(3*time.Hour + time.Minute) // less than a quarter left
	if b, _ := ca.Leaf("a.example"); b == a {
		t.Error("a leaf near its expiry was served from the cache")
	}
	if _, err := ca.Leaf(""); err == nil {
		t.Error("Leaf(\"\") minted a certificate")
	}
}
