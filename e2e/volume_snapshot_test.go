package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// needBtrfsVolumes skips t unless the shared daemon's storage holds
// volumes.
func needBtrfsVolumes(t *testing.T) {
	t.Helper()
	need(t)
	if s := os.Getenv("FORKBOX_STORAGE"); s != "" && s != "btrfs" {
		t.Skip("volumes need the btrfs storage driver; this run uses " + s)
	}
}

// cleanupVolume removes volume name when the test ends (after the
// sessions made later, whose cleanups run first).
func cleanupVolume(t *testing.T, c *client.Client, name string) {
	t.Cleanup(func() { _ = c.DeleteVolume(ctxFor(t, time.Minute), name) })
}

// TestVolumeSnapshotOnItsOwn: a volume written in a session is
// snapshotted on its own while that session keeps it mounted; a new
// volume made from the snapshot holds the data as it was, is mounted
// read-write by another session while the first still mounts the source
// (no 409: it is another volume), is written independently of the source,
// keeps the source's quota (over it, writes fail with a quota or space
// error), and outlives its snapshot. Another tenant sees none of it.
func TestVolumeSnapshotOnItsOwn(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 5*time.Minute)
	if _, err := env.c.CreateVolume(ctx, "vsrc", 8); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, env.c, "vsrc")
	cleanupVolume(t, env.c, "vcopy")
	a := newSession(t, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "vsrc", Path: "/home/user/data"}}})
	sh(t, a.ID, "echo one > /home/user/data/note")

	sn, err := env.c.SnapshotVolume(ctx, "vsrc", "vsrc-one")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteVolumeSnapshot(ctxFor(t, time.Minute), "vsrc", sn.ID) })
	if sn.Volume != "vsrc" || sn.SizeMB != 8 || sn.Name != "vsrc-one" || sn.ID == "" {
		t.Fatalf("snapshot %+v", sn)
	}
	_, err = env.c.SnapshotVolume(ctx, "vsrc", "vsrc-one")
	wantStatus(t, "second snapshot with the name", err, 409, "")
	_, err = env.c.SnapshotVolume(ctx, "nosuch", "")
	wantStatus(t, "snapshot of no volume", err, 404, "")
	sh(t, a.ID, "echo two > /home/user/data/note")

	v, err := env.c.CreateVolumeFrom(ctx, "vcopy", "vsrc-one", 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeMB != 8 {
		t.Fatalf("copy %+v, want the source's 8 MiB", v)
	}
	_, err = env.c.CreateVolumeFrom(ctx, "vother", "nosuch", 0)
	wantStatus(t, "create from no snapshot", err, 400, "from")
	b := newSession(t, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "vcopy", Path: "/home/user/data"}}})
	if out := sh(t, b.ID, "cat /home/user/data/note"); out != "one\n" {
		t.Fatalf("the copy holds %q, want the snapshot's", out)
	}
	sh(t, b.ID, "echo copy > /home/user/data/note && echo new > /home/user/data/only-copy")
	if out := sh(t, a.ID, "cat /home/user/data/note; ls /home/user/data"); out != "two\nnote\n" {
		t.Fatalf("the source after writes to the copy: %q", out)
	}
	res, _, errOut := run(t, b.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=/home/user/data/fill bs=1M count=32 conv=fsync"})
	if low := strings.ToLower(errOut); res.ExitCode == 0 || !strings.Contains(low, "quota") && !strings.Contains(low, "space") {
		t.Errorf("writing 32 MiB into the 8 MiB copy: exit %d, %q", res.ExitCode, errOut)
	}
	sh(t, b.ID, "rm -f /home/user/data/fill")

	list, err := env.c.VolumeSnapshots(ctx, "vsrc")
	if err != nil || len(list) != 1 || list[0].ID != sn.ID {
		t.Fatalf("snapshots of vsrc: %+v %v", list, err)
	}

	// Another tenant: not listed, not usable, not deletable.
	_, _, other := newTenant(t, env.c, "vsnap", client.TenantPolicy{})
	_, err = other.VolumeSnapshots(ctx, "vsrc")
	wantStatus(t, "another tenant's list", err, 404, "")
	_, err = other.SnapshotVolume(ctx, "vsrc", "")
	wantStatus(t, "another tenant's snapshot", err, 404, "")
	_, err = other.CreateVolumeFrom(ctx, "stolen", sn.ID, 0)
	wantStatus(t, "another tenant's create from the id", err, 400, "from")
	_, err = other.CreateVolumeFrom(ctx, "stolen", "vsrc-one", 0)
	wantStatus(t, "another tenant's create from the name", err, 400, "from")
	wantStatus(t, "another tenant's delete", other.DeleteVolumeSnapshot(ctx, "vsrc", sn.ID), 404, "")

	// The copy keeps its data once the snapshot is gone.
	if err := env.c.DeleteVolumeSnapshot(ctx, "vsrc", "vsrc-one"); err != nil {
		t.Fatal(err)
	}
	if out := sh(t, b.ID, "cat /home/user/data/note /home/user/data/only-copy"); out != "copy\nnew\n" {
		t.Fatalf("the copy after its snapshot went: %q", out)
	}
	if list, err := env.c.VolumeSnapshots(ctx, "vsrc"); err != nil || len(list) != 0 {
		t.Fatalf("snapshots after the delete: %+v %v", list, err)
	}
}

// TestVolumeSnapshotWithSession: a session that mounts a volume
// read-write (and another read-only) is forked into two children; each
// child gets its own copy of the read-write volume as it was at the
// snapshot, taken in the same freeze as the session's files (a loop that
// writes a counter to the volume and then to the session's own files is
// seen at most one step apart), and the read-only volume itself; writes
// in one child are seen by neither the other nor the parent; a copy keeps
// the volume's quota; a child's copy is removed when the child ends.
func TestVolumeSnapshotWithSession(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 6*time.Minute)
	for _, n := range []string{"vsess", "vshared"} {
		if _, err := env.c.CreateVolume(ctx, n, 8); err != nil {
			t.Fatal(err)
		}
		cleanupVolume(t, env.c, n)
	}
	seed := newSession(t, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "vshared", Path: "/mnt/shared"}}})
	sh(t, seed.ID, "echo shared > /mnt/shared/s")
	if err := env.c.DeleteSession(ctx, seed.ID); err != nil {
		t.Fatal(err)
	}
	p := newSession(t, client.CreateRequest{Volumes: []client.VolumeMount{
		{Name: "vsess", Path: "/home/user/work"}, {Name: "vshared", Path: "/mnt/shared", ReadOnly: true}}})
	sh(t, p.ID, "echo at-snapshot > /home/user/work/f")
	// The counter loop: the volume first, then the session's own file.
	sh(t, p.ID, `sh -c 'i=0; while [ ! -e /home/user/stop ]; do i=$((i+1)); echo $i > /home/user/work/n.t && mv /home/user/work/n.t /home/user/work/n; echo $i > /home/user/n.t && mv /home/user/n.t /home/user/n; done' </dev/null >/dev/null 2>&1 &
sleep 0.5`)
	fr, err := env.c.ForkSession(ctx, p.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), fr.Snapshot.ID, true) })
	for _, c := range fr.Sessions {
		id := c.ID
		t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), id) })
	}
	sh(t, p.ID, "touch /home/user/stop")
	if len(fr.Sessions) != 2 {
		t.Fatalf("fork started %d sessions", len(fr.Sessions))
	}
	c1, c2 := fr.Sessions[0], fr.Sessions[1]
	for _, c := range fr.Sessions {
		if len(c.Volumes) != 2 || c.Volumes[0].Name != "vsess-"+c.ID || c.Volumes[0].Path != "/home/user/work" || c.Volumes[0].ReadOnly ||
			c.Volumes[1].Name != "vshared" || !c.Volumes[1].ReadOnly {
			t.Fatalf("child %s volumes %+v", c.ID, c.Volumes)
		}
		out := sh(t, c.ID, "cat /home/user/work/f /mnt/shared/s; cat /home/user/work/n; cat /home/user/n")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || lines[0] != "at-snapshot" || lines[1] != "shared" {
			t.Fatalf("child %s reads %q", c.ID, out)
		}
		vn, _ := strconv.Atoi(lines[2])
		ln, _ := strconv.Atoi(lines[3])
		if vn < 1 || vn-ln < 0 || vn-ln > 1 {
			t.Errorf("child %s: the volume's counter is %d, the session's %d: not captured in one freeze", c.ID, vn, ln)
		}
		v, err := env.c.GetVolume(ctx, c.Volumes[0].Name)
		if err != nil || v.Session != c.ID || v.SizeMB != 8 || v.WriterSession != c.ID {
			t.Fatalf("child %s's copy %+v %v", c.ID, v, err)
		}
	}
	// The parent still holds its volume read-write.
	if v, err := env.c.GetVolume(ctx, "vsess"); err != nil || v.WriterSession != p.ID {
		t.Fatalf("the parent's volume %+v %v", v, err)
	}
	sh(t, c1.ID, "echo c1 > /home/user/work/f")
	sh(t, p.ID, "echo parent > /home/user/work/f")
	if out := sh(t, c2.ID, "cat /home/user/work/f"); out != "at-snapshot\n" {
		t.Errorf("the second child reads %q after writes in the first and the parent", out)
	}
	if out := sh(t, p.ID, "cat /home/user/work/f"); out != "parent\n" {
		t.Errorf("the parent reads %q", out)
	}
	if out := sh(t, c1.ID, "cat /home/user/work/f"); out != "c1\n" {
		t.Errorf("the first child reads %q", out)
	}
	res, _, errOut := run(t, c2.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=/home/user/work/fill bs=1M count=32 conv=fsync"})
	if low := strings.ToLower(errOut); res.ExitCode == 0 || !strings.Contains(low, "quota") && !strings.Contains(low, "space") {
		t.Errorf("writing 32 MiB into the child's 8 MiB copy: exit %d, %q", res.ExitCode, errOut)
	}

	// A child's copy ends with it; the other's stays while it lives.
	if err := env.c.DeleteSession(ctx, c1.ID); err != nil {
		t.Fatal(err)
	}
	_, err = env.c.GetVolume(ctx, "vsess-"+c1.ID)
	wantStatus(t, "the ended child's copy", err, 404, "")
	if _, err := env.c.GetVolume(ctx, "vsess-"+c2.ID); err != nil {
		t.Fatalf("the live child's copy: %v", err)
	}
	// A session restored later from the snapshot gets a new copy.
	r := newSession(t, client.CreateRequest{Snapshot: fr.Snapshot.ID})
	if out := sh(t, r.ID, "cat /home/user/work/f"); out != "at-snapshot\n" {
		t.Errorf("a session restored from the snapshot reads %q", out)
	}
	// Deleting the snapshot (forced: its sessions go) leaves no copy.
	if err := env.c.DeleteSnapshot(ctx, fr.Snapshot.ID, true); err != nil {
		t.Fatal(err)
	}
	vs, err := env.c.Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if strings.HasPrefix(v.Name, "vsess-") {
			t.Errorf("copy %s (of session %s) outlived its session", v.Name, v.Session)
		}
	}
}

// TestVolumeSnapshotsNeedBtrfs: on a daemon whose storage is overlay the
// volume calls answer 400 saying volumes need btrfs (run with
// FORKBOX_STORAGE=overlay).
func TestVolumeSnapshotsNeedBtrfs(t *testing.T) {
	need(t)
	if os.Getenv("FORKBOX_STORAGE") != "overlay" {
		t.Skip("checks an overlay daemon; run with FORKBOX_STORAGE=overlay")
	}
	ctx := ctxFor(t, time.Minute)
	_, err := env.c.CreateVolume(ctx, "nobtrfs", 8)
	wantStatus(t, "create", err, 400, "")
	_, err = env.c.SnapshotVolume(ctx, "nobtrfs", "")
	wantStatus(t, "snapshot", err, 400, "")
	_, err = env.c.VolumeSnapshots(ctx, "nobtrfs")
	wantStatus(t, "list snapshots", err, 400, "")
	_, err = env.c.CreateVolumeFrom(ctx, "nobtrfs2", "x", 0)
	wantStatus(t, "create from", err, 400, "")
	if err == nil || !strings.Contains(err.Error(), "btrfs") {
		t.Errorf("the refusal does not say why: %v", err)
	}
}

// TestCLIVolumeSnapshot: `forkbox volume snapshot`, `volume snapshots`,
// `volume create --from` (the snapshotted size unless --size) and
// `volume snapshots --rm` work against the daemon.
func TestCLIVolumeSnapshot(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := env.c.CreateVolume(ctx, "clivol", 4); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, env.c, "clivol")
	cleanupVolume(t, env.c, "clivol2")
	cleanupVolume(t, env.c, "clivol3")
	out, errOut, code := forkbox(t, "", "volume", "snapshot", "clivol", "--name", "clivol-s1")
	id := strings.TrimSpace(out)
	if code != 0 || id == "" {
		t.Fatalf("volume snapshot: exit %d, %q %q", code, out, errOut)
	}
	t.Cleanup(func() { _ = env.c.DeleteVolumeSnapshot(ctxFor(t, time.Minute), "clivol", id) })
	if out, errOut, code = forkbox(t, "", "volume", "snapshots", "clivol"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "clivol-s1") {
		t.Fatalf("volume snapshots: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code = forkbox(t, "", "volume", "create", "clivol2", "--from", "clivol-s1"); code != 0 || !strings.Contains(out, "(4 MiB)") {
		t.Fatalf("volume create --from: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code = forkbox(t, "", "volume", "create", "clivol3", "--from", id, "--size", "16M"); code != 0 || !strings.Contains(out, "(16 MiB)") {
		t.Fatalf("volume create --from --size: exit %d, %q %q", code, out, errOut)
	}
	if out, errOut, code = forkbox(t, "", "volume", "snapshots", "clivol", "--rm", "clivol-s1"); code != 0 {
		t.Fatalf("volume snapshots --rm: exit %d, %q %q", code, out, errOut)
	}
	if l, err := env.c.VolumeSnapshots(ctx, "clivol"); err != nil || len(l) != 0 {
		t.Fatalf("after --rm: %+v %v", l, err)
	}
}

// TestVolumeCopiesCountAgainstTenant: a tenant's max_volumes counts the
// copies a fork makes: with a limit of 2 and one volume, a fork of 2
// children of a session mounting it is refused with 429 (all or nothing:
// no child and no copy is left), a fork of 1 fits, and a further volume
// create is refused while that child lives.
func TestVolumeCopiesCountAgainstTenant(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 4*time.Minute)
	_, _, c := newTenant(t, env.c, "volquota", client.TenantPolicy{MaxVolumes: 2})
	sn := snapshotWithVolume(t, ctx, c, "qv", "/home/user/q")
	_, err := c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 2})
	wantStatus(t, "fork of 2 past max_volumes 2", err, 429, "")
	vs, err := c.Volumes(ctx)
	if err != nil || len(vs) != 1 {
		t.Fatalf("volumes after the refused fork: %+v %v", vs, err)
	}
	fr, err := c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSession(ctxFor(t, time.Minute), fr.Sessions[0].ID) })
	_, err = c.CreateVolume(ctx, "qv2", 4)
	wantStatus(t, "a third volume", err, 429, "")
	if err := c.DeleteSession(ctx, fr.Sessions[0].ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, "qv2", 4); err != nil {
		t.Fatalf("a second volume once the child's copy went: %v", err)
	}
	cleanupVolume(t, c, "qv2")
}

// TestVolumeCopyEndsAcrossRestart: a child whose timeout passes while no
// daemon runs ends when the next daemon adopts it, and its volume copy
// goes with it; the parent's volume and the snapshot stay.
func TestVolumeCopyEndsAcrossRestart(t *testing.T) {
	needBtrfsVolumes(t)
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := o.c.CreateVolume(ctx, "rv", 4); err != nil {
		t.Fatal(err)
	}
	p, _, err := o.c.CreateSession(ctx, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "rv", Path: "/home/user/rv"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := o.c.ExecCollect(ctx, p.ID, client.ExecRequest{Cmd: "echo kept > /home/user/rv/f"}); err != nil || out.ExitCode != 0 {
		t.Fatalf("write: %+v %v", out, err)
	}
	fr, err := o.c.ForkSession(ctx, p.ID, client.ForkRequest{Count: 1, CreateRequest: client.CreateRequest{TimeoutS: 5}})
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Sessions[0].ID
	if _, err := o.c.GetVolume(ctx, "rv-"+child); err != nil {
		t.Fatalf("the child's copy: %v", err)
	}
	o.restart(t, func() { time.Sleep(6 * time.Second) })
	_, err = o.c.GetVolume(ctx, "rv-"+child)
	wantStatus(t, "the copy of a child that timed out while no daemon ran", err, 404, "")
	if v, err := o.c.GetVolume(ctx, "rv"); err != nil || v.WriterSession != p.ID {
		t.Fatalf("the parent's volume after the restart: %+v %v", v, err)
	}
	// A new child from the snapshot still gets the volume as captured.
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Snapshot: fr.Snapshot.ID}, "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "cat /home/user/rv/f"})
	if err != nil || string(out.Stdout) != "kept\n" {
		t.Fatalf("a new child after the restart: %+v %v", out, err)
	}
	for _, id := range []string{s.ID, p.ID} {
		if err := o.c.DeleteSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.c.DeleteSnapshot(ctx, fr.Snapshot.ID, true); err != nil {
		t.Fatal(err)
	}
	if err := o.c.DeleteVolume(ctx, "rv"); err != nil {
		t.Fatal(err)
	}
	if vs, err := o.c.Volumes(ctx); err != nil || len(vs) != 0 {
		t.Fatalf("volumes left: %+v %v", vs, err)
	}
}

// volumeEntries lists the btrfs layers and snapshots of volumes in the
// shared daemon's storage (volume layer and volume snapshot ids).
func volumeEntries(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, d := range []struct{ dir, prefix string }{{"layers", "_vol"}, {"snapshots", "_vsnap"}} {
		ents, err := os.ReadDir(filepath.Join(env.dataDir, "storage", "btrfs", d.dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), d.prefix) && !strings.HasSuffix(e.Name(), ".json") {
				out[d.dir+"/"+e.Name()] = true
			}
		}
	}
	return out
}

// TestTenantDeleteTakesVolumes: a tenant that keeps volumes is not
// deleted without force (409 counting them); forced, its volumes and
// volume snapshots go, files and all.
func TestTenantDeleteTakesVolumes(t *testing.T) {
	needBtrfsVolumes(t)
	ctx := ctxFor(t, 2*time.Minute)
	before := volumeEntries(t)
	name, _, c := newTenant(t, env.c, "voldel", client.TenantPolicy{})
	if _, err := c.CreateVolume(ctx, "tv", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SnapshotVolume(ctx, "tv", "tv-snap"); err != nil {
		t.Fatal(err)
	}
	var made []string
	for e := range volumeEntries(t) {
		if !before[e] {
			made = append(made, e)
		}
	}
	if len(made) != 2 {
		t.Fatalf("the tenant's volume and snapshot on disk: %v", made)
	}
	err := env.c.DeleteTenant(ctx, name, false)
	wantStatus(t, "delete a tenant with a volume", err, 409, "")
	if !strings.Contains(err.Error(), "1 volumes") {
		t.Errorf("the refusal does not count the volume: %v", err)
	}
	if err := env.c.DeleteTenant(ctx, name, true); err != nil {
		t.Fatal(err)
	}
	after := volumeEntries(t)
	for _, e := range made {
		if after[e] {
			t.Errorf("%s outlived its tenant", e)
		}
	}
}

// TestGVisorMemorySnapshotWithVolume: a gVisor session that mounts a
// volume read-write is memory-snapshotted; a session restored from it gets
// its own copy of the volume at the same path, with the files as at the
// snapshot, and writes there unseen by the parent.
func TestGVisorMemorySnapshotWithVolume(t *testing.T) {
	needBtrfsVolumes(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("needs runsc")
	}
	ctx := ctxFor(t, 4*time.Minute)
	if _, err := env.c.CreateVolume(ctx, "gvol", 8); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, env.c, "gvol")
	p := newSession(t, client.CreateRequest{Isolation: "gvisor", Volumes: []client.VolumeMount{{Name: "gvol", Path: "/home/user/g"}}})
	sh(t, p.ID, "echo at-snapshot > /home/user/g/f")
	sn := memorySnapshot(t, p.ID)
	sh(t, p.ID, "echo parent > /home/user/g/f")
	r := newSession(t, client.CreateRequest{Snapshot: sn.ID})
	if len(r.Volumes) != 1 || r.Volumes[0].Name != "gvol-"+r.ID {
		t.Fatalf("restored session volumes %+v", r.Volumes)
	}
	if out := sh(t, r.ID, "cat /home/user/g/f"); out != "at-snapshot\n" {
		t.Errorf("the restored session reads %q", out)
	}
	sh(t, r.ID, "echo restored > /home/user/g/f")
	if out := sh(t, p.ID, "cat /home/user/g/f"); out != "parent\n" {
		t.Errorf("the parent reads %q after a write in the restored session", out)
	}
}

// snapshotWithVolume makes volume vol (4 MB) for c's tenant, a session
// mounting it read-write at path, and a snapshot of that session, all
// removed when t ends (the snapshot forced, the session, then the
// volume).
func snapshotWithVolume(t *testing.T, ctx context.Context, c *client.Client, vol, path string) *client.Snapshot {
	t.Helper()
	if _, err := c.CreateVolume(ctx, vol, 4); err != nil {
		t.Fatal(err)
	}
	cleanupVolume(t, c, vol)
	p, _, err := c.CreateSession(ctx, client.CreateRequest{Volumes: []client.VolumeMount{{Name: vol, Path: path}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSession(ctxFor(t, time.Minute), p.ID) })
	sn, err := c.Snapshot(ctx, p.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true) })
	return sn
}
