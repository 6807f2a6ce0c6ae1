package datadir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPathsOnDisk proves the layout names the same paths as the versions
// before it, so a data directory made by them keeps working.
func TestPathsOnDisk(t *testing.T) {
	l := Layout{Root: "/var/lib/forkbox"}
	for got, want := range map[string]string{
		l.APIKey():            "/var/lib/forkbox/api-key",
		l.Lock():              "/var/lib/forkbox/daemon.lock",
		l.Database():          "/var/lib/forkbox/forkbox.db",
		l.AgentBinary():       "/var/lib/forkbox/bin/forkbox-agent",
		l.RuncRoot():          "/var/lib/forkbox/runc",
		l.RunscRoot():         "/var/lib/forkbox/runsc",
		l.MemorySnapshots():   "/var/lib/forkbox/memory",
		l.CheckpointScratch(): "/var/lib/forkbox/scratch",
		l.SnapshotKey():       "/var/lib/forkbox/keys/snapshot.key",
		l.Templates():         "/var/lib/forkbox/templates",
		l.Template("base"):    "/var/lib/forkbox/templates/base",
		l.Layers():            "/var/lib/forkbox/layers",
		l.StorageRoot():       "/var/lib/forkbox/storage",
		l.Storage("btrfs"):    "/var/lib/forkbox/storage/btrfs",
		l.Sandboxes():         "/var/lib/forkbox/sandboxes",
		l.Sandbox("abc"):      "/var/lib/forkbox/sandboxes/abc",
		l.Netns():             "/var/lib/forkbox/netns",
		l.Volumes():           "/var/lib/forkbox/volumes",
		l.FleetStore():        "/var/lib/forkbox/fleet/jetstream",
		l.FleetCache():        "/var/lib/forkbox/fleet/cache",
	} {
		if got != want {
			t.Errorf("path %q, want %q", got, want)
		}
	}
	if s := l.Scratch(); s != "/dev/shm/forkbox-dd22b3742bb7" && s != l.CheckpointScratch() {
		t.Errorf("Scratch() = %q: neither the tmpfs name of earlier versions nor the disk fallback", s)
	}
}

// TestHostNames proves the host-wide names derived from a data directory
// are those earlier versions derived (so a restarted daemon finds its
// cgroups, table and links again), differ between data directories, and
// keep the legacy names apart.
func TestHostNames(t *testing.T) {
	n := Layout{Root: "/var/lib/forkbox"}.HostNames()
	want := HostNames{CgroupParent: "forkbox-5f10531d8b", NftTable: "forkbox-5f10531d8b", LinkGroup: 4157360489}
	if n != want {
		t.Fatalf("HostNames() = %+v, want %+v", n, want)
	}
	other := Layout{Root: "/var/lib/forkbox2"}.HostNames()
	if other.CgroupParent == n.CgroupParent || other.LinkGroup == n.LinkGroup || other.LinkGroup&(1<<31) == 0 {
		t.Fatalf("names of another data directory %+v", other)
	}
	if l := LegacyHostNames(); l.CgroupParent != "forkbox" || l.NftTable != "forkbox" || l.LinkGroup != 0 {
		t.Fatalf("LegacyHostNames() = %+v", l)
	}
}

// TestNewIsAbsolute proves New anchors a relative data directory at the
// working directory, so names derived from it do not depend on how the
// path was spelled.
func TestNewIsAbsolute(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	l, err := New("data/../data")
	if err != nil {
		t.Fatal(err)
	}
	if l.Root != filepath.Join(wd, "data") || !strings.HasPrefix(l.Root, "/") {
		t.Fatalf("Root %q, want %q", l.Root, filepath.Join(wd, "data"))
	}
	if abs, _ := New(filepath.Join(wd, "data")); abs.HostNames() != l.HostNames() {
		t.Fatal("the same directory spelled two ways got two sets of host names")
	}
}
