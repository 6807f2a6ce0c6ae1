package e2e

import (
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestVolumeSnapshotsCountAsSnapshots: a volume's own snapshots hold disk
// as session snapshots do (what the volume frees later stays in them), so
// they count against the tenant's max_snapshots with its session
// snapshots: past it, a volume snapshot and a session snapshot are each a
// 429, and deleting one makes room again. Without that a tenant could
// keep any number of snapshots of a volume, each up to its size.
func TestVolumeSnapshotsCountAsSnapshots(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 3*time.Minute)
	_, _, c := newTenant(t, env.c, "vsnapquota", client.TenantPolicy{MaxSnapshots: 2})
	if _, err := c.CreateVolume(ctx, "sq", 4); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, c, "sq")
	first, err := c.SnapshotVolume(ctx, "sq", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteVolumeSnapshot(ctxFor(t, time.Minute), "sq", first.ID) })
	s, _, err := c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSession(ctxFor(t, time.Minute), s.ID) })
	sn, err := c.Snapshot(ctx, s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true) })
	_, err = c.SnapshotVolume(ctx, "sq", "")
	wantStatus(t, "a volume snapshot past max_snapshots 2", err, 429, "")
	_, err = c.Snapshot(ctx, s.ID, 0)
	wantStatus(t, "a session snapshot past max_snapshots 2 (one of them a volume's)", err, 429, "")
	if l, err := c.VolumeSnapshots(ctx, "sq"); err != nil || len(l) != 1 {
		t.Fatalf("the volume's snapshots after the refusals: %+v %v", l, err)
	}
	if err := c.DeleteVolumeSnapshot(ctx, "sq", first.ID); err != nil {
		t.Fatal(err)
	}
	again, err := c.SnapshotVolume(ctx, "sq", "")
	if err != nil {
		t.Fatalf("a volume snapshot once one went: %v", err)
	}
	if err := c.DeleteVolumeSnapshot(ctx, "sq", again.ID); err != nil {
		t.Fatal(err)
	}
}
