package route

import (
	"context"
	"errors"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
)

// TestMigrationTarget checks the target rules of a migration from host
// a: itself is a field error on host, an unknown host not found, a lost
// or draining one unavailable, and none named picks a placeable other.
func TestMigrationTarget(t *testing.T) {
	hs := []fleet.Host{
		{ID: "a", State: fleet.HostReady, Placeable: true, Tiers: []string{"runc"}},
		{ID: "b", State: fleet.HostLost, Tiers: []string{"runc"}},
		{ID: "c", State: fleet.HostDraining, Tiers: []string{"runc"}},
		{ID: "d", State: fleet.HostReady, Placeable: true, Tiers: []string{"runc"}, Load: fleet.Load{Sessions: 3}},
	}
	rt := New(Options{Self: "a", Hosts: func(context.Context) ([]fleet.Host, error) { return hs, nil }})
	s := &node.Session{ID: "s1", Driver: "runc"}
	for _, c := range []struct {
		target string
		want   error
	}{{"a", errdefs.ErrInvalidArgument}, {"zz", errdefs.ErrNotFound}, {"b", errdefs.ErrUnavailable},
		{"c", errdefs.ErrUnavailable}, {"bad id!", errdefs.ErrInvalidArgument}} {
		if _, err := rt.migrationTarget(context.Background(), s, c.target); !errors.Is(err, c.want) {
			t.Errorf("target %q: %v, want %v", c.target, err, c.want)
		}
	}
	for _, target := range []string{"", "d"} {
		h, err := rt.migrationTarget(context.Background(), s, target)
		if err != nil || h.ID != "d" {
			t.Errorf("target %q: %v %q, want d", target, err, h.ID)
		}
	}
	hs[3].Placeable = false
	if _, err := rt.migrationTarget(context.Background(), s, ""); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no other placeable host: %v", err)
	}
}
