package intercept

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// File names of a CA created under a state directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
	caLockFile = ".ca.lock"
)

// CA is carbd's interception certificate authority: an ECDSA P-256 key
// and its self-signed certificate. It mints leaf certificates and keeps
// them in a bounded cache. It is safe for concurrent use.
type CA struct {
	Cert *x509.Certificate
	// CertPEM is the CA certificate in PEM, as the guest must trust it.
	CertPEM []byte
	key     *ecdsa.PrivateKey
	opts    LeafOptions

	mu    sync.Mutex // guards cache and lru
	cache map[string]*list.Element
	lru   *list.List // of *leafEntry, most recent first
}

// LeafOptions says how leaf certificates are minted and cached. Zero
// fields take their defaults.
type LeafOptions struct {
	// Validity is how long a leaf is valid from its minting (its
	// NotBefore is backdated by an hour for clock skew). Default 24 h.
	Validity time.Duration
	// CacheSize bounds the leaves kept. Default 1024.
	CacheSize int
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

func (o LeafOptions) withDefaults() LeafOptions {
	if o.Validity <= 0 {
		o.Validity = 24 * time.Hour
	}
	if o.CacheSize <= 0 {
		o.CacheSize = 1024
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

type leafEntry struct {
	name string
	cert *tls.Certificate
	exp  time.Time
}

// LoadOrCreateCA loads the CA kept under dir (ca.pem, ca-key.pem), or
// creates it there: the key is written with mode 0600, both files appear
// by rename, and creation holds an exclusive lock on dir/.ca.lock, so two
// processes starting at once end up with the same CA. dir is created
// with mode 0700 when missing.
func LoadOrCreateCA(dir string, opts LeafOptions) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("intercept: ca dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, caLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("intercept: ca lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("intercept: ca lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it too
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	_, errC := os.Stat(certPath)
	_, errK := os.Stat(keyPath)
	switch {
	case errC == nil && errK == nil:
		return LoadCA(certPath, keyPath, opts)
	case errC == nil || errK == nil:
		return nil, fmt.Errorf("intercept: ca in %s: only one of %s and %s exists", dir, CACertFile, CAKeyFile)
	case !errors.Is(errC, os.ErrNotExist):
		return nil, fmt.Errorf("intercept: ca: %w", errC)
	case !errors.Is(errK, os.ErrNotExist):
		return nil, fmt.Errorf("intercept: ca: %w", errK)
	}
	certPEM, keyPEM, err := newCA(opts.withDefaults().Now())
	if err != nil {
		return nil, err
	}
	// The key first: a cert without its key is never left behind (a
	// crash between the two renames leaves a key alone, which the next
	// start reports).
	if err := writeAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	if err := writeAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	return ParseCA(certPEM, keyPEM, opts)
}

// writeAtomic writes data to a temporary file in path's directory,
// syncs it and renames it over path.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) //nolint:errcheck // gone after the rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("intercept: write %s: %w", path, err)
	}
	return nil
}

// newCA makes a fresh P-256 key and a self-signed CA certificate valid
// for ten years.
func newCA(now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("intercept: ca key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return nil, nil, fmt.Errorf("intercept: ca key: %w", err)
	}
	ski := sha256.Sum256(pub)
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "carbd interception CA " + host, Organization: []string{"carbd"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          ski[:20],
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("intercept: ca certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("intercept: ca key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("intercept: crypto/rand: " + err.Error()) // crypto/rand does not fail on Linux
	}
	return n.Add(n, big.NewInt(1))
}

// LoadCA loads a CA from a PEM certificate file and a PEM key file
// (PKCS#8, or SEC 1 "EC PRIVATE KEY"; ECDSA only).
func LoadCA(certFile, keyFile string, opts LeafOptions) (*CA, error) {
	c, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("intercept: ca cert: %w", err)
	}
	k, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("intercept: ca key: %w", err)
	}
	ca, err := ParseCA(c, k, opts)
	if err != nil {
		return nil, fmt.Errorf("%w (files %s, %s)", err, certFile, keyFile)
	}
	return ca, nil
}

// ParseCA builds a CA from PEM bytes. The certificate must be a CA
// certificate whose public key matches the ECDSA key.
func ParseCA(certPEM, keyPEM []byte, opts LeafOptions) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("intercept: ca cert: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("intercept: ca cert: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("intercept: ca cert: not a CA certificate")
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("intercept: ca key: no PEM block")
	}
	var key *ecdsa.PrivateKey
	switch kb.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, fmt.Errorf("intercept: ca key: %w", err)
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("intercept: ca key: %T is not an ECDSA key", k)
		}
		key = ek
	case "EC PRIVATE KEY":
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return nil, fmt.Errorf("intercept: ca key: %w", err)
		}
	default:
		return nil, fmt.Errorf("intercept: ca key: PEM block %q", kb.Type)
	}
	if pub, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, errors.New("intercept: ca: the key does not match the certificate")
	}
	o := opts.withDefaults()
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(cb), key: key, opts: o,
		cache: map[string]*list.Element{}, lru: list.New()}, nil
}

// Pool returns a pool holding the CA certificate (for clients in tests).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf returns a certificate for name, a DNS name or an IP address
// literal, minting it on first use. Leaves are cached (bounded, least
// recently used evicted) and re-minted when less than a quarter of their
// validity is left.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" {
		return nil, errors.New("intercept: leaf: empty name")
	}
	now := ca.opts.Now()
	ca.mu.Lock()
	if el, ok := ca.cache[name]; ok {
		e := el.Value.(*leafEntry)
		if now.Before(e.exp) {
			ca.lru.MoveToFront(el)
			ca.mu.Unlock()
			return e.cert, nil
		}
		ca.lru.Remove(el)
		delete(ca.cache, name)
	}
	ca.mu.Unlock()
	cert, err := ca.mint(name, now)
	if err != nil {
		return nil, err
	}
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if el, ok := ca.cache[name]; ok { // minted concurrently: keep one
		return el.Value.(*leafEntry).cert, nil
	}
	ca.cache[name] = ca.lru.PushFront(&leafEntry{name: name, cert: cert, exp: now.Add(ca.opts.Validity * 3 / 4)})
	for ca.lru.Len() > ca.opts.CacheSize {
		el := ca.lru.Back()
		ca.lru.Remove(el)
		delete(ca.cache, el.Value.(*leafEntry).name)
	}
	return cert, nil
}

// Cached returns how many leaves the cache holds.
func (ca *CA) Cached() int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.lru.Len()
}

func (ca *CA) mint(name string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("intercept: leaf %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(ca.opts.Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		AuthorityKeyId:        ca.Cert.SubjectKeyId,
	}
	if ip, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip.Unmap().AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("intercept: leaf %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("intercept: leaf %s: %w", name, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}
