package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/userns"
)

// volumeViewPrefix names the id-mapped views of a sandbox's volumes in its
// state directory (volume-0, volume-1, ...).
const volumeViewPrefix = "volume-"

// attachVolumes registers sandbox sb's volumes (its record's Volumes) with
// the volume service and returns their mounts. A volume's files are owned
// by the storage ids, as a template's are; a sandbox whose root
// filesystem is id-mapped into host ids of its own (ident) mounts an
// id-mapped view of each volume, made in its state directory, so that its
// user owns the volume's files inside as every other sandbox's does.
// rootfs is the sandbox's prepared root filesystem (host path): no mount
// target may pass through a symlink in it (checkVolumeTargets).
// cleanup (releaseVolumes) undoes it, also after an error here.
func (hr *hostResources) attachVolumes(ctx context.Context, sb *Sandbox, rootfs string, ident *identity) ([]runtime.Mount, error) {
	rec := sb.Record()
	if len(rec.Volumes) == 0 {
		return nil, nil
	}
	if hr.m.opts.Volumes == nil {
		return nil, errdefs.InvalidField("volumes", "this daemon has no volumes")
	}
	if err := checkVolumeTargets(rootfs, rec.Volumes); err != nil {
		return nil, err
	}
	rec, err := hr.copyVolumes(ctx, sb, rec)
	if err != nil {
		return nil, err
	}
	att, err := hr.m.opts.Volumes.Attach(ctx, rec.Tenant, sb.id, rec.Volumes)
	if err != nil {
		return nil, err
	}
	shift := hr.m.opts.Shift
	mounts := make([]runtime.Mount, 0, len(att))
	for i, a := range att {
		src := a.Source
		if ident != nil && ident.hostID != shift.UIDBase {
			view := filepath.Join(sb.dir, fmt.Sprintf("%s%d", volumeViewPrefix, i))
			if err := os.Mkdir(view, 0o755); err != nil {
				return nil, err
			}
			if err := userns.MapMount(src, view, shift.UIDBase, ident.hostID, shift.Size); err != nil {
				return nil, fmt.Errorf("id-map volume %q: %w", rec.Volumes[i].Name, err)
			}
			src = view
		}
		mounts = append(mounts, runtime.Mount{Source: src, Target: a.Target, ReadOnly: a.ReadOnly})
	}
	return mounts, nil
}

// copyVolumes makes the session's own copy of each read-write volume
// its snapshot captured (a mount with Snapshot set: a session restored
// from a session snapshot) and records the copies' names in its record,
// which it returns. The copies are the session's: its teardown removes
// them (releaseVolumes), also after an error here.
func (hr *hostResources) copyVolumes(ctx context.Context, sb *Sandbox, rec node.Session) (node.Session, error) {
	ms := append([]node.VolumeMount(nil), rec.Volumes...)
	copied := false
	for i, vm := range ms {
		if vm.Snapshot == "" {
			continue
		}
		c, err := hr.m.opts.Volumes.CopyForSession(ctx, rec.Tenant, sb.id, vm)
		if err != nil {
			return rec, err
		}
		ms[i], copied = c, true
	}
	if !copied {
		return rec, nil
	}
	return hr.m.save(ctx, sb, func(r *node.Session) error {
		r.Volumes = ms
		return nil
	})
}

// checkVolumeTargets refuses a volume mount whose target, in root
// filesystem rootfs (host path), passes through anything but real
// directories: a snapshot's /home/user/data may be a symlink its session
// planted (to /etc, say), which the runtime would follow inside the
// sandbox's root and so mount the volume over a system path that
// volume.CheckMounts refused by name. Components that do not exist yet
// are fine (the runtime makes them as directories). Nothing runs in
// rootfs yet, so what is checked is what the runtime finds. Errors are
// ErrInvalidArgument naming volumes[i].path, or the filesystem's.
func checkVolumeTargets(rootfs string, ms []node.VolumeMount) error {
	for i, m := range ms {
		cur := rootfs
		for _, part := range strings.Split(strings.TrimPrefix(m.Path, "/"), "/") {
			cur = filepath.Join(cur, part)
			fi, err := os.Lstat(cur)
			if errors.Is(err, os.ErrNotExist) {
				break
			}
			if err != nil {
				return err
			}
			if !fi.IsDir() {
				rel := strings.TrimPrefix(cur, rootfs)
				return errdefs.InvalidField(fmt.Sprintf("volumes[%d].path", i),
					"%q: %s in the sandbox's filesystem is %s, not a directory (a volume is mounted only on directories)",
					m.Path, rel, kindOf(fi.Mode()))
			}
		}
	}
	return nil
}

// releaseVolumes unmounts sandbox id's volume views and forgets its
// mounts in the volume service. It is idempotent.
func (hr *hostResources) releaseVolumes(id string) error {
	if hr.m.opts.Volumes == nil {
		return nil
	}
	views, _ := filepath.Glob(filepath.Join(hr.m.opts.Layout.Sandbox(id), volumeViewPrefix+"*"))
	var errs []error
	for _, v := range views {
		errs = append(errs, userns.RemoveFile(v))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	hr.m.opts.Volumes.Release(id)
	// The copies of a snapshot's volumes made for it end with it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hr.m.opts.Volumes.DropCopies(ctx, id, hr.m.log)
	return nil
}
