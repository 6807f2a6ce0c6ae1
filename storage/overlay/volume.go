package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage/loop"
)

// volumeIO is how the volume image and the layer disks are attached:
// buffered, as overlay volumes always were. (btrfs's volume uses direct
// I/O; for XFS and ext4 images made with 512-byte sectors a host disk of
// 4 KiB logical sectors would refuse the mount under direct I/O, so
// overlay keeps the page cache until that is handled.)
var volumeIO = loop.Options{}

// xfsMagic is statfs's f_type of XFS.
const xfsMagic = 0x58465342

// Supported returns nil when the overlay driver can run here, or an error
// wrapping errdefs.ErrUnavailable saying what is missing: root, overlayfs
// and XFS in the kernel, loop devices, mkfs.xfs (package xfsprogs) and
// mkfs.ext4 (package e2fsprogs, for disk limits without XFS project
// quotas).
func Supported() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("overlay storage needs root: %w", errdefs.ErrUnavailable)
	}
	fss, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return fmt.Errorf("read /proc/filesystems: %v: %w", err, errdefs.ErrUnavailable)
	}
	for _, fs := range []string{"overlay", "xfs"} {
		if !bytes.Contains(fss, []byte("\t"+fs+"\n")) {
			return fmt.Errorf("the kernel has no %s filesystem: %w", fs, errdefs.ErrUnavailable)
		}
	}
	if err := loop.Supported(); err != nil {
		return err
	}
	for _, tool := range []string{"mkfs.xfs", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found (install xfsprogs and e2fsprogs): %w", tool, errdefs.ErrUnavailable)
		}
	}
	return nil
}

// volume describes the XFS filesystem holding Dir.
type volume struct {
	// Dev is the filesystem's block device and Dir a directory on it
	// (for quotactl).
	Dev, Dir string
	// ProjectQuota is true when XFS project quotas are enforced on it.
	ProjectQuota bool
}

// ensureVolume makes sure dir is on XFS and returns what it found. When
// dir is not on XFS it mounts the image dir+".img" at dir (through a loop
// device, with prjquota when the kernel supports XFS quotas), making and
// formatting an image of size bytes (reserved) first if there is none. A dir
// already on XFS (a previous start's mount, or a volume the host set up)
// is used as it is.
func ensureVolume(dir string, size int64) (volume, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return volume{}, fmt.Errorf("create %s: %w", dir, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return volume{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	if sfs.Type != xfsMagic {
		if err := mountImage(dir, size); err != nil {
			return volume{}, err
		}
	}
	m, err := mountOf(dir)
	if err != nil {
		return volume{}, err
	}
	if m.FSType != "xfs" {
		return volume{}, fmt.Errorf("%s is on %s, not xfs: %w", dir, m.FSType, errdefs.ErrUnavailable)
	}
	v := volume{Dev: m.Source, Dir: dir}
	for _, o := range strings.Split(m.SuperOpts, ",") {
		// Enforced project quotas show as prjquota (pquota once
		// remounted by some versions); pqnoenforce only accounts.
		if o == "prjquota" || o == "pquota" {
			v.ProjectQuota = true
		}
	}
	return v, nil
}

// mountImage mounts dir+".img" (made if missing) at dir: nodev, nosuid,
// with prjquota, or without when the kernel lacks XFS quota support.
func mountImage(dir string, size int64) error {
	img := dir + ".img"
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		if err := makeImage(img, size); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("stat %s: %w", img, err)
	}
	// No discard: the image's blocks are reserved on the host
	// (loop.Preallocate) and must stay so.
	const flags = unix.MS_NODEV | unix.MS_NOSUID
	_, err := loop.Mount(img, dir, "xfs", flags, "prjquota", volumeIO)
	if errors.Is(err, unix.EINVAL) {
		// "quota support not available in this kernel" (no
		// CONFIG_XFS_QUOTA): mount without; disk limits then use a loop
		// image per layer.
		_, err = loop.Mount(img, dir, "xfs", flags, "", volumeIO)
	}
	if err != nil {
		return fmt.Errorf("mount the storage image: %w", err)
	}
	return nil
}

// makeImage creates img as a file of size bytes with its blocks reserved
// on the host and formats it with XFS (reflink on, so snapshots share
// extents with the layers they copy), through loop.CreateImage: a crash
// leaves either no image or a formatted one.
func makeImage(img string, size int64) error {
	return loop.CreateImage(img, size, func(tmp string) error {
		// -K: no discard (it would punch the reserved blocks out).
		out, err := exec.Command("mkfs.xfs", "-q", "-K", "-m", "reflink=1", "-L", "forkbox", tmp).CombinedOutput()
		if err != nil {
			return fmt.Errorf("mkfs.xfs %s: %v: %s: %w", tmp, err, strings.TrimSpace(string(out)), errdefs.ErrUnavailable)
		}
		return nil
	})
}

// makeDisk creates the per-layer image img of size bytes (reserved),
// formats it with ext4 (no reserved blocks) and mounts it at dir (nodev,
// nosuid). It is the disk limit when XFS project quotas are unavailable:
// the layer's upper directory cannot outgrow its own filesystem.
func makeDisk(img, dir string, size int64) error {
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", img, err)
	}
	// Reserved, not sparse: many layer disks inside one volume must not
	// promise more space than the volume has (a layer disk that cannot
	// get a block aborts its journal and loses data); a volume too full
	// for the limit fails this create with ErrInsufficientStorage instead.
	err = loop.Preallocate(f, size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(img)
		return err
	}
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", "-L", "forkbox-layer",
		"-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 for a %d-byte disk limit: %v: %s: %w", size, err,
			strings.TrimSpace(string(out)), errdefs.ErrInvalidArgument)
	}
	if _, err := loop.Mount(img, dir, "ext4", unix.MS_NODEV|unix.MS_NOSUID, "", volumeIO); err != nil {
		return fmt.Errorf("mount the layer disk: %w", err)
	}
	return nil
}
