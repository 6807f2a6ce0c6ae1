package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

func TestSecrets(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	sec := Secret{Tenant: "a", Name: "openai", Hosts: []string{"api.example.com"}, Header: "Authorization: Bearer {value}", Sealed: []byte{1, 2, 3}}
	if replaced, err := s.PutSecret(ctx, sec); err != nil || replaced {
		t.Fatalf("put: %v %v", replaced, err)
	}
	sec.Sealed = []byte{4}
	if replaced, err := s.PutSecret(ctx, sec); err != nil || !replaced {
		t.Fatalf("replace: %v %v", replaced, err)
	}
	got, err := s.GetSecret(ctx, "a", "openai")
	if err != nil || string(got.Sealed) != "\x04" || got.Hosts[0] != "api.example.com" || got.Header != sec.Header {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := s.GetSecret(ctx, "b", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's secret: %v", err)
	}
	if l, err := s.ListSecrets(ctx, "a"); err != nil || len(l) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	if err := s.DeleteSecret(ctx, "b", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete of another tenant's: %v", err)
	}
	if err := s.DeleteSecret(ctx, "a", "openai"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, "a", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// TestDeleteTenantRemovesSecrets: a deleted tenant's sealed values do not
// stay behind.
func TestDeleteTenantRemovesSecrets(t *testing.T) {
	s, _ := openTemp(t)
	ctx := context.Background()
	if err := s.CreateTenant(ctx, &Tenant{Name: "gone", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"gone", "kept"} {
		if _, err := s.PutSecret(ctx, Secret{Tenant: tenant, Name: "k", Hosts: []string{"a.example"}, Sealed: []byte{1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteTenant(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListSecrets(ctx, "gone"); err != nil || len(l) != 0 {
		t.Fatalf("a deleted tenant's secrets: %v %v", l, err)
	}
	if l, err := s.ListSecrets(ctx, "kept"); err != nil || len(l) != 1 {
		t.Fatalf("another tenant's secrets: %v %v", l, err)
	}
}
