package btrfs

import (
	"encoding/hex"
	"unsafe"
)

// A verified digest is reused instead of walking a snapshot again when
// the kernel shows that nothing in the snapshot has changed since it was
// digested. The evidence is the subvolume's own b-tree: btrfs copies a
// tree block on write, and every block written carries the id of the
// transaction that wrote it, so a change anywhere in a subvolume (file
// data, an inode's times or mode, a directory entry) leaves a block of a
// transaction newer than any before. A tree search with a minimum
// transaction id (BTRFS_IOC_TREE_SEARCH's min_transid, as `btrfs
// subvolume find-new` uses it) skips every older block from the root
// down, so asking "anything newer than G?" costs a few block reads,
// whatever the snapshot holds.
//
// The tree lags what is written: btrfs keeps inode updates in memory
// until a transaction commits, and file data (with the inode's new size)
// until it is written back. So the check first has the kernel write back
// the snapshot's own pending data and commit, the way it does for a
// snapshot of it: it makes a read-only snapshot of the snapshot and
// destroys it again (a few milliseconds, and only this subvolume's dirty
// data is written, not the whole volume's). That snapshot copies the
// snapshot's root block, which leaves the blocks below untouched, so the
// check still finds nothing new in an unchanged tree of more than one
// block; a tree of one block (a handful of files) reads as changed and
// is walked again, which costs as little.
//
// The stamp is the subvolume's UUID and generation read before the walk
// whose digest it vouches for: every change the walk could have missed
// happened later, in a newer transaction. What invalidates it: any write
// to the subvolume (which needs its read-only flag cleared first), a
// balance that relocates its blocks (the next check walks again and
// finds the same digest), or another subvolume under the same name (a
// new UUID). Anyone able to forge it could rewrite the recorded digest
// beside it just as well.

// subvolInfoArgs is struct btrfs_ioctl_get_subvol_info_args (504 bytes);
// only the fields read are named.
type subvolInfoArgs struct {
	treeID     uint64
	name       [256]byte
	parentID   uint64
	dirID      uint64
	generation uint64
	flags      uint64
	uuid       [16]byte
	rest       [504 - 312]byte
}

// iocGetSubvolInfo is BTRFS_IOC_GET_SUBVOL_INFO (Linux 4.18).
var iocGetSubvolInfo = ioc(iocRead, 60, unsafe.Sizeof(subvolInfoArgs{}))

// rootSubvolReadOnly is BTRFS_ROOT_SUBVOL_RDONLY (linux/btrfs_tree.h),
// the read-only bit of a root item's flags as GET_SUBVOL_INFO reports
// them (not the ioctl flag subvolReadOnly).
const rootSubvolReadOnly = 1 << 0

// stamp identifies a snapshot subvolume's state for the verified-digest
// cache (see above).
type stamp struct {
	// UUID is the subvolume's UUID, in hex.
	UUID string `json:"uuid"`
	// Generation is the subvolume's generation (a transaction id) when
	// the digest's walk began.
	Generation uint64 `json:"generation"`
}

// subvolState is what readStamp learns about a subvolume.
type subvolState struct {
	stamp
	treeID   uint64
	readOnly bool
}

// readStamp returns the state of the subvolume whose root directory is
// open as fd.
func readStamp(fd int) (subvolState, error) {
	var a subvolInfoArgs
	if err := ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&a)); err != nil {
		return subvolState{}, err
	}
	return subvolState{
		stamp:    stamp{UUID: hex.EncodeToString(a.uuid[:]), Generation: a.generation},
		treeID:   a.treeID,
		readOnly: a.flags&rootSubvolReadOnly != 0,
	}, nil
}

// changedSince reports whether tree treeID (a subvolume) holds any block
// written in a transaction after gen, through the filesystem of fd.
func changedSince(fd int, treeID, gen uint64) (bool, error) {
	var a searchArgs
	a.key = searchKey{
		treeID:      treeID,
		maxObjectID: ^uint64(0), maxOffset: ^uint64(0),
		minTransID: gen + 1, maxTransID: ^uint64(0),
		maxType: 255,
		nrItems: 1,
	}
	if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
		return false, err
	}
	return a.key.nrItems > 0, nil
}

// unchanged reports whether the subvolume open as fd is read-only, is the
// one s was taken of, and has not changed since. flush must make the
// kernel write the subvolume's pending changes into its tree (see above)
// and is called after the first checks. Any failure to tell counts as
// changed.
func unchanged(fd int, s *stamp, flush func() error) bool {
	if s == nil {
		return false
	}
	st, err := readStamp(fd)
	if err != nil || !st.readOnly || st.UUID != s.UUID {
		return false
	}
	if flush() != nil {
		return false
	}
	changed, err := changedSince(fd, st.treeID, s.Generation)
	return err == nil && !changed
}

// The argument has the kernel's size (a compile-time check).
var _ [504]byte = [unsafe.Sizeof(subvolInfoArgs{})]byte{}
