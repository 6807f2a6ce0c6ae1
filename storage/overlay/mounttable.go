package overlay

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	// Dev is the filesystem's device number as "major:minor".
	Dev string
	// Point is the mount point; FSType, Source and SuperOpts are the
	// filesystem's type, source (a device path for block filesystems) and
	// per-superblock options.
	Point, FSType, Source, SuperOpts string
}

// mounts returns the mount table of the calling process's mount
// namespace, in mount order.
func mounts() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || len(fields) < sep+4 {
			continue
		}
		out = append(out, mountInfo{Dev: fields[2], Point: unescapeMount(fields[4]),
			FSType: fields[sep+1], Source: unescapeMount(fields[sep+2]), SuperOpts: fields[sep+3]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the octal escapes (\040 for a space, ...) of a
// mountinfo field.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountOf returns the mount table entry of the filesystem holding path
// (matched by device number; the last such mount wins).
func mountOf(path string) (mountInfo, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return mountInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	ms, err := mounts()
	if err != nil {
		return mountInfo{}, err
	}
	var found *mountInfo
	for i := range ms {
		if ms[i].Dev == dev {
			found = &ms[i]
		}
	}
	if found == nil {
		return mountInfo{}, fmt.Errorf("no mount table entry for %s (device %s): %w", path, dev, errdefs.ErrInternal)
	}
	return *found, nil
}

// isMountPoint reports whether path is the root of a mounted filesystem
// (its device differs from its parent's).
func isMountPoint(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(path+"/..", &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino
}

// unmount detaches the filesystem mounted at path (MNT_DETACH: it goes
// away once its last user does). Nothing mounted there is not an error.
func unmount(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", path, err)
}
