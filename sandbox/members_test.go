package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestPoolCoreUnknownMember: a member that is gone (torn down meanwhile)
// is ErrNotFound to adopt and to discard, so the pools try the next one.
func TestPoolCoreUnknownMember(t *testing.T) {
	m, _ := newTestManager(t, &fakeDriver{})
	c := m.PoolCore()
	ctx := context.Background()
	if _, err := c.Adopt(ctx, "nosuchmember00000001", node.CreateSpec{}, "", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("adopt a member that is gone: %v, want not found", err)
	}
	if err := c.Discard(ctx, "nosuchmember00000001", "test"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("discard a member that is gone: %v, want not found", err)
	}
	if c.DefaultDriver() != "fake" {
		t.Fatalf("members run on %q, want the default driver", c.DefaultDriver())
	}
	spec := node.CreateSpec{CPU: 1 << 10}
	if err := c.Normalize(&spec); errdefs.Field(err) != "cpu" {
		t.Fatalf("normalize an oversized member: %v, want an invalid cpu", err)
	}
}

// TestSnapshotCoreFind: a live session is found with its record; an
// unknown one is ErrNotFound; one torn down is ErrTerminated.
func TestSnapshotCoreFind(t *testing.T) {
	m, sb := newTestManager(t, &fakeDriver{})
	c := m.SnapshotCore()
	ctx := context.Background()
	h, err := c.Find(ctx, sb.id)
	if err != nil || h.Record().ID != sb.id || h.Driver().Name() != "fake" {
		t.Fatalf("Find(%s) = %v, %v", sb.id, h, err)
	}
	if _, err := c.Find(ctx, "nosuchsession0000001"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("find an unknown session: %v, want not found", err)
	}
	if err := m.Destroy(ctx, sb.id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Find(ctx, sb.id); !errors.Is(err, errdefs.ErrTerminated) {
		t.Fatalf("find an ended session: %v, want terminated", err)
	}
}
