package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"
)

// CALifetime is how long a session CA is valid (24 h); leaves it issues
// end no later than it does. A session that outlives it needs a new one.
const CALifetime = 24 * time.Hour

// leafLifetime is how long an issued leaf is valid (1 h, cached per host
// until 5 min before its end).
const leafLifetime = time.Hour

// CA is one session's certificate authority: ECDSA P-256, valid for
// CALifetime, restricted by name constraints to nothing but the hosts it
// was made for (RFC 5280 4.2.1.10), so even a leaked CA key signs no
// certificate a client would take for another host. Its key lives only in
// the daemon's memory.
type CA struct {
	cert  *x509.Certificate
	key   *ecdsa.PrivateKey
	pem   []byte
	mu    sync.Mutex
	leafs map[string]*tls.Certificate
}

// NewCA makes a CA for session whose certificates may name only hosts
// (DNS names or IP literals, as Validate returns them). It returns an error
// only when the random source or x509 fails.
func NewCA(session string, hosts []string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "forkbox session " + session + " broker CA"},
		NotBefore:                   now.Add(-time.Minute),
		NotAfter:                    now.Add(CALifetime),
		KeyUsage:                    x509.KeyUsageCertSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			bits := 32
			if ip.To4() == nil {
				bits = 128
			}
			tmpl.PermittedIPRanges = append(tmpl.PermittedIPRanges, &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)})
		} else {
			tmpl.PermittedDNSDomains = append(tmpl.PermittedDNSDomains, h)
		}
	}
	if len(tmpl.PermittedIPRanges) == 0 {
		// No IP may be named at all (an empty permitted set allows all).
		tmpl.ExcludedIPRanges = []*net.IPNet{{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, {IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), leafs: map[string]*tls.Certificate{}}, nil
}

// PEM returns the CA certificate (never the key), PEM-encoded, for the
// sandbox's trust bundle.
func (c *CA) PEM() []byte { return c.pem }

// Certificate returns the parsed CA certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf returns a TLS certificate for host (a DNS name or IP literal) signed
// by c, ECDSA P-256, valid for an hour and not past the CA's end; one is
// made per host and reused until five minutes before it ends.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leafs[host]; ok && time.Until(l.Leaf.NotAfter) > 5*time.Minute {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	end := now.Add(leafLifetime)
	if end.After(c.cert.NotAfter) {
		end = c.cert.NotAfter
	}
	if !end.After(now) {
		return nil, fmt.Errorf("broker CA %s has expired", c.cert.Subject.CommonName)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     end,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	c.leafs[host] = l
	return l, nil
}

// serial returns a random 128-bit positive serial number (RFC 5280 4.1.2.2
// allows up to 20 octets).
func serial() *big.Int {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b)
}

// NewPlaceholder returns a fresh placeholder for the secret called name:
// "fbx_<name>_" and 32 random bytes in unpadded base64url, so it is unique
// per session and fork, cannot be guessed, and its prefix tells a human
// what it stands for.
func NewPlaceholder(name string) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return "fbx_" + name + "_" + base64.RawURLEncoding.EncodeToString(b)
}

// Fingerprint returns the hex sha256 of a placeholder, the form in which
// records and audit name one without carrying it.
func Fingerprint(placeholder string) string {
	s := sha256.Sum256([]byte(placeholder))
	return fmt.Sprintf("%x", s[:8])
}
