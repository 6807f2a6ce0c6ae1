package overlay

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// fsxattr is struct fsxattr of <linux/fs.h>, the argument of
// FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR (28 bytes).
type fsxattr struct {
	Xflags, Extsize, Nextents, Projid, Cowextsize uint32
	Pad                                           [8]byte
}

// The ioctls and flag of <linux/fs.h> for project ids: _IOR('X', 31,
// struct fsxattr), _IOW('X', 32, struct fsxattr), FS_XFLAG_PROJINHERIT.
const (
	fsIocFsgetxattr     = 0x801c581f
	fsIocFssetxattr     = 0x401c5820
	fsXflagProjinherit  = 0x200
	fsDquotVersion      = 1      // FS_DQUOT_VERSION
	fsProjQuota         = 2      // FS_PROJ_QUOTA, fs_disk_quota.d_flags
	fsDqBsoft           = 1 << 2 // FS_DQ_BSOFT, d_fieldmask
	fsDqBhard           = 1 << 3 // FS_DQ_BHARD
	prjQuota            = 2      // PRJQUOTA, the quota type
	qXGetQuota          = 'X'<<8 + 3
	qXSetQLim           = 'X'<<8 + 4
	basicBlock          = 512 // fs_disk_quota counts 512-byte blocks
	fsDiskQuotaWantSize = 112
)

// fsDiskQuota is struct fs_disk_quota of <linux/dqblk_xfs.h> (112 bytes),
// the argument of Q_XGETQUOTA and Q_XSETQLIM. Block fields count 512-byte
// basic blocks.
type fsDiskQuota struct {
	Version      int8
	Flags        int8
	Fieldmask    uint16
	ID           uint32
	BlkHardlimit uint64
	BlkSoftlimit uint64
	InoHardlimit uint64
	InoSoftlimit uint64
	Bcount       uint64
	Icount       uint64
	Itimer       int32
	Btimer       int32
	Iwarns       uint16
	Bwarns       uint16
	ItimerHi     int8
	BtimerHi     int8
	RtbtimerHi   int8
	Padding2     int8
	RtbHardlimit uint64
	RtbSoftlimit uint64
	Rtbcount     uint64
	Rtbtimer     int32
	Rtbwarns     uint16
	Padding3     int16
	Padding4     [8]byte
}

// setProject gives the directory at path project id id and the
// project-inherit flag, so everything created under it later is charged
// to project id. (Changing a project id needs CAP_SYS_RESOURCE in the
// initial user namespace, so a sandbox cannot move its files out.)
func setProject(path string, id uint32) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var fa fsxattr
	if err := ioctlPtr(fd, fsIocFsgetxattr, unsafe.Pointer(&fa)); err != nil {
		return fmt.Errorf("get project of %s: %w", path, err)
	}
	fa.Projid = id
	fa.Xflags |= fsXflagProjinherit
	if err := ioctlPtr(fd, fsIocFssetxattr, unsafe.Pointer(&fa)); err != nil {
		return fmt.Errorf("set project %d on %s: %w", id, path, err)
	}
	return nil
}

// projectOf returns the project id of the file at path.
func projectOf(path string) (uint32, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var fa fsxattr
	if err := ioctlPtr(fd, fsIocFsgetxattr, unsafe.Pointer(&fa)); err != nil {
		return 0, fmt.Errorf("get project of %s: %w", path, err)
	}
	return fa.Projid, nil
}

// setProjectLimit sets project id's block hard limit on the XFS
// filesystem vol to bytes (rounded up to 512-byte
// blocks; 0 removes the limit). Past it, writes fail with EDQUOT (XFS
// reports ENOSPC for project quotas on some versions).
func setProjectLimit(vol volume, id uint32, bytes int64) error {
	if bytes < 0 {
		bytes = 0
	}
	dq := fsDiskQuota{Version: fsDquotVersion, Flags: fsProjQuota, Fieldmask: fsBlockLimits,
		ID: id, BlkHardlimit: uint64((bytes + basicBlock - 1) / basicBlock)}
	if err := quotactl(qXSetQLim, vol, id, &dq); err != nil {
		return fmt.Errorf("set the disk limit of project %d on %s: %w", id, vol.Dev, err)
	}
	return nil
}

// fsBlockLimits is the field mask setting both block limits (the soft
// one to 0, none).
const fsBlockLimits = fsDqBsoft | fsDqBhard

// projectUsage returns the bytes charged to project id on the XFS
// filesystem vol.
func projectUsage(vol volume, id uint32) (int64, error) {
	var dq fsDiskQuota
	if err := quotactl(qXGetQuota, vol, id, &dq); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			return 0, nil // no usage recorded yet
		}
		return 0, fmt.Errorf("read the usage of project %d on %s: %w", id, vol.Dev, err)
	}
	return int64(dq.Bcount) * basicBlock, nil
}

// quotactl calls quotactl(2) with QCMD(cmd, PRJQUOTA) for project id on
// the filesystem of vol: on its block device, or, when that path is not
// one (a mount table entry such as /dev/root), with quotactl_fd(2) on a
// descriptor of its directory (Linux 5.14 and newer). x/sys/unix has
// wrappers for neither.
func quotactl(cmd int, vol volume, id uint32, dq *fsDiskQuota) error {
	p, err := unix.BytePtrFromString(vol.Dev)
	if err != nil {
		return fmt.Errorf("device %q: %w", vol.Dev, errdefs.ErrInvalidArgument)
	}
	qcmd := uintptr(cmd<<8 | prjQuota&0xff)
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL, qcmd, uintptr(unsafe.Pointer(p)),
		uintptr(id), uintptr(unsafe.Pointer(dq)), 0, 0)
	if e == 0 {
		return nil
	}
	if e != unix.ENOENT && e != unix.ENOTBLK && e != unix.ENODEV || vol.Dir == "" {
		return e
	}
	fd, err := unix.Open(vol.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, _, e = unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), qcmd, uintptr(id), uintptr(unsafe.Pointer(dq)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// ioctlPtr calls ioctl(fd, req, arg).
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}
