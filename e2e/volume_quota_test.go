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

// TestE2BSnapshotDeleteDropsVolumes: E2B's snapshot delete (DELETE
// /templates/{id}), which keeps the sessions restored from the snapshot
// running, also removes the volume snapshots the session snapshot
// captured (they were left on disk, recorded, until the next start); the
// child keeps its copy.
func TestE2BSnapshotDeleteDropsVolumes(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 3*time.Minute)
	before := volumeEntries(t)
	if _, err := env.c.CreateVolume(ctx, "e2bdel", 4); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, env.c, "e2bdel")
	p, _, err := env.c.CreateSession(ctx, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "e2bdel", Path: "/home/user/d"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), p.ID) })
	if out, err := env.c.ExecCollect(ctx, p.ID, client.ExecRequest{Cmd: "echo kept > /home/user/d/f"}); err != nil || out.ExitCode != 0 {
		t.Fatalf("write: %+v %v", out, err)
	}
	fr, err := env.c.ForkSession(ctx, p.ID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Sessions[0].ID
	t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), child) })
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), fr.Snapshot.ID, true) })
	captured := 0
	for e := range volumeEntries(t) {
		if !before[e] && strings.HasPrefix(e, "snapshots/") {
			captured++
		}
	}
	if captured != 1 {
		t.Fatalf("%d volume snapshots on disk after the fork, want the one captured", captured)
	}
	if st, body := e2bCall(t, "DELETE", "/templates/"+fr.Snapshot.ID, ""); st != 204 {
		t.Fatalf("E2B delete of the snapshot: %d %s", st, body)
	}
	for e := range volumeEntries(t) {
		if !before[e] && strings.HasPrefix(e, "snapshots/") {
			t.Errorf("%s outlived its session snapshot", e)
		}
	}
	out, err := env.c.ExecCollect(ctx, child, client.ExecRequest{Cmd: "cat /home/user/d/f"})
	if err != nil || string(out.Stdout) != "kept\n" {
		t.Fatalf("the child's copy after the delete: %+v %v", out, err)
	}
}

// TestVolumeCopiesQuotaParallelForks: forks of one snapshot started at
// once cannot pass max_volumes together: with room for two copies, of
// four parallel forks of one child at most two succeed, the others are
// 429, and the tenant keeps at most its limit of volumes.
func TestVolumeCopiesQuotaParallelForks(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 4*time.Minute)
	_, _, c := newTenant(t, env.c, "volrace", client.TenantPolicy{MaxVolumes: 3})
	sn := snapshotWithVolume(t, ctx, c, "pv", "/home/user/p")
	type result struct {
		ids []string
		err error
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			fr, err := c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 1})
			var ids []string
			if err == nil {
				for _, s := range fr.Sessions {
					ids = append(ids, s.ID)
				}
			}
			results <- result{ids, err}
		}()
	}
	ok := 0
	for range 4 {
		r := <-results
		for _, id := range r.ids {
			t.Cleanup(func() { _ = c.DeleteSession(ctxFor(t, time.Minute), id) })
		}
		if r.err == nil {
			ok++
		} else {
			wantStatus(t, "a parallel fork past max_volumes", r.err, 429, "")
		}
	}
	vs, err := c.Volumes(ctx)
	if err != nil || ok > 2 || len(vs) != 1+ok {
		t.Fatalf("%d forks succeeded; volumes %+v %v", ok, vs, err)
	}
}
