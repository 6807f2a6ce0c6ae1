package fleetstate

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// A tenant and a key made on host a reach b and c: the key authenticates
// there; its revocation on a refuses it there; a policy set on b and the
// tenant's deletion on c reach the others. No host's bucket entry holds
// the key's secret.
func TestSharedTenantsAndKeys(t *testing.T) {
	hosts := startHosts(t)
	runShared(t, hosts)
	ctx := context.Background()
	a, b, c := hosts[0].st, hosts[1].st, hosts[2].st

	if err := a.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: `{"max_sessions":2}`, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	id, secret := tenancy.NewKey()
	if err := a.AddAPIKey(ctx, store.APIKey{ID: id, Name: "ci", Tenant: "acme"}, secret); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*store.Store{b, c} {
		waitFor(t, 10*time.Second, "the key made on a authenticates elsewhere", func() bool {
			k, err := st.AuthenticateKey(ctx, secret)
			return err == nil && k.ID == id && k.Tenant == "acme"
		})
	}
	// The bucket has the hash, never the secret.
	kv, err := hosts[1].f.JetStream().KeyValue(ctx, SharedBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "key."+id)
	if err != nil {
		t.Fatal(err)
	}
	if v := string(e.Value()); contains(v, secret) || !contains(v, store.HashKey(secret)) {
		t.Fatalf("bucket entry %s: want the hash and not the secret", v)
	}

	if err := b.SetTenantPolicy(ctx, "acme", `{"max_sessions":5}`); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*store.Store{a, c} {
		waitFor(t, 10*time.Second, "the policy set on b elsewhere", func() bool {
			tn, err := st.GetTenant(ctx, "acme")
			return err == nil && tn.Policy == `{"max_sessions":5}`
		})
	}

	if err := a.RevokeAPIKey(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*store.Store{b, c} {
		waitFor(t, 10*time.Second, "the key revoked on a refused elsewhere", func() bool {
			_, err := st.AuthenticateKey(ctx, secret)
			return errors.Is(err, errdefs.ErrUnauthenticated)
		})
	}

	id2, secret2 := tenancy.NewKey()
	if err := b.AddAPIKey(ctx, store.APIKey{ID: id2, Tenant: "acme"}, secret2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "b's key on c", func() bool { _, err := c.AuthenticateKey(ctx, secret2); return err == nil })
	if err := c.DeleteTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []*store.Store{a, b} {
		waitFor(t, 10*time.Second, "the tenant deleted on c gone elsewhere, its keys with it", func() bool {
			_, err := st.GetTenant(ctx, "acme")
			_, kerr := st.AuthenticateKey(ctx, secret2)
			return errors.Is(err, errdefs.ErrNotFound) && errors.Is(kerr, errdefs.ErrUnauthenticated)
		})
		if err := st.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: "{}", CreatedAt: time.Now()}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a deleted tenant's name made again: %v, want ErrConflict", err)
		}
	}
}

// A host that made a tenant and a key before it joined (its Shared not
// running) publishes them on its catch-up; a deletion the bucket holds
// wins over a live record a host publishes afterwards.
func TestSharedCatchUpAndTombstone(t *testing.T) {
	hosts := startHosts(t)
	ctx := context.Background()
	a, b := hosts[0].st, hosts[1].st
	if err := a.CreateTenant(ctx, &store.Tenant{Name: "early", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	id, secret := tenancy.NewKey()
	if err := a.AddAPIKey(ctx, store.APIKey{ID: id, Tenant: "early"}, secret); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateTenant(ctx, &store.Tenant{Name: "early", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteTenant(ctx, "early"); err != nil {
		t.Fatal(err)
	}
	runShared(t, hosts[:1])
	waitFor(t, 10*time.Second, "a's tenant in the bucket", func() bool {
		kv, err := hosts[2].f.JetStream().KeyValue(ctx, SharedBucket)
		if err != nil {
			return false
		}
		_, err = kv.Get(ctx, "key."+id)
		return err == nil
	})
	runShared(t, hosts[1:])
	// b's deletion (a tombstone) wins over a's live record, everywhere.
	for _, st := range []*store.Store{a, hosts[2].st} {
		waitFor(t, 10*time.Second, "the tenant deleted on b gone elsewhere", func() bool {
			_, err := st.GetTenant(ctx, "early")
			_, kerr := st.AuthenticateKey(ctx, secret)
			return errors.Is(err, errdefs.ErrNotFound) && errors.Is(kerr, errdefs.ErrUnauthenticated)
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A host whose store goes back to a copy from before a revocation and a
// deletion it published itself (a data directory restored from a backup)
// gets them back from the bucket when it runs again: the key it revoked
// does not authenticate and the tenant it deleted stays deleted.
func TestSharedOwnRevocationRestored(t *testing.T) {
	hosts := startHosts(t)
	runShared(t, hosts[1:])
	ctx := context.Background()
	a := hosts[0]
	sh, err := OpenShared(ctx, a.f, a.st, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	a.st.OnChange(sh.Changed)
	runCtx, stopA := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { sh.Run(runCtx); close(ran) }()

	id, secret := tenancy.NewKey()
	for _, tn := range []string{"acme", "gone"} {
		if err := a.st.CreateTenant(ctx, &store.Tenant{Name: tn, Policy: "{}", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.st.AddAPIKey(ctx, store.APIKey{ID: id, Tenant: "acme"}, secret); err != nil {
		t.Fatal(err)
	}
	if err := a.st.RevokeAPIKey(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := a.st.DeleteTenant(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	b := hosts[1].st
	waitFor(t, 10*time.Second, "a's revocation and deletion on b", func() bool {
		k, err := b.SharedKey(ctx, id)
		tn, terr := b.SharedTenant(ctx, "gone")
		return err == nil && !k.RevokedAt.IsZero() && terr == nil && !tn.DeletedAt.IsZero()
	})
	stopA()
	<-ran

	// a's store as a backup taken before the revocation had it.
	restored, err := store.Open(ctx, filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restored.Close() })
	for _, tn := range []string{"acme", "gone"} {
		if err := restored.CreateTenant(ctx, &store.Tenant{Name: tn, Policy: "{}", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := restored.AddAPIKey(ctx, store.APIKey{ID: id, Tenant: "acme"}, secret); err != nil {
		t.Fatal(err)
	}
	sh2, err := OpenShared(ctx, a.f, restored, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	restored.OnChange(sh2.Changed)
	runCtx2, stop2 := context.WithCancel(ctx)
	ran2 := make(chan struct{})
	go func() { sh2.Run(runCtx2); close(ran2) }()
	defer func() { stop2(); <-ran2 }()
	waitFor(t, 10*time.Second, "the key a revoked refused again on a's restored store, the tenant it deleted gone", func() bool {
		_, err := restored.AuthenticateKey(ctx, secret)
		_, terr := restored.GetTenant(ctx, "gone")
		return errors.Is(err, errdefs.ErrUnauthenticated) && errors.Is(terr, errdefs.ErrNotFound)
	})
	if k, err := b.SharedKey(ctx, id); err != nil || k.RevokedAt.IsZero() {
		t.Fatalf("the restored host undid its revocation in the fleet: %+v, %v", k, err)
	}
}

// A bucket entry that is not the record its key names (a key's record
// under "tenant.NAME", a tenant's under another name) is skipped: it
// neither takes the host down at its catch-up nor changes the store.
func TestSharedMismatchedEntrySkipped(t *testing.T) {
	hosts := startHosts(t)
	ctx := context.Background()
	a := hosts[0].st
	if err := a.CreateTenant(ctx, &store.Tenant{Name: "acme", Policy: "{}", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := OpenShared(octx, hosts[1].f, hosts[1].st, quietLog()); err != nil { // makes the bucket
		t.Fatal(err)
	}
	kv, err := hosts[1].f.JetStream().KeyValue(ctx, SharedBucket)
	if err != nil {
		t.Fatal(err)
	}
	id, secret := tenancy.NewKey()
	for key, val := range map[string]string{
		"tenant.acme": fmt.Sprintf(`{"host":"b","key":{"id":%q,"hash":%q,"tenant":"acme","admin":true}}`, id, store.HashKey(secret)),
		"tenant.zeta": `{"host":"b","tenant":{"name":"acme","policy":"{\"max_sessions\":1}"}}`,
	} {
		if _, err := kv.Put(ctx, key, []byte(val)); err != nil {
			t.Fatal(err)
		}
	}
	runShared(t, hosts[:1])
	waitFor(t, 10*time.Second, "a's tenant in the bucket", func() bool {
		e, err := kv.Get(ctx, "tenant.acme")
		return err == nil && contains(string(e.Value()), `"tenant":{`)
	})
	if _, err := a.AuthenticateKey(ctx, secret); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("a key's record stored under a tenant's name authenticates: %v", err)
	}
	if tn, err := a.GetTenant(ctx, "acme"); err != nil || tn.Policy != "{}" {
		t.Fatalf("tenant acme %+v, %v: want its own policy {}", tn, err)
	}
}
