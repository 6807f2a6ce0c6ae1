// Package image imports an OCI image into a template root filesystem
// directory, safely.
//
// The image is treated as attacker-controlled. Layers are applied in order by
// this package's own extractor (not mutate.Extract) so that whiteout handling
// and every filesystem write can be audited: all writes are made relative to a
// directory file descriptor of the root filesystem, parent directories are
// resolved with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS) and final
// components are created with O_EXCL/O_NOFOLLOW or *at calls that never follow
// a final symlink. Symlinks inside the image are therefore interpreted the way
// the sandbox will see them (absolute targets and ".." stay inside the root
// filesystem) and nothing is ever created, changed or removed outside it.
//
// What the extractor deliberately does not reproduce:
//   - device nodes (character and block) and FIFOs are skipped; an existing
//     entry at their path from a lower layer is still removed;
//   - setuid and setgid bits are stripped from every mode (sandboxes run with
//     no_new_privs anyway); the sticky bit and the permission bits are kept;
//   - extended attributes (including security.capability) are not applied;
//   - ownership and mode of a hard link are those of its target inode;
//   - entries naming the root directory itself ("./") are ignored: the root
//     stays mode 0755, owned by the mapped root.
//
// What it refuses (errdefs.ErrInvalidArgument, and the rootfs is removed):
// entry names or hard link targets with a ".." component, hard links to
// anything but a regular file inside the rootfs, a path whose parent exists
// but is not (or does not lead to) a directory, ids outside the shift,
// directories nested deeper than maxDepth, and content that does not match
// the manifest, config or layer diff ids.
package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// Extraction limits against decompression bombs. They are variables only so
// that tests can lower them; nothing in the program changes them.
var (
	// maxImageBytes caps, in bytes, both the uncompressed tar bytes read over
	// all layers of one image and the regular file bytes written to the
	// rootfs (counted separately: sparse files write more than they read).
	maxImageBytes int64 = 64 << 30
	// maxEntries caps the number of tar entries over all layers of one image.
	maxEntries = 4 << 20
)

// maxDepth is the deepest directory nesting below the rootfs accepted, in
// levels.
const maxDepth = 1024

// maxNameLen is the longest entry name or link target accepted, in bytes
// (Linux PATH_MAX minus the terminating NUL).
const maxNameLen = 4095

// IDShift maps image ownership to host ownership: a file owned by uid u and
// gid g in the image is owned on the host by UIDBase+u and GIDBase+g. Ids
// must be below Size.
type IDShift struct {
	// UIDBase is the host uid of image uid 0.
	UIDBase uint32
	// GIDBase is the host gid of image gid 0.
	GIDBase uint32
	// Size is the number of mapped ids, starting at 0 in the image; must be > 0.
	Size uint32
}

// Image describes an imported image.
type Image struct {
	// Digest is the "sha256:<hex>" digest of the image manifest whose layers
	// were applied (for a multi-platform index: the linux/GOARCH manifest;
	// for a docker save tarball, which stores no manifest, the digest of the
	// schema 2 manifest go-containerregistry derives from it). The manifest
	// bytes, config and layer contents were verified against it.
	Digest string
	// Env is the config's environment, "KEY=value" strings.
	Env []string
	// WorkingDir is the config's working directory ("" if unset).
	WorkingDir string
	// User is the config's user ("uid", "uid:gid", a name, or "").
	User string
	// Entrypoint is the config's entrypoint (nil if unset).
	Entrypoint []string
	// Cmd is the config's default command (nil if unset).
	Cmd []string
	// Layers is the number of layers applied.
	Layers int
	// SizeBytes is the number of regular file content bytes written to the
	// rootfs over all layers (files overwritten by later layers count too).
	SizeBytes int64
}

// Import unpacks the image at src into rootfs.
//
// src is an OCI image layout directory (oci-layout + index.json), or a tar
// file: a `docker save` tarball (manifest.json) or an OCI image layout packed
// as a tar (which is unpacked to a temporary directory beside rootfs first).
// A missing src is an errdefs.ErrNotFound error.
//
// ref selects one image when src holds several: a tag such as "python:3.12"
// or "myimg:latest", matched against docker save RepoTags or the OCI
// "org.opencontainers.image.ref.name" (or "io.containerd.image.name")
// annotation, comparing normalized names ("python" is
// "index.docker.io/library/python:latest"); an annotation holding only a tag
// ("3.12") matches a ref with that tag. "" selects the only image and is an
// error when there are several. An unknown or ambiguous ref is an
// errdefs.ErrInvalidArgument error.
//
// rootfs must not exist yet (errdefs.ErrConflict otherwise) and its parent
// must exist; it is created with mode 0755, owned by the mapped root
// (shift.UIDBase, shift.GIDBase). Every entry is chowned per shift; an id >=
// shift.Size is an errdefs.ErrInvalidArgument error, like any malformed or
// unsafe entry, a digest mismatch or a non-linux image. Exceeding the size or
// entry limits is an errdefs.ErrResourceExhausted error, as is ENOSPC/EDQUOT.
// On any error the partially written rootfs is removed completely.
//
// Error messages name paths as the image has them ("/etc/hosts",
// "blobs/sha256/...", "the image archive"), never where src and rootfs
// are on the host (relativeError); the errdefs class is unchanged.
//
// ctx cancels the import between tar entries. Import must run as root (it
// chowns files and needs openat2, Linux >= 5.6).
func Import(ctx context.Context, src, ref, rootfs string, shift IDShift) (*Image, error) {
	return ImportWith(ctx, src, ref, rootfs, shift, Limits{})
}

// Limits bound one import beyond the package's own limits.
type Limits struct {
	// MaxBytes caps the regular file bytes the image writes to the rootfs
	// over all its layers (0: only the package's own cap, 64 GiB). Past
	// it the import fails with an error wrapping ErrTooLarge.
	MaxBytes int64
}

// ErrTooLarge is wrapped by the error of an import that wrote or read
// more than its limit (Limits.MaxBytes, or the package's own caps). It
// wraps errdefs.ErrResourceExhausted.
var ErrTooLarge = fmt.Errorf("image larger than its size limit: %w", errdefs.ErrResourceExhausted)

// ImportWith is Import within lim.
func ImportWith(ctx context.Context, src, ref, rootfs string, shift IDShift, lim Limits) (_ *Image, retErr error) {
	defer func() { retErr = relativeError(retErr, src, rootfs, filepath.Dir(filepath.Clean(rootfs))) }()
	if err := checkTarget(rootfs, shift); err != nil {
		return nil, err
	}
	rootfs = filepath.Clean(rootfs)
	if _, err := os.Stat(src); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("import image: source %q: %w", src, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("import image: source %q: %w", src, err)
	}
	img, closeSrc, err := openSource(src, ref, filepath.Dir(rootfs))
	defer closeSrc()
	if err != nil {
		return nil, fmt.Errorf("import image: %w", err)
	}
	return unpack(ctx, img, rootfs, shift, lim)
}

// Apply unpacks img, one image already selected (a registry pull's, whose
// layers the caller serves from where it keeps them), into rootfs, as
// Import does: the raw manifest must hash to want (when want is not zero;
// the manifest's digest as the registry's index or the caller's reference
// names it), the config to the manifest's config digest, each layer's
// uncompressed stream to its diff id; the config must be linux's. Errors,
// the rootfs's creation and removal and the id shift are Import's;
// errors name paths in the image only.
func Apply(ctx context.Context, img v1.Image, want v1.Hash, rootfs string, shift IDShift, lim Limits) (_ *Image, retErr error) {
	defer func() { retErr = relativeError(retErr, rootfs, rootfs, filepath.Dir(filepath.Clean(rootfs))) }()
	if err := checkTarget(rootfs, shift); err != nil {
		return nil, err
	}
	src, err := verify(img, want)
	if err != nil {
		return nil, fmt.Errorf("import image: %w", err)
	}
	return unpack(ctx, src, filepath.Clean(rootfs), shift, lim)
}

// checkTarget checks shift and that rootfs is a path where nothing is
// yet (see Import).
func checkTarget(rootfs string, shift IDShift) error {
	if shift.Size == 0 || uint64(shift.UIDBase)+uint64(shift.Size) > 1<<32 ||
		uint64(shift.GIDBase)+uint64(shift.Size) > 1<<32 {
		return fmt.Errorf("import image: id shift %+v out of range: %w", shift, errdefs.ErrInvalidArgument)
	}
	if rootfs == "" {
		return fmt.Errorf("import image: empty rootfs path: %w", errdefs.ErrInvalidArgument)
	}
	if _, err := os.Lstat(rootfs); err == nil {
		return fmt.Errorf("import image: rootfs %q already exists: %w", rootfs, errdefs.ErrConflict)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("import image: rootfs %q: %w", rootfs, err)
	}
	return nil
}

// unpack creates rootfs and applies img's layers to it; on error the
// partial rootfs is removed.
func unpack(ctx context.Context, img *source, rootfs string, shift IDShift, lim Limits) (*Image, error) {
	rootfd, err := createRoot(rootfs, shift)
	if err != nil {
		return nil, fmt.Errorf("import image: %w", err)
	}
	out, err := applyImage(ctx, img, rootfd, shift, lim)
	unix.Close(rootfd)
	if err != nil {
		if rerr := removeRootfs(rootfs); rerr != nil {
			err = fmt.Errorf("%w (and removing the partial rootfs failed: %v)", err, rerr)
		}
		return nil, fmt.Errorf("import image: %w", err)
	}
	return out, nil
}

// createRoot creates the directory rootfs (its parent must exist) with mode
// 0755 owned by (shift.UIDBase, shift.GIDBase) and returns an O_PATH
// directory fd for it, which the caller closes. An existing rootfs is an
// errdefs.ErrConflict error; on error nothing is left behind.
func createRoot(rootfs string, shift IDShift) (int, error) {
	if err := os.Mkdir(rootfs, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return -1, fmt.Errorf("rootfs %q already exists: %w", rootfs, errdefs.ErrConflict)
		}
		return -1, fmt.Errorf("create rootfs: %w", err)
	}
	fd, err := unix.Open(rootfs, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.Fchown(fd, int(shift.UIDBase), int(shift.GIDBase))
		if err == nil {
			err = unix.Fchmod(fd, 0o755)
		}
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		os.Remove(rootfs)
		return -1, fmt.Errorf("create rootfs %q: %w", rootfs, err)
	}
	return fd, nil
}

// removeRootfs removes the directory rootfs and everything below it without
// following any symlink inside it (fd-relative, see removeAll). A missing
// rootfs is not an error.
func removeRootfs(rootfs string) error {
	pfd, err := unix.Open(filepath.Dir(rootfs), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return removeAll(pfd, filepath.Base(rootfs))
}

// classify wraps err, an error from a filesystem call made on behalf of the
// image, with the errdefs class it belongs to: errno values an image can
// provoke (name too long, symlink loops, a path component that is not a
// directory, EXDEV from linking across what should be one tree) are
// ErrInvalidArgument, full disks and quotas are ErrResourceExhausted. Other
// errors are returned unchanged (and count as internal).
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ELOOP),
		errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return fmt.Errorf("%w: %w", errdefs.ErrResourceExhausted, err)
	}
	return err
}
