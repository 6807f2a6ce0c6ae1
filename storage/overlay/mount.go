package overlay

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// maxLayers is overlayfs's limit on lower layers (OVL_MAX_STACK).
const maxLayers = 500

// fsconfigMaxString is the longest string fsconfig(2) accepts, with its
// terminating NUL (256 bytes).
const fsconfigMaxString = 256

// forceLegacyMount makes mountOverlay use mount(2) even where the new
// mount API could be used (for tests of the fallback).
var forceLegacyMount = false

// overlayOptions are the overlay options every layer is mounted with:
// no redirects and no metacopy, so that an upper directory is a
// self-contained layer (every changed file whole, every renamed
// directory copied, deletions as whiteouts and opaque directories) that
// can be copied into a snapshot and stacked as a lower layer; no index
// (it ties an upper to its lowers' file handles).
var overlayOptions = [][2]string{{"redirect_dir", "off"}, {"metacopy", "off"}, {"index", "off"}}

// mountOverlay mounts an overlay at target with lowers (top first; the
// template rootfs last), upper and work, nodev and nosuid.
//
// The lower layers are passed one by one with fsconfig(2) "lowerdir+"
// (Linux 6.8 and newer), which has no limit on their combined length. On
// older kernels (Debian 12's 6.1) it falls back to mount(2), whose option
// string is limited to one page: there every layer is named by a short
// /proc/self/fd/N path of a descriptor opened on it, about 18 bytes a
// layer, which fits overlayfs's own limit of 500 layers into 4096 bytes
// whatever the layers' real paths are.
//
// An empty upper mounts a read-only view of the lowers (no work
// directory; overlayfs then needs at least two lowers).
func mountOverlay(target string, lowers []string, upper, work string) error {
	if len(lowers) == 0 || len(lowers) > maxLayers {
		return fmt.Errorf("overlay at %s: %d lower layers (at most %d): %w", target, len(lowers), maxLayers, errdefs.ErrResourceExhausted)
	}
	var fds pathFDs
	defer fds.close()
	if !forceLegacyMount && kernelAtLeast(6, 8) {
		return mountFsconfig(target, lowers, upper, work, &fds)
	}
	return mountLegacy(target, lowers, upper, work, &fds)
}

// kernelAtLeast reports whether the running kernel's release is at least
// major.minor.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	var ma, mi int
	if _, err := fmt.Sscanf(rel, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// mountFsconfig mounts the overlay with fsopen/fsconfig/fsmount/
// move_mount, which overlayfs supports with "lowerdir+" since Linux 6.8.
func mountFsconfig(target string, lowers []string, upper, work string, fds *pathFDs) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fsfd, key, value); err != nil {
			return fmt.Errorf("overlay at %s: %s=%s: %w%s", target, key, value, err, fsLog(fsfd))
		}
		return nil
	}
	if err := set("source", "overlay"); err != nil {
		return err
	}
	for _, l := range lowers {
		p, err := fds.short(l, fsconfigMaxString)
		if err != nil {
			return err
		}
		if err := set("lowerdir+", p); err != nil {
			return err
		}
	}
	for _, kv := range [][2]string{{"upperdir", upper}, {"workdir", work}} {
		if upper == "" {
			break // a read-only view of the lowers
		}
		p, err := fds.short(kv[1], fsconfigMaxString)
		if err != nil {
			return err
		}
		if err := set(kv[0], p); err != nil {
			return err
		}
	}
	for _, kv := range overlayOptions {
		if err := set(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create overlay for %s: %w%s", target, err, fsLog(fsfd))
	}
	attrs := uint32(unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID)
	if upper == "" {
		attrs |= unix.MOUNT_ATTR_RDONLY
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, int(attrs))
	if err != nil {
		return fmt.Errorf("fsmount overlay for %s: %w%s", target, err, fsLog(fsfd))
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", target, err)
	}
	return nil
}

// fsLog drains the messages the kernel left on filesystem context fsfd
// (why a parameter or the creation failed) as ": msg; msg", or "".
func fsLog(fsfd int) string {
	var msgs []string
	buf := make([]byte, 1024)
	for i := 0; i < 16; i++ {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " (" + strings.Join(msgs, "; ") + ")"
}

// mountLegacy mounts the overlay with mount(2), naming every layer by a
// /proc/self/fd path so the option string stays within one page.
func mountLegacy(target string, lowers []string, upper, work string, fds *pathFDs) error {
	names := make([]string, len(lowers))
	for i, l := range lowers {
		p, err := fds.short(l, 0)
		if err != nil {
			return err
		}
		names[i] = p
	}
	var opts strings.Builder
	opts.WriteString("lowerdir=" + strings.Join(names, ":"))
	flags := uintptr(unix.MS_NODEV | unix.MS_NOSUID)
	for _, kv := range [][2]string{{"upperdir", upper}, {"workdir", work}} {
		if upper == "" {
			flags |= unix.MS_RDONLY
			break
		}
		p, err := fds.short(kv[1], 0)
		if err != nil {
			return err
		}
		opts.WriteString("," + kv[0] + "=" + p)
	}
	for _, kv := range overlayOptions {
		opts.WriteString("," + kv[0] + "=" + kv[1])
	}
	if opts.Len() >= 4096 {
		return fmt.Errorf("overlay at %s: options of %d bytes exceed a page: %w", target, opts.Len(), errdefs.ErrResourceExhausted)
	}
	if err := unix.Mount("overlay", target, "overlay", flags, opts.String()); err != nil {
		return fmt.Errorf("mount overlay at %s (%d lower layers): %w", target, len(lowers), err)
	}
	return nil
}

// pathFDs holds O_PATH descriptors opened to give layers short names.
type pathFDs []int

// short returns path itself when max > 0 and path is shorter than max
// bytes and has no character overlayfs treats specially; otherwise it
// opens path (O_PATH, a directory) and returns "/proc/self/fd/N", which
// the kernel resolves to the same directory while the descriptor is open.
func (f *pathFDs) short(path string, max int) (string, error) {
	if max > 0 && len(path) < max && !strings.ContainsAny(path, `,:\`) {
		return path, nil
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open layer %s: %w", path, err)
	}
	*f = append(*f, fd)
	return "/proc/self/fd/" + strconv.Itoa(fd), nil
}

// close closes every descriptor short opened.
func (f *pathFDs) close() {
	for _, fd := range *f {
		unix.Close(fd)
	}
	*f = nil
}
