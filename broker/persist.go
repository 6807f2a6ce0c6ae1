package broker

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// sessionState is a Session as Sealed keeps it: its CA (certificate and
// key, DER) and its bindings (placeholders included).
type sessionState struct {
	CACert   []byte    `json:"ca_cert"`
	CAKey    []byte    `json:"ca_key"`
	Bindings []Binding `json:"bindings"`
}

// stateName is the name Seal binds a session's state to: no secret name
// holds '/', so a secret's sealed value never opens as one, nor the reverse.
func stateName(id string) string { return "session/" + id }

// Sealed returns the session's state (its CA key and placeholders, which
// are otherwise only in the daemon's memory) sealed under the service's
// key with its tenant and id as additional data, for the daemon to keep
// beside the sandbox (root only) so that a daemon restart can Restore it.
// It holds no secret value.
func (b *Session) Sealed() ([]byte, error) {
	key, err := x509.MarshalECPrivateKey(b.ca.key)
	if err != nil {
		return nil, err
	}
	st, err := json.Marshal(sessionState{CACert: b.ca.cert.Raw, CAKey: key, Bindings: b.bindings})
	if err != nil {
		return nil, err
	}
	return Seal(b.secrets.key, b.tenant, stateName(b.id), st)
}

// Restore makes session id's broker again from what Sealed returned (a
// daemon restart): the same placeholders and CA, values looked up per
// request as before (a secret removed meanwhile is refused). A blob that
// does not open for this tenant and session is an errdefs.ErrInternal
// error.
func (s *Secrets) Restore(tenant, id string, blob []byte) (*Session, error) {
	raw, err := Open(s.key, tenant, stateName(id), blob)
	if err != nil {
		return nil, err
	}
	var st sessionState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, errdefs.Newf(errdefs.ErrInternal, "broker state of session %s: %v", id, err)
	}
	cert, err := x509.ParseCertificate(st.CACert)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInternal, "broker CA of session %s: %v", id, err)
	}
	key, err := x509.ParseECPrivateKey(st.CAKey)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInternal, "broker CA key of session %s: %v", id, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey.(*ecdsa.PublicKey)) {
		return nil, errdefs.Newf(errdefs.ErrInternal, "broker CA of session %s: key does not match", id)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, errdefs.Newf(errdefs.ErrInternal, "broker CA of session %s expired at %s", id, cert.NotAfter)
	}
	ca := &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
		leafs: map[string]*tls.Certificate{}}
	return &Session{tenant: tenant, id: id, bindings: st.Bindings, ca: ca, secrets: s, roots: s.roots,
		log: s.log.With("session", id), noted: map[string]time.Time{}, counted: map[string]int{}}, nil
}
