package broker

import (
	"bytes"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
)

func TestValidate(t *testing.T) {
	bl := netpolicy.NewBlocklist(nil)
	ok := Spec{Name: "openai", Hosts: []string{"API.example.com.", "api.example.com"}, Header: "Authorization: Bearer {value}"}
	s, err := Validate(ok, []byte("sk-1"), bl)
	if err != nil || len(s.Hosts) != 1 || s.Hosts[0] != "api.example.com" {
		t.Fatalf("valid spec: %v %v", s, err)
	}
	bad := []struct {
		field string
		spec  Spec
		value []byte
	}{
		{"name", Spec{Name: "Open-AI", Hosts: []string{"a.example"}}, []byte("v")},
		{"hosts", Spec{Name: "x"}, []byte("v")},
		{"hosts", Spec{Name: "x", Hosts: []string{"10.0.0.1"}}, []byte("v")},
		{"hosts", Spec{Name: "x", Hosts: []string{"169.254.169.254"}}, []byte("v")},
		{"hosts", Spec{Name: "x", Hosts: []string{"bad host"}}, []byte("v")},
		{"header", Spec{Name: "x", Hosts: []string{"a.example"}, Header: "Authorization: Bearer"}, []byte("v")},
		{"header", Spec{Name: "x", Hosts: []string{"a.example"}, Header: "Authorization: {value}\r\nX: {value}"}, []byte("v")},
		{"value", Spec{Name: "x", Hosts: []string{"a.example"}}, nil},
		{"value", Spec{Name: "x", Hosts: []string{"a.example"}}, bytes.Repeat([]byte("a"), MaxValue+1)},
		{"value", Spec{Name: "x", Hosts: []string{"a.example"}}, []byte("a\r\nX-Evil: 1")},
	}
	for _, c := range bad {
		_, err := Validate(c.spec, c.value, bl)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != c.field {
			t.Errorf("%+v: got %v, want a field error on %s", c.spec, err, c.field)
		}
	}
}

func TestSealOpen(t *testing.T) {
	var k seal.Key
	k[0] = 1
	blob, err := Seal(&k, "t1", "openai", []byte("sk-secret"))
	if err != nil || bytes.Contains(blob, []byte("sk-secret")) {
		t.Fatalf("seal: %v", err)
	}
	if v, err := Open(&k, "t1", "openai", blob); err != nil || string(v) != "sk-secret" {
		t.Fatalf("open: %q %v", v, err)
	}
	if _, err := Open(&k, "t2", "openai", blob); err == nil {
		t.Fatal("a value moved to another tenant opened")
	}
	blob[len(blob)-1] ^= 1
	if _, err := Open(&k, "t1", "openai", blob); err == nil {
		t.Fatal("a changed value opened")
	}
}

func TestCA(t *testing.T) {
	ca, err := NewCA("s1", []string{"api.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca.PEM()) || strings.Contains(string(ca.PEM()), "PRIVATE") {
		t.Fatal("CA PEM")
	}
	verify := func(host string) error {
		l, err := ca.Leaf(host)
		if err != nil {
			return err
		}
		_, err = l.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
		return err
	}
	if err := verify("api.example.com"); err != nil {
		t.Fatalf("leaf for the secret's host: %v", err)
	}
	if err := verify("other.example.com"); err == nil {
		t.Fatal("the CA signed a leaf a client accepts for a host outside its constraints")
	}
	if err := verify("198.51.100.1"); err == nil {
		t.Fatal("the CA signed a leaf a client accepts for an IP")
	}
	other, _ := NewCA("s2", []string{"api.example.com"})
	l, _ := other.Leaf("api.example.com")
	if _, err := l.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "api.example.com"}); err == nil {
		t.Fatal("another session's leaf verified under this session's CA")
	}
}

func TestPlaceholder(t *testing.T) {
	a, b := NewPlaceholder("openai"), NewPlaceholder("openai")
	if a == b || !strings.HasPrefix(a, "fbx_openai_") || Fingerprint(a) == Fingerprint(b) {
		t.Fatalf("placeholders %q %q", a, b)
	}
	if EnvName("openai") != "OPENAI" {
		t.Fatal("env name")
	}
}
