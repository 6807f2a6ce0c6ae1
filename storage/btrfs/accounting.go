package btrfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"github.com/forkbox/forkbox/errdefs"
)

// Disk limits are qgroup limits, and the kernel enforces them only while
// it accounts qgroups. Linux marks the qgroup numbers inconsistent, and
// from 6.x on also stops accounting (and so stops enforcing every limit on
// the filesystem) until a rescan, in a few cases; the common one is the
// deletion of a subvolume whose shared tree reaches drop_subtree_threshold
// levels (3 by default since Linux 6.8), which a large template's layer
// does. The driver therefore raises that threshold to the maximum tree
// level, and rescans whenever it finds the numbers inconsistent: before a
// limited layer is made, before usage is read, and every
// accountingCheckInterval in the background (Linux fs/btrfs/qgroup.c,
// qgroup_mark_inconsistent and btrfs_qgroup_trace_subtree; the sysfs knobs
// are in Documentation/ABI/testing/sysfs-fs-btrfs).

// accountingCheckInterval is how often the driver checks that the kernel
// still accounts qgroups.
const accountingCheckInterval = 5 * time.Second

// maxTreeLevel is BTRFS_MAX_LEVEL: with drop_subtree_threshold there the
// kernel traces every subtree a subvolume deletion drops instead of
// giving up on the accounting.
const maxTreeLevel = 8

// fsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes); only the
// filesystem id is read.
type fsInfoArgs struct {
	maxID, numDevices uint64
	fsid              [16]byte
	rest              [1024 - 32]byte
}

var iocFsInfo = ioc(iocRead, 31, unsafe.Sizeof(fsInfoArgs{}))

// qgroupSysfsDir returns /sys/fs/btrfs/<fsid>/qgroups for the filesystem
// holding fd, or "" when the kernel has no such directory (before Linux
// 5.9) or the id cannot be read.
func qgroupSysfsDir(fd int) string {
	var a fsInfoArgs
	if err := ioctl(fd, iocFsInfo, unsafe.Pointer(&a)); err != nil {
		return ""
	}
	u := a.fsid
	dir := filepath.Join("/sys/fs/btrfs", fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), "qgroups")
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return dir
}

// raiseDropThreshold sets the filesystem's drop_subtree_threshold to
// maxTreeLevel. Kernels without the knob (before 6.1) always traced.
func (d *Driver) raiseDropThreshold() {
	if d.qgroupDir == "" {
		return
	}
	_ = os.WriteFile(filepath.Join(d.qgroupDir, "drop_subtree_threshold"), []byte(fmt.Sprint(maxTreeLevel)), 0)
}

// accountingLost reports whether the kernel has marked the qgroup numbers
// inconsistent: the in-memory flag from sysfs when the kernel shows it,
// else the quota status item as of the last commit.
func (d *Driver) accountingLost() (bool, error) {
	if d.qgroupDir != "" {
		b, err := os.ReadFile(filepath.Join(d.qgroupDir, "inconsistent"))
		if err == nil {
			return strings.TrimSpace(string(b)) != "0", nil
		}
	}
	st, err := quotaStatus(d.rootFd)
	if err != nil {
		return false, storageErr("quota status", err)
	}
	return st&qgroupStatusBad != 0, nil
}

// ensureAccounting rescans the qgroups, and waits for the rescan, when the
// kernel has marked them inconsistent; it returns whether it rescanned.
// One rescan runs at a time; callers that find one running wait for it.
func (d *Driver) ensureAccounting() (bool, error) {
	lost, err := d.accountingLost()
	if err != nil || !lost {
		return false, err
	}
	d.rescanMu.Lock()
	defer d.rescanMu.Unlock()
	if lost, err = d.accountingLost(); err != nil || !lost {
		return false, err
	}
	began := time.Now()
	d.log.Warn("btrfs: the kernel marked the qgroups inconsistent, so disk limits are not enforced; rescanning", "dir", d.dir)
	if err := rescanQuota(d.rootFd); err != nil {
		return false, storageErr("quota rescan", err)
	}
	d.rescans.Add(1)
	if lost, err = d.accountingLost(); err != nil {
		return true, err
	}
	if lost {
		return true, errdefs.Newf(errdefs.ErrUnavailable, "btrfs: qgroups still inconsistent after a rescan of %s", d.dir)
	}
	d.log.Info("btrfs: qgroup rescan done; disk limits are enforced again", "dir", d.dir, "took", time.Since(began).Round(time.Millisecond))
	return true, nil
}

// watchAccounting runs ensureAccounting every accountingCheckInterval
// until Close; after a failed check it waits twice as long each time, up
// to maxAccountingBackoff (a rescan that cannot fix the numbers is not
// retried every few seconds).
func (d *Driver) watchAccounting() {
	defer d.watchers.Done()
	wait := accountingCheckInterval
	for {
		select {
		case <-d.closing:
			return
		case <-time.After(wait):
			if _, err := d.ensureAccounting(); err != nil {
				d.log.Warn("btrfs: qgroup accounting check", "dir", d.dir, "err", err)
				wait = min(2*wait, maxAccountingBackoff)
			} else {
				wait = accountingCheckInterval
			}
		}
	}
}

// maxAccountingBackoff bounds the wait between failed accounting checks.
const maxAccountingBackoff = 5 * time.Minute
