// Package datadir names every path of a daemon's data directory and the
// host-wide names derived from it. The daemon builds one Layout and hands
// each part what it needs (a storage driver its own directory, the
// template catalog the templates, the runtimes their roots); nothing
// below the daemon computes the paths of another concern. It sits at the
// bottom of the stack: it imports nothing of forkbox.
//
// The paths are the on-disk format: a data directory made by an earlier
// version must keep working, so none of them changes.
package datadir

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Layout names every path under the data directory Root (absolute). The
// zero value is not usable; build it with New, or set Root to an absolute
// path.
//
//	DIR/
//	  api-key                 the generated API key (0600)
//	  daemon.lock             held (flock) by the daemon that runs on it
//	  forkbox.db              SQLite state
//	  bin/forkbox-agent       the agent binary mounted into sandboxes
//	  runc/                   runc's state root
//	  templates/NAME/         template.json + rootfs/ (no rootfs/ when the
//	                          storage driver holds the only copy: Template.Storage)
//	  layers/                 compressed layers pulled from registries, once
//	                          each by digest (storage/layercache)
//	  storage/DRIVER/         writable layers and snapshots (btrfs or overlay;
//	                          a loop-mounted DRIVER.img beside it when needed)
//	  sandboxes/ID/           runtime state, agent.sock, hosts, hostname
//	  fleet/jetstream/        the embedded NATS server's JetStream store
//	                          (host registry, snapshot objects: package fleet)
//	  fleet/cache/            sealed snapshots pulled from the fleet's object
//	                          store, bounded, least recently used evicted first
type Layout struct{ Root string }

// New returns the layout of the data directory dir, made absolute against
// the working directory. The error is filepath.Abs's.
func New(dir string) (Layout, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Layout{}, err
	}
	return Layout{Root: abs}, nil
}

// APIKey is the file holding the generated API key.
func (l Layout) APIKey() string { return filepath.Join(l.Root, "api-key") }

// Lock is the file a daemon on the data directory holds an exclusive
// flock on while it runs (and forkbox down while it works).
func (l Layout) Lock() string { return filepath.Join(l.Root, "daemon.lock") }

// Database is the SQLite database file.
func (l Layout) Database() string { return filepath.Join(l.Root, "forkbox.db") }

// AgentBinary is the daemon's private copy of forkbox-agent.
func (l Layout) AgentBinary() string { return filepath.Join(l.Root, "bin", "forkbox-agent") }

// RuncRoot is runc's --root.
func (l Layout) RuncRoot() string { return filepath.Join(l.Root, "runc") }

// Merges holds the journals and staged files of merges being applied
// (one directory per session; replayed or rolled back at start-up).
func (l Layout) Merges() string { return filepath.Join(l.Root, "merges") }

// MemorySnapshots holds the sealed memory checkpoints, one directory per snapshot id.
func (l Layout) MemorySnapshots() string { return filepath.Join(l.Root, "memory") }

// Scratch holds memory checkpoints decrypted for a restore while it runs:
// a directory in /dev/shm (tmpfs, so they never land on a disk in the
// clear) named after the data directory, or CheckpointScratch when
// /dev/shm is not a tmpfs. The daemon empties it at start-up.
func (l Layout) Scratch() string {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err == nil && st.Type == unix.TMPFS_MAGIC {
		sum := sha256.Sum256([]byte(l.Root))
		return filepath.Join("/dev/shm", "forkbox-"+hex.EncodeToString(sum[:6]))
	}
	return l.CheckpointScratch()
}

// CheckpointScratch is where the runtime writes a checkpoint before it is
// sealed (and removed): on the data directory's disk, not in tmpfs, since
// the runtime's writes are charged to the sandbox's memory cgroup and tmpfs
// pages cannot be reclaimed (a sandbox using more than half its memory
// would be killed by its own checkpoint). The daemon empties it at start-up.
func (l Layout) CheckpointScratch() string { return filepath.Join(l.Root, "scratch") }

// SnapshotKey is the file of the key that seals memory checkpoints.
func (l Layout) SnapshotKey() string { return filepath.Join(l.Root, "keys", "snapshot.key") }

// FleetStore is the embedded NATS server's JetStream store directory
// (package fleet): the host registry and, on this node, its share of the
// fleet's replicated buckets.
func (l Layout) FleetStore() string { return filepath.Join(l.Root, "fleet", "jetstream") }

// FleetCache is the bounded cache of sealed snapshots pulled from the
// fleet's object store (fleet.Cache); what it holds is still encrypted.
func (l Layout) FleetCache() string { return filepath.Join(l.Root, "fleet", "cache") }

// FleetExports holds files snapshots being sealed for the fleet's object
// store (one directory per snapshot id, sealed, removed once copied);
// emptied at start-up.
func (l Layout) FleetExports() string { return filepath.Join(l.Root, "fleet", "exports") }

// FleetImports marks the snapshots imported from other hosts: one
// ID.json each, holding for a memory snapshot the network of the session
// it was taken of.
func (l Layout) FleetImports() string { return filepath.Join(l.Root, "fleet", "imports") }

// RunscRoot is runsc's (gVisor's) --root.
func (l Layout) RunscRoot() string { return filepath.Join(l.Root, "runsc") }

// Templates is the directory of all templates.
func (l Layout) Templates() string { return filepath.Join(l.Root, "templates") }

// Layers is the layer cache: the compressed layers of images pulled from
// registries, kept once each by digest (storage/layercache).
func (l Layout) Layers() string { return filepath.Join(l.Root, "layers") }

// BuildCache is the Dockerfile builder's step cache (package build): one
// file per tenant and step key naming the snapshot the step made.
func (l Layout) BuildCache() string { return filepath.Join(l.Root, "build-cache") }

// Template is the directory of template name.
func (l Layout) Template(name string) string { return filepath.Join(l.Templates(), name) }

// Storage is the directory of storage driver name (its volume is mounted
// there when it brings its own).
func (l Layout) Storage(name string) string { return filepath.Join(l.StorageRoot(), name) }

// StorageRoot is the directory holding every storage driver's directory
// (and their volume images).
func (l Layout) StorageRoot() string { return filepath.Join(l.Root, "storage") }

// SpareRoot is the empty, read-only root spare sandboxes start on (made
// by the daemon; nothing writes it after).
func (l Layout) SpareRoot() string { return filepath.Join(l.Root, "spare-root") }

// Sandboxes is the directory of all sandboxes.
func (l Layout) Sandboxes() string { return filepath.Join(l.Root, "sandboxes") }

// Volumes is where the volume service stages the empty template volumes
// are made from (package volume; the volumes themselves are storage
// layers).
func (l Layout) Volumes() string { return filepath.Join(l.Root, "volumes") }

// Netns is the directory of the sandboxes' network namespace files
// (netpolicy; root only).
func (l Layout) Netns() string { return filepath.Join(l.Root, "netns") }

// HostNames are the names of the host-wide objects a daemon makes outside
// its data directory: every daemon on a host has its own, so that one
// never touches another's (tests, several daemons, a blue/green restart),
// and a daemon restarted on the same data directory finds its own again.
type HostNames struct {
	// CgroupParent is the cgroup, in every hierarchy, under which its
	// sandboxes' cgroups are made ("forkbox-" and 10 hex digits).
	CgroupParent string
	// NftTable is its nftables table (family inet) on the host: the
	// fence of its sandboxes' host links.
	NftTable string
	// LinkGroup is the interface group (IFLA_GROUP) of its sandboxes'
	// host links, by which its table tells them from other daemons' (0:
	// none, as before names were per daemon).
	LinkGroup uint32
}

// legacyName is the one name every daemon used for its cgroup parent and
// nftables table before each daemon had its own.
const legacyName = "forkbox"

// LegacyHostNames are the names of daemons from before HostNames: one
// cgroup parent and one table for every daemon on the host, and no link
// group. A daemon adopts sandboxes made under them (see HostNames).
func LegacyHostNames() HostNames { return HostNames{CgroupParent: legacyName, NftTable: legacyName} }

// HostNames derives the daemon's host-wide names from the data directory
// (its absolute path): sha256 of it names them, so two data directories
// collide with odds of 2^-40 (names) and 2^-31 (link group).
func (l Layout) HostNames() HostNames {
	sum := sha256.Sum256([]byte("forkbox host names\x00" + l.Root))
	tag := legacyName + "-" + hex.EncodeToString(sum[:5])
	// The top bit set keeps it clear of 0 (no group) and of small groups
	// an administrator may use.
	return HostNames{CgroupParent: tag, NftTable: tag, LinkGroup: binary.BigEndian.Uint32(sum[5:9]) | 1<<31}
}

// Sandbox is the directory of sandbox id.
func (l Layout) Sandbox(id string) string { return filepath.Join(l.Sandboxes(), id) }
