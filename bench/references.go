package bench

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/tartree"
)

// The snapshot row, interleaved with its references: a plain copy of as
// much data, and podman commit.

// measureSnapshot measures forkbox's files snapshot of a session that
// wrote SnapshotMB (each snapshot deleted afterwards, untimed), interleaved
// with `podman commit` of a container that wrote as much and a plain copy
// of as much data; the daemon's reported snapshot size goes in the note
// (a check that the data is in it).
func (e *env) measureSnapshot(ctx context.Context) []Result {
	f, mb := e.fb, e.opts.SnapshotMB
	ops := []string{OpSnapshot}
	id, err := f.writeSession(ctx, mb)
	if err != nil {
		return dataRows(failOps(ops, SystemForkbox, err), mb)
	}
	defer f.destroy(ctx, id) // close retries a failed destroy
	fb := contender{system: SystemForkbox, step: one(func(ctx context.Context) (time.Duration, error) {
		sn, d, err := f.snapshot(ctx, id)
		if err != nil {
			return 0, err
		}
		return d, f.deleteSnapshot(ctx, sn.ID, false)
	})}
	var cs []contender
	var extra []Result
	if e.p != nil {
		cp, cleanup, err := newCopyRef(e.opts, f.scratchDir())
		defer cleanup()
		if err != nil {
			extra = append(extra, newResult(OpSnapshot, SystemCopy, nil, err))
		} else {
			cs = append(cs, cp)
		}
		if e.p.podman != nil {
			commit, cleanup, err := e.p.newPodmanCommit(ctx)
			defer cleanup()
			if err != nil {
				extra = append(extra, newResult(OpSnapshot, SystemPodman, nil, err))
			} else {
				cs = append(cs, commit)
			}
		} else {
			extra = append(extra, skipped(OpSnapshot, SystemPodman, e.p.why[SystemPodman]))
		}
	}
	e.opts.progressf("snapshot of %d MB written x %d, interleaved with podman commit and cp", mb, e.opts.Warmup+e.opts.N)
	rows := append(e.compete(ctx, e.opts.Warmup, e.opts.N, ops, fb, cs...), extra...)
	for i := range rows {
		switch rows[i].System {
		case SystemForkbox:
			if rows[i].Error == "" {
				rows[i].Note = fmt.Sprintf("size_bytes %.0f MB", float64(f.snapBytes)/1e6)
			}
		case SystemCopy:
			if rows[i].Error == "" {
				rows[i].Note = fmt.Sprintf("reference only: cp --reflink=never + fsync on %s (%s)", f.scratchDir(), fsType(f.scratchDir()))
			}
		}
	}
	return dataRows(rows, mb)
}

// newCopyRef prepares the plain copy reference: a SnapshotMB file of
// random data, synced, in a temporary directory under dir. Its step is
// `cp --reflink=never` (no copy-on-write clone) and an fsync of the copy,
// timed together, the copy removed afterwards. cleanup removes the
// directory (call it also on error).
func newCopyRef(opts Options, dir string) (c contender, cleanup func(), err error) {
	cleanup = func() {}
	bin, err := exec.LookPath("cp")
	if err != nil {
		return c, cleanup, err
	}
	tmp, err := os.MkdirTemp(dir, "bench-copy-*")
	if err != nil {
		return c, cleanup, fmt.Errorf("copy reference: %w", err)
	}
	cleanup = func() { os.RemoveAll(tmp) }
	cp := tool{bin: bin, dir: tmp}
	src, dst := filepath.Join(tmp, "src"), filepath.Join(tmp, "dst")
	opts.progressf("plain cp: write %d MB in %s", opts.SnapshotMB, tmp)
	if err := writeRandom(src, int64(opts.SnapshotMB)*1_000_000); err != nil {
		return c, cleanup, err
	}
	return contender{system: SystemCopy, step: one(func(ctx context.Context) (time.Duration, error) {
		defer os.Remove(dst)
		start := time.Now()
		if _, err := cp.run(ctx, "--reflink=never", src, dst); err != nil {
			return 0, err
		}
		if err := syncFile(dst); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})}, cleanup, nil
}

// writeRandom writes size random bytes to a new file at path and syncs it.
func writeRandom(path string, size int64) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("copy reference: %w", err)
	}
	_, err = io.CopyN(fh, rand.Reader, size)
	err = errors.Join(err, fh.Sync(), fh.Close())
	if err != nil {
		return fmt.Errorf("copy reference: write %s: %w", path, err)
	}
	return nil
}

// syncFile flushes the file at path to disk.
func syncFile(path string) error {
	fh, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := errors.Join(fh.Sync(), fh.Close()); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// fsType names the filesystem dir is on (its magic number when unknown).
func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "filesystem unknown"
	}
	switch uint32(st.Type) {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("filesystem 0x%x", st.Type)
}

// newPodmanCommit prepares `podman commit` of a container that wrote
// SnapshotMB of random data into its writable layer. podman cannot commit
// a --rootfs container, so the busybox root filesystem is imported as an
// image first (`podman import`), untimed. Its step commits and removes
// the image (untimed). cleanup removes the container and the imported
// image (call it also on error).
func (p *peers) newPodmanCommit(ctx context.Context) (c contender, cleanup func(), err error) {
	mb, podman := p.opts.SnapshotMB, p.podman
	base := "localhost/" + p.prefix + "-base"
	name := p.prefix + "-commit"
	cleanup = func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = podman.run(cctx, "rm", "--force", "--ignore", "--time", "0", name)
		_, _ = podman.run(cctx, "rmi", "--force", base)
	}
	rootfs := filepath.Join(p.dir, "rootfs-commit")
	if err := buildRootFS(rootfs); err != nil {
		return c, cleanup, err
	}
	tarball := filepath.Join(p.dir, "rootfs-commit.tar")
	if err := tarRootFS(rootfs, tarball); err != nil {
		return c, cleanup, err
	}
	if _, err := podman.run(ctx, "import", tarball, base); err != nil {
		return c, cleanup, err
	}
	if err := podman.start(ctx, podmanRunArgs("--detach", "--name", name, base, "/bin/sleep", "3600")...); err != nil {
		return c, cleanup, err
	}
	p.opts.progressf("podman: write %d MB in a container", mb)
	if _, err := podman.run(ctx, "exec", "--workdir", "/", name, "/bin/sh", "-c", writeCmd(mb)); err != nil {
		return c, cleanup, err
	}
	return contender{system: SystemPodman, step: one(func(ctx context.Context) (time.Duration, error) {
		image := "localhost/" + p.name("commit")
		d, err := podman.run(ctx, "commit", name, image)
		if err == nil {
			_, err = podman.run(ctx, "rmi", "--force", image)
		}
		return d, err
	})}, cleanup, nil
}

// tarRootFS writes the tree at root as a tar file at dst, for `podman import`.
func tarRootFS(root, dst string) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tartree.Write(f, root); err != nil {
		return fmt.Errorf("tar %s: %w", root, err)
	}
	return f.Close()
}
