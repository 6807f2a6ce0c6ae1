package e2e

import (
	"strings"
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

// TestTenantDeleteKeepsVolumeSnapshotsWithoutForce: a tenant whose only
// data left is a volume snapshot (the volume itself removed) is not
// deleted without force (409 counting it), as one with a volume or a
// session snapshot is not: the snapshot is data a delete would drop.
func TestTenantDeleteKeepsVolumeSnapshotsWithoutForce(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 2*time.Minute)
	name, _, c := newTenant(t, env.c, "vsnapdel", client.TenantPolicy{})
	if _, err := c.CreateVolume(ctx, "kv", 4); err != nil {
		t.Fatal(err)
	}
	sn, err := c.SnapshotVolume(ctx, "kv", "kv-keep")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVolume(ctx, "kv"); err != nil {
		t.Fatal(err)
	}
	err = env.c.DeleteTenant(ctx, name, false)
	wantStatus(t, "delete a tenant that keeps a volume snapshot", err, 409, "")
	if !strings.Contains(err.Error(), "1 volume snapshots") {
		t.Errorf("the refusal does not count the volume snapshot: %v", err)
	}
	if l, err := c.VolumeSnapshots(ctx, "kv"); err != nil || len(l) != 1 || l[0].ID != sn.ID {
		t.Fatalf("the volume snapshot after the refused delete: %+v %v", l, err)
	}
	if err := env.c.DeleteTenant(ctx, name, true); err != nil {
		t.Fatal(err)
	}
}
