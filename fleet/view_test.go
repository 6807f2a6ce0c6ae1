package fleet

import (
	"context"
	"testing"
	"time"
)

// TestHostView proves a view holds the records written before it opened
// at once, applies later heartbeats and removals without being asked,
// and derives Placeable and lost as List does.
func TestHostView(t *testing.T) {
	f := startAlone(t)
	ctx := context.Background()
	r, err := OpenRegistry(ctx, f, RegistryOptions{Version: "v1.2.3", Heartbeat: 100 * time.Millisecond, LostAfter: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, Host{ID: "a", Version: "v1.2.0", Load: Load{Sessions: 1}}); err != nil {
		t.Fatal(err)
	}
	v, err := r.View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if hs := v.Hosts(); len(hs) != 1 || hs[0].ID != "a" || !hs[0].Placeable || hs[0].Load.Sessions != 1 {
		t.Fatalf("view at open: %+v, want a placeable with 1 session", hs)
	}
	if err := r.Put(ctx, Host{ID: "b", Version: "v1.3.0"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Put(ctx, Host{ID: "a", Version: "v1.2.0", Load: Load{Sessions: 7}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the view applies b and a's new load", func() bool {
		hs := v.Hosts()
		return len(hs) == 2 && hs[0].Load.Sessions == 7 && hs[1].ID == "b"
	})
	if hs := v.Hosts(); hs[1].Placeable {
		t.Fatalf("b of another minor version placeable: %+v", hs[1])
	}
	if err := r.Forget(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the view drops the forgotten b", func() bool { return len(v.Hosts()) == 1 })
	waitFor(t, 5*time.Second, "a without heartbeats turns lost", func() bool {
		hs := v.Hosts()
		return len(hs) == 1 && hs[0].State == HostLost && !hs[0].Placeable
	})
	v.Close() // twice is fine
}
