package netpolicy

import (
	"errors"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestSetAllowReplacesTheList proves SetAllow swaps the allow-list that
// decides names, addresses and DNS while the quotas stay, and that an
// empty list allows nothing.
func TestSetAllowReplacesTheList(t *testing.T) {
	first, err := ParseAllow("network.allow", []string{"a.test:443"})
	if err != nil {
		t.Fatal(err)
	}
	e := New(Config{SessionID: "s", Policy: &Policy{Allow: first, MaxBytes: 7, MaxConnsPerMinute: 9}})
	defer e.Close()
	if !e.policy().AllowsName("a.test", 443) || e.policy().AllowsName("b.test", 443) {
		t.Fatal("the first list")
	}
	second, _ := ParseAllow("network.allow", []string{"b.test:443"})
	e.SetAllow(second)
	p := e.policy()
	if p.AllowsName("a.test", 443) || !p.AllowsName("b.test", 443) || !p.Resolvable("b.test") || p.Resolvable("a.test") {
		t.Fatal("the replaced list")
	}
	if p.MaxBytes != 7 || p.MaxConnsPerMinute != 9 {
		t.Fatalf("quotas %d %d", p.MaxBytes, p.MaxConnsPerMinute)
	}
	e.SetAllow(nil)
	if e.policy().AllowsName("b.test", 443) || e.policy().Resolvable("b.test") {
		t.Fatal("an empty list allows something")
	}
	s := &Service{active: map[string]*Attachment{}}
	if err := s.SetAllow("nope", second); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a session without a network: %v", err)
	}
}
