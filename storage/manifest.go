package storage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// ManifestDigest returns "sha256:<hex>" of the contents manifest of the
// directory tree at root: one line per entry, sorted by path, with its
// type, permission bits, owner, group, size, device number (whiteouts are
// 0:0 character devices), symlink target, modification and change times in
// nanoseconds. Symlinks are not followed.
//
// Content is represented by size and times rather than hashed, so that a
// snapshot of a large sandbox is digested in the time of one walk; any
// later change to a file's content or metadata sets its change time
// (ctime), which no system call can set back, so a tampered snapshot does
// not match.
func ManifestDigest(root string) (string, error) {
	type line struct{ path, rest string }
	var lines []line
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		target := ""
		if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		size := st.Size
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			size = 0 // directory sizes vary by filesystem and history
		}
		lines = append(lines, line{rel, fmt.Sprintf("%o\x00%d\x00%d\x00%d\x00%d\x00%s\x00%d\x00%d",
			st.Mode, st.Uid, st.Gid, size, st.Rdev, target,
			st.Mtim.Nano(), st.Ctim.Nano())})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("manifest of %s: %w", root, err)
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].path < lines[j].path })
	h := sha256.New()
	for _, l := range lines {
		fmt.Fprintf(h, "%s\x00%s\n", l.path, l.rest)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
