package btrfs

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// searchItems calls visit with the offset and body of every item with
// key (objectid, typ, offset) for offset in [minOff, maxOff] in tree
// treeID, in key order, issuing as many TREE_SEARCH calls as it takes.
// A missing tree (quotas off) is ENOENT.
func searchItems(fd int, treeID, objectid uint64, typ uint32, minOff, maxOff uint64, visit func(offset uint64, item []byte)) error {
	for {
		var a searchArgs
		a.key = searchKey{
			treeID:      treeID,
			minObjectID: objectid, maxObjectID: objectid,
			minOffset: minOff, maxOffset: maxOff,
			maxTransID: ^uint64(0),
			minType:    typ, maxType: typ,
			nrItems: 4096,
		}
		if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
			return err
		}
		if a.key.nrItems == 0 {
			return nil
		}
		var last uint64
		pos := 0
		for i := uint32(0); i < a.key.nrItems; i++ {
			if pos+searchHeaderSize > len(a.buf) {
				return fmt.Errorf("tree search: truncated header: %w", unix.EOVERFLOW)
			}
			// struct btrfs_ioctl_search_header, in host byte order.
			h := a.buf[pos : pos+searchHeaderSize]
			off := binary.NativeEndian.Uint64(h[16:24])
			n := int(binary.NativeEndian.Uint32(h[28:32]))
			pos += searchHeaderSize
			if pos+n > len(a.buf) {
				return fmt.Errorf("tree search: item of %d bytes: %w", n, unix.EOVERFLOW)
			}
			visit(off, a.buf[pos:pos+n])
			pos += n
			last = off
		}
		if last >= maxOff {
			return nil
		}
		minOff = last + 1
	}
}

// searchQuotaItem returns the body of the quota-tree item with key
// (0, typ, offset), or nil when there is none. Quotas must be on (ENOENT
// otherwise).
func searchQuotaItem(fd int, typ uint32, offset uint64) ([]byte, error) {
	var item []byte
	err := searchItems(fd, quotaTreeID, 0, typ, offset, offset, func(_ uint64, b []byte) {
		item = append([]byte(nil), b...)
	})
	return item, err
}

// level0Qgroups returns the ids of the level-0 qgroups (one per subvolume
// id, including stale ones of subvolumes that are gone).
func level0Qgroups(fd int) ([]uint64, error) {
	var ids []uint64
	err := searchItems(fd, quotaTreeID, 0, qgroupInfoKey, 0, 1<<48-1, func(off uint64, _ []byte) {
		ids = append(ids, off)
	})
	return ids, err
}

// subvolumeExists reports whether the root tree still has a root item for
// subvolume id (a destroyed subvolume keeps it until the cleaner has
// dropped all its blocks).
func subvolumeExists(fd int, id uint64) (bool, error) {
	found := false
	err := searchItems(fd, rootTreeID, id, rootItemKey, 0, ^uint64(0), func(uint64, []byte) { found = true })
	return found, err
}

// qgroupUsage is the accounting of one qgroup, in bytes.
type qgroupUsage struct {
	// Referenced is every byte the subvolume can reach.
	Referenced int64
	// Exclusive is the bytes only this subvolume references.
	Exclusive int64
}

// readQgroup returns the accounting of level-0 qgroup 0/subvolID as of the
// last transaction commit. ENOENT when the qgroup does not exist.
func readQgroup(fd int, subvolID uint64) (qgroupUsage, error) {
	b, err := searchQuotaItem(fd, qgroupInfoKey, subvolID)
	if err != nil {
		return qgroupUsage{}, err
	}
	if len(b) < 40 { // struct btrfs_qgroup_info_item: five __le64
		return qgroupUsage{}, unix.ENOENT
	}
	le := binary.LittleEndian
	return qgroupUsage{Referenced: int64(le.Uint64(b[8:16])), Exclusive: int64(le.Uint64(b[24:32]))}, nil
}

// quotaStatus returns the flags of the quota status item (qgroupStatusOn,
// qgroupStatusScan, qgroupStatusBad), or 0 when quotas are off.
func quotaStatus(fd int) (uint64, error) {
	b, err := searchQuotaItem(fd, qgroupStatusKey, 0)
	if err == unix.ENOENT {
		return 0, nil
	}
	if err != nil || len(b) < 24 {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[16:24]), nil
}
