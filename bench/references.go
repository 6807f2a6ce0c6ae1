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
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/tartree"
)

// The references beside forkbox's snapshot row: a plain copy of as much
// data, and podman commit.

// copyMaxN caps the measured iterations of the plain copy reference: each
// one writes SnapshotMB to the disk.
const copyMaxN = 10

// measureCopy measures a plain copy of a SnapshotMB file of random data in
// a temporary directory under dir: `cp --reflink=never` (no copy-on-write
// clone) and an fsync of the copy, timed together; the source was synced
// before. At most copyMaxN iterations are measured.
func measureCopy(ctx context.Context, opts Options, dir string) (res Result) {
	mb := opts.SnapshotMB
	n := min(opts.N, copyMaxN)
	defer func() { res.DataMB = mb }()
	tmp, err := os.MkdirTemp(dir, "bench-copy-*")
	if err != nil {
		return newResult(OpSnapshot, SystemCopy, nil, fmt.Errorf("copy reference: %w", err))
	}
	defer os.RemoveAll(tmp)
	bin, err := exec.LookPath("cp")
	if err != nil {
		return newResult(OpSnapshot, SystemCopy, nil, err)
	}
	cp := tool{bin: bin, dir: tmp}
	src, dst := filepath.Join(tmp, "src"), filepath.Join(tmp, "dst")
	opts.progressf("plain cp: write %d MB in %s, then cp x %d", mb, tmp, opts.Warmup+n)
	if err := writeRandom(src, int64(mb)*1_000_000); err != nil {
		return newResult(OpSnapshot, SystemCopy, nil, err)
	}
	samples, err := series(ctx, opts.Warmup, n, func(ctx context.Context) (time.Duration, error) {
		defer os.Remove(dst)
		start := time.Now()
		if _, err := cp.run(ctx, "--reflink=never", src, dst); err != nil {
			return 0, err
		}
		if err := syncFile(dst); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	})
	res = newResult(OpSnapshot, SystemCopy, samples, err)
	res.Note = fmt.Sprintf("reference: cp --reflink=never + fsync on %s (%s)", dir, fsType(dir))
	if n < opts.N {
		res.Note += fmt.Sprintf(", n capped at %d", copyMaxN)
	}
	return res
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

// measurePodmanCommit measures `podman commit` of a container that wrote
// SnapshotMB of random data into its writable layer. podman cannot commit a
// --rootfs container, so the busybox root filesystem is imported as an
// image first (`podman import`), untimed. Each committed image is removed,
// untimed, and so is the imported one at the end.
func measurePodmanCommit(ctx context.Context, opts Options, podman tool, dir, prefix string) (res Result) {
	mb := opts.SnapshotMB
	defer func() { res.DataMB = mb }()
	fail := func(err error) Result { return newResult(OpSnapshot, SystemPodman, nil, err) }
	rootfs := filepath.Join(dir, "rootfs-commit")
	if err := buildRootFS(rootfs); err != nil {
		return fail(err)
	}
	tarball := filepath.Join(dir, "rootfs-commit.tar")
	if err := tarRootFS(rootfs, tarball); err != nil {
		return fail(err)
	}
	base := "localhost/" + prefix + "-base"
	name := prefix + "-commit"
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = podman.run(cctx, "rm", "--force", "--ignore", "--time", "0", name)
		_, _ = podman.run(cctx, "rmi", "--force", base)
	}()
	if _, err := podman.run(ctx, "import", tarball, base); err != nil {
		return fail(err)
	}
	args := slices.Concat([]string{"run"}, podmanFlags, []string{"--detach", "--name", name, base, "/bin/sleep", "3600"})
	if err := podman.start(ctx, args...); err != nil {
		return fail(err)
	}
	opts.progressf("podman: write %d MB in a container, then commit x %d", mb, opts.Warmup+opts.N)
	if _, err := podman.run(ctx, "exec", "--workdir", "/", name, "/bin/sh", "-c", writeCmd(mb)); err != nil {
		return fail(err)
	}
	i := 0
	samples, err := series(ctx, opts.Warmup, opts.N, func(ctx context.Context) (time.Duration, error) {
		i++
		image := fmt.Sprintf("localhost/%s-commit-%d", prefix, i)
		d, err := podman.run(ctx, "commit", name, image)
		if err == nil {
			_, err = podman.run(ctx, "rmi", "--force", image)
		}
		return d, err
	})
	return newResult(OpSnapshot, SystemPodman, samples, err)
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
