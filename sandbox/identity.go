package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/userns"
)

// hostResources owns what a sandbox takes from the host besides its
// storage and runtime: its own host ids (package userns, identity.go) and
// its network attachment through the egress proxy (network.go), each
// given when the sandbox is made or adopted and given back when it ends.
type hostResources struct{ m *Manager }

// identity is a sandbox's host identity: the host ids it runs as and the
// user namespace that maps them (package userns). Drivers that cannot join
// a namespace the host made (gVisor, whose Sentry serves the sandbox's
// system calls and keeps such counts itself) have none and run on the
// shared storage ids.
type identity struct {
	slice userns.Slice
	// hostID is the host id of the sandbox's uid 0: the slice's first id
	// when the root filesystem is id-mapped into the slice, else the
	// storage ids' base (the storage driver's filesystem cannot be
	// id-mapped; the namespace is still the slice's own).
	hostID uint32
	// rootfs is the root filesystem as the sandbox sees it: the id-mapped
	// mount, or the storage driver's directory.
	rootfs string
	dir    string // the sandbox's state directory
}

// Paths of an identity's files in the sandbox's state directory.
const (
	identityUserns = "userns" // the user namespace, bind-mounted
	identityRootfs = "rootfs" // the id-mapped root filesystem
)

// newIdentity claims a slice for sandbox sb and id-maps its storage root
// filesystem into it (when the filesystem can be id-mapped). It returns
// nil when sb's driver has no use for one. The namespaces are made by
// identity.create; on error the caller's cleanup (releaseIdentity)
// removes what was made.
func (hr *hostResources) newIdentity(sb *Sandbox, storageRoot string) (*identity, error) {
	if hr.m.opts.IDs == nil || !hr.m.runtimes.driverOf(sb).Capabilities().JoinUserNamespace {
		return nil, sandboxDirGroup(sb.dir, hr.m.opts.Shift.GIDBase)
	}
	s, err := hr.m.opts.IDs.Claim(sb.id)
	if err != nil {
		return nil, fmt.Errorf("host ids: %w", err)
	}
	id := &identity{slice: s, hostID: s.First, rootfs: filepath.Join(sb.dir, identityRootfs), dir: sb.dir}
	if err := os.Mkdir(id.rootfs, 0o755); err != nil {
		return nil, err
	}
	if storageRoot == "" { // a spare: its files come later (mapRoot)
		return id, sandboxDirGroup(sb.dir, id.hostID)
	}
	err = userns.MapMount(storageRoot, id.rootfs, hr.m.opts.Shift.UIDBase, s.First, hr.m.opts.Shift.Size)
	if errors.Is(err, userns.ErrIDMapUnsupported) {
		hr.m.idmapOnce.Do(func() {
			hr.m.log.Warn("the storage driver's filesystem cannot be id-mapped: sandboxes share the storage host ids "+
				"(each still has a user namespace of its own)", "storage", hr.m.opts.Storage.Name(), "err", err)
		})
		os.Remove(id.rootfs)
		id.hostID, id.rootfs = hr.m.opts.Shift.UIDBase, storageRoot
	} else if err != nil {
		return nil, err
	}
	// Only root and the sandbox's own ids may enter its directory: runc
	// mounts the root filesystem and the files beside it as the sandbox's
	// root, and no other host user may reach the sandbox's files.
	return id, sandboxDirGroup(sb.dir, id.hostID)
}

// mapRoot id-maps storage root filesystem storageRoot into spare sb's
// slice at its identity's rootfs and returns that path. Unlike a start,
// a spare has no fallback: on a filesystem that cannot be id-mapped the
// error is userns.ErrIDMapUnsupported (spares are not made there).
func (hr *hostResources) mapRoot(sb *Sandbox, storageRoot string) (string, error) {
	s, ok := hr.m.opts.IDs.Lookup(sb.id)
	if !ok {
		return "", fmt.Errorf("spare %s has no host ids", sb.id)
	}
	dst := filepath.Join(sb.dir, identityRootfs)
	if err := userns.MapMount(storageRoot, dst, hr.m.opts.Shift.UIDBase, s.First, hr.m.opts.Shift.Size); err != nil {
		return "", err
	}
	return dst, nil
}

// sandboxDirGroup makes a sandbox's state directory root:gid 0710.
func sandboxDirGroup(dir string, gid uint32) error {
	if err := os.Chown(dir, 0, int(gid)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// create makes the identity's user namespace (and, when netPath is set,
// the network namespace the sandbox gets on netPath, owned by it).
func (id *identity) create(ctx context.Context, netPath string) error {
	return userns.Create(ctx, userns.NamespaceOptions{
		Owner: id.slice, Map: userns.Mapping{HostID: id.hostID, Size: userns.SliceSize},
		UserPath: filepath.Join(id.dir, identityUserns), NetPath: netPath,
	})
}

// apply points cfg at the identity: its root filesystem, user namespace
// and id maps. Bind mounts of the storage root filesystem's own
// directories (binds) are taken from the id-mapped one.
func (id *identity) apply(cfg *runtime.Config, storageRoot string) {
	for i := range cfg.Mounts {
		if rel, err := filepath.Rel(storageRoot, cfg.Mounts[i].Source); err == nil && filepath.IsLocal(rel) {
			cfg.Mounts[i].Source = filepath.Join(id.rootfs, rel)
		}
	}
	cfg.RootFS = id.rootfs
	cfg.UserNamespace = filepath.Join(id.dir, identityUserns)
	cfg.UIDMap = []runtime.IDMap{{ContainerID: 0, HostID: id.hostID, Size: userns.SliceSize}}
	cfg.GIDMap = cfg.UIDMap
}

// releaseIdentity removes sandbox id's identity: the id-mapped root
// filesystem, the user namespace file and the slice claim. It is
// idempotent and runs for sandboxes of every driver (those without an
// identity have nothing to remove).
func (hr *hostResources) releaseIdentity(id string) error {
	dir := hr.m.opts.Layout.Sandbox(id)
	var errs []error
	for _, p := range []string{identityRootfs, identityUserns} {
		errs = append(errs, userns.RemoveFile(filepath.Join(dir, p)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if hr.m.opts.IDs != nil {
		return hr.m.opts.IDs.Release(id)
	}
	return nil
}
