package btrfs

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Facts from the kernel's UAPI headers linux/btrfs.h and
// linux/btrfs_tree.h, restated here because golang.org/x/sys does not
// carry them.
const (
	// ioctlMagic is the ioctl type byte of every btrfs ioctl.
	ioctlMagic = 0x94

	// Flags of struct btrfs_ioctl_vol_args_v2 and of SUBVOL_{GET,SET}FLAGS.
	subvolReadOnly = 1 << 1

	// Commands of BTRFS_IOC_QUOTA_CTL.
	quotaCtlEnable = 1

	// Flags of struct btrfs_qgroup_limit.
	qgroupLimitMaxExcl = 1 << 1

	// Tree ids and item keys used with TREE_SEARCH.
	rootTreeID       = 1
	quotaTreeID      = 8
	rootItemKey      = 132
	qgroupStatusKey  = 240
	qgroupInfoKey    = 242
	qgroupStatusOn   = 1 << 0
	qgroupStatusScan = 1 << 1
	qgroupStatusBad  = 1 << 2 // BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT

	// firstFreeObjectID is the inode number of every subvolume's root
	// directory (BTRFS_FIRST_FREE_OBJECTID).
	firstFreeObjectID = 256
)

// volArgs is struct btrfs_ioctl_vol_args: a file descriptor and a name in
// a 4096-byte record.
type volArgs struct {
	fd   int64
	name [4088]byte
}

// volArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes). The unions are
// flattened: the qgroup-inherit pointer lives in unused, which stays zero.
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// inoLookupArgs is struct btrfs_ioctl_ino_lookup_args (4096 bytes).
type inoLookupArgs struct {
	treeID   uint64
	objectID uint64
	name     [4080]byte
}

// quotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
type quotaCtlArgs struct {
	cmd    uint64
	status uint64
}

// qgroupCreateArgs is struct btrfs_ioctl_qgroup_create_args.
type qgroupCreateArgs struct {
	create   uint64
	qgroupID uint64
}

// qgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args with its nested
// struct btrfs_qgroup_limit.
type qgroupLimitArgs struct {
	qgroupID uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// rescanArgs is struct btrfs_ioctl_quota_rescan_args.
type rescanArgs struct {
	flags    uint64
	progress uint64
	reserved [6]uint64
}

// searchKey is struct btrfs_ioctl_search_key (104 bytes).
type searchKey struct {
	treeID                   uint64
	minObjectID, maxObjectID uint64
	minOffset, maxOffset     uint64
	minTransID, maxTransID   uint64
	minType, maxType         uint32
	nrItems                  uint32
	unused                   uint32
	unused1                  [4]uint64
}

// searchArgs is struct btrfs_ioctl_search_args: a key and a 3992-byte
// buffer of (header, item) records, 4096 bytes in all.
type searchArgs struct {
	key searchKey
	buf [4096 - 104]byte
}

// searchHeaderSize is sizeof(struct btrfs_ioctl_search_header): transid,
// objectid, offset (u64 each), type and len (u32 each).
const searchHeaderSize = 32

// ioc encodes an ioctl request number the way the generic Linux _IOC macro
// does (x86, arm64, riscv): direction in bits 30-31, argument size in bits
// 16-29, type in bits 8-15, number in bits 0-7.
func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | ioctlMagic<<8 | nr
}

// Directions of ioc: userspace writes (_IOW), reads (_IOR), or both.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

// The ioctl requests, with numbers and argument types from linux/btrfs.h.
var (
	iocSnapCreateV2   = ioc(iocWrite, 23, unsafe.Sizeof(volArgsV2{}))
	iocSubvolCreate   = ioc(iocWrite, 14, unsafe.Sizeof(volArgs{}))
	iocSnapDestroy    = ioc(iocWrite, 15, unsafe.Sizeof(volArgs{}))
	iocTreeSearch     = ioc(iocWrite|iocRead, 17, unsafe.Sizeof(searchArgs{}))
	iocInoLookup      = ioc(iocWrite|iocRead, 18, unsafe.Sizeof(inoLookupArgs{}))
	iocSync           = ioc(iocNone, 8, 0)
	iocStartSync      = ioc(iocRead, 24, 8)
	iocWaitSync       = ioc(iocWrite, 22, 8)
	iocSubvolGetFlags = ioc(iocRead, 25, 8)
	iocSubvolSetFlags = ioc(iocWrite, 26, 8)
	iocQuotaCtl       = ioc(iocWrite|iocRead, 40, unsafe.Sizeof(quotaCtlArgs{}))
	iocQgroupCreate   = ioc(iocWrite, 42, unsafe.Sizeof(qgroupCreateArgs{}))
	iocQgroupLimit    = ioc(iocRead, 43, unsafe.Sizeof(qgroupLimitArgs{}))
	iocQuotaRescan    = ioc(iocWrite, 44, unsafe.Sizeof(rescanArgs{}))
	iocRescanWait     = ioc(iocNone, 46, 0)
)

// ioctl issues request req on fd with the argument at arg, retrying on
// EINTR. It returns the raw errno on failure.
func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		return nil
	}
}

// setName copies name into a fixed, NUL-terminated name field. It fails
// with ENAMETOOLONG when the name (plus its NUL) does not fit.
func setName(dst []byte, name string) error {
	if len(name) >= len(dst) {
		return unix.ENAMETOOLONG
	}
	copy(dst, name)
	dst[len(name)] = 0
	return nil
}

// createSubvolume creates an empty subvolume called name in the directory
// open as dirFd. Errors are the raw errno (EEXIST when name exists).
func createSubvolume(dirFd int, name string) error {
	var a volArgs
	if err := setName(a.name[:], name); err != nil {
		return err
	}
	return ioctl(dirFd, iocSubvolCreate, unsafe.Pointer(&a))
}

// snapshotSubvolume creates name in the directory open as dirFd as a
// snapshot of the subvolume whose root directory is open as srcFd;
// readOnly makes the snapshot read-only. The snapshot is made in a
// transaction commit; dirty data of the source is flushed into it first.
func snapshotSubvolume(srcFd, dirFd int, name string, readOnly bool) error {
	var a volArgsV2
	a.fd = int64(srcFd)
	if readOnly {
		a.flags = subvolReadOnly
	}
	if err := setName(a.name[:], name); err != nil {
		return err
	}
	return ioctl(dirFd, iocSnapCreateV2, unsafe.Pointer(&a))
}

// destroySubvolume deletes subvolume name in the directory open as dirFd,
// with all its contents (root may do that with files inside; nested
// subvolumes make it fail with ENOTEMPTY). The space is reclaimed in the
// background by the filesystem's cleaner.
func destroySubvolume(dirFd int, name string) error {
	var a volArgs
	if err := setName(a.name[:], name); err != nil {
		return err
	}
	return ioctl(dirFd, iocSnapDestroy, unsafe.Pointer(&a))
}

// subvolumeID returns the id (tree id) of the subvolume holding the file
// open as fd.
func subvolumeID(fd int) (uint64, error) {
	var a inoLookupArgs
	a.objectID = firstFreeObjectID
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, err
	}
	return a.treeID, nil
}

// subvolumeFlags returns the flags (subvolReadOnly) of the subvolume whose
// root directory is open as fd.
func subvolumeFlags(fd int) (uint64, error) {
	var flags uint64
	err := ioctl(fd, iocSubvolGetFlags, unsafe.Pointer(&flags))
	return flags, err
}

// setReadOnly makes the subvolume whose root directory is open as fd
// read-only (ro true) or writable again.
func setReadOnly(fd int, ro bool) error {
	flags, err := subvolumeFlags(fd)
	if err != nil {
		return err
	}
	if ro {
		flags |= subvolReadOnly
	} else {
		flags &^= subvolReadOnly
	}
	return ioctl(fd, iocSubvolSetFlags, unsafe.Pointer(&flags))
}

// syncFS flushes all dirty data of the filesystem holding fd and commits
// its transaction, so qgroup numbers are current afterwards.
func syncFS(fd int) error {
	return ioctl(fd, iocSync, nil)
}

// commitFS commits the current transaction of the filesystem holding fd
// and waits for it, without first writing back dirty file data (unlike
// syncFS): data still in the page cache is not counted in the qgroups
// until writeback allocates it.
func commitFS(fd int) error {
	var transid uint64
	if err := ioctl(fd, iocStartSync, unsafe.Pointer(&transid)); err != nil {
		return err
	}
	return ioctl(fd, iocWaitSync, unsafe.Pointer(&transid))
}

// enableQuota turns qgroups on for the filesystem holding fd (a no-op when
// they are on already).
func enableQuota(fd int) error {
	a := quotaCtlArgs{cmd: quotaCtlEnable}
	return ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a))
}

// rescanQuota starts a qgroup rescan (EINPROGRESS when one runs) and waits
// for it to finish.
func rescanQuota(fd int) error {
	var a rescanArgs
	if err := ioctl(fd, iocQuotaRescan, unsafe.Pointer(&a)); err != nil && err != unix.EINPROGRESS {
		return err
	}
	return ioctl(fd, iocRescanWait, nil)
}

// limitExclusive caps the exclusive bytes of level-0 qgroup 0/subvolID at
// maxExcl bytes; writes past it fail with EDQUOT.
func limitExclusive(fd int, subvolID uint64, maxExcl int64) error {
	a := qgroupLimitArgs{qgroupID: subvolID, flags: qgroupLimitMaxExcl, maxExcl: uint64(maxExcl)}
	return ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a))
}

// removeQgroup deletes level-0 qgroup 0/subvolID. The kernel refuses
// (EBUSY) while the subvolume still exists, including while the cleaner
// is still dropping a destroyed one.
func removeQgroup(fd int, subvolID uint64) error {
	a := qgroupCreateArgs{create: 0, qgroupID: subvolID}
	return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a))
}
