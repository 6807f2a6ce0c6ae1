package broker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
)

func TestSecretsService(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "forkbox.db")
	st, err := store.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var k seal.Key
	k[3] = 9
	s := NewSecrets(st, &k, netpolicy.NewBlocklist(nil), audit.New(st, slog.Default()))
	value := []byte("sk-very-secret-value")
	if _, _, err := s.Set(ctx, "a", Spec{Name: "openai", Hosts: []string{"api.example.com"}}, value); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Set(ctx, "a", Spec{Name: "x", Hosts: []string{"127.0.0.1"}}, value); errdefs.Field(err) != "hosts" {
		t.Fatalf("loopback host: %v", err)
	}
	if v, ok, err := s.Value(ctx, "a", "openai", "api.example.com"); err != nil || !ok || !bytes.Equal(v, value) {
		t.Fatalf("value: %q %v %v", v, ok, err)
	}
	if _, ok, _ := s.Value(ctx, "a", "openai", "other.example.com"); ok {
		t.Fatal("a value for a host the secret does not list")
	}
	if _, ok, _ := s.Value(ctx, "b", "openai", "api.example.com"); ok {
		t.Fatal("another tenant read the secret")
	}
	if _, err := s.Get(ctx, "b", "openai"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another tenant's get: %v", err)
	}
	if err := s.Remove(ctx, "a", "openai"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.Value(ctx, "a", "openai", "api.example.com"); ok {
		t.Fatal("a removed secret still has a value")
	}
	st.Close()
	files, _ := filepath.Glob(path + "*") // the database and any WAL left
	var all []byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if bytes.Contains(all, value) {
		t.Fatal("the clear value is in the database files")
	}
	if !strings.Contains(string(all), KindSet) || !strings.Contains(string(all), KindRemove) {
		t.Fatal("no audit record of the set or the removal")
	}
}
