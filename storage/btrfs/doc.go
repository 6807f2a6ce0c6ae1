// Package btrfs is the btrfs storage driver (storage.Driver).
//
// Every sandbox's writable layer is a btrfs subvolume made as a writable
// snapshot of a read-only template subvolume or of a read-only snapshot
// subvolume, and a snapshot of a layer is a read-only snapshot subvolume:
// both cost O(1) in the size of the data, and nothing depends on a parent
// subvolume once made (subvolumes share extents, not each other).
//
// Every subvolume and quota operation is a direct ioctl (ioctl.go,
// quota.go, with numbers and layouts restated from linux/btrfs.h); the
// only external command is mkfs.btrfs, run once to format the image that
// New mounts through a loop device when the driver's directory is not on
// btrfs already.
//
// Accounting rules:
//
//   - Disk limit: Prepare with quotaBytes > 0 limits the exclusive bytes of
//     the layer's level-0 qgroup (max_excl). Data shared with the source
//     does not count, what the sandbox writes does; a write past the limit
//     fails with EDQUOT ("Disk quota exceeded"), and after files are
//     removed writing works again. A snapshot shares everything the layer
//     held, so after one the limit applies to what is written since.
//     Limits hold only while the kernel accounts qgroups; accounting.go
//     keeps it doing so (it rescans when the kernel gives up).
//   - SnapshotInfo.SizeBytes: how much the layer's referenced bytes grew
//     since it was made from its template or snapshot, read just before the
//     snapshot (after a full sync, so the numbers are current). A
//     snapshot's own exclusive bytes are about zero when it is made (it
//     shares everything with the layer), and the layer's exclusive bytes
//     shrink and grow again as earlier snapshots come and go, so neither is
//     used alone: the size is the larger of the growth and the layer's
//     exclusive bytes (which see small changes that rewrite shared tree
//     blocks without growing the tree).
//   - Usage: the same growth, after a transaction commit that does not
//     force dirty data out (that data counts once written back).
//
// A sandbox can create subvolumes of its own inside its layer (btrfs lets
// any user do that in a directory it may write); their data escapes the
// layer's limit and snapshots (they appear as empty directories there).
// Remove destroys them with the layer. The runtime's seccomp profile
// should refuse the creating ioctls (BTRFS_IOC_SUBVOL_CREATE{,_V2},
// BTRFS_IOC_SNAP_CREATE{,_V2}).
package btrfs
