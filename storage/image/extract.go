package image

import (
	"archive/tar"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkbox/forkbox/errdefs"
)

// extractor applies the layers of one image to a rootfs. It is not safe for
// concurrent use.
type extractor struct {
	ctx   context.Context
	root  int // directory fd of the rootfs; every operation is relative to it
	shift IDShift
	layer int // 1-based number of the layer being applied, for messages

	entries    int   // tar entries seen over all layers (capped at maxEntries)
	read       int64 // uncompressed tar bytes read over all layers (capped at maxImageBytes)
	written    int64 // regular file bytes written over all layers (capped at maxWritten)
	maxWritten int64 // maxImageBytes, or Limits.MaxBytes when lower

	depth map[inodeKey]int // directory depth below the rootfs (root: 0), see mkdirAt

	// Per layer: lexical paths the layer wrote, their ancestors, and the
	// directory mtimes to set once the layer is complete.
	touched  map[string]bool
	parents  map[string]bool
	dirTimes []dirTime
}

// dirTime is a directory modification time applied at the end of a layer,
// after the layer's entries inside the directory have been created.
type dirTime struct {
	rel   string
	mtime time.Time
}

// errTooLarge is returned by countingReader once maxImageBytes is exceeded.
var errTooLarge = fmt.Errorf("uncompressed size limit: %w", ErrTooLarge)

// countingReader reads from r, adding the bytes to x.read and failing with
// errTooLarge once the total exceeds maxImageBytes.
type countingReader struct {
	r io.Reader
	x *extractor
}

// Read implements io.Reader.
func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.x.read += int64(n)
	if c.x.read > maxImageBytes {
		return n, errTooLarge
	}
	return n, err
}

// applyImage applies the layers of src, lowest first, to the empty rootfs
// open at rootfd and returns the image description. Errors name the layer
// and entry and wrap an errdefs class (see Import); the caller removes the
// rootfs on error.
func applyImage(ctx context.Context, src *source, rootfd int, shift IDShift, lim Limits) (*Image, error) {
	x := &extractor{ctx: ctx, root: rootfd, shift: shift, depth: map[inodeKey]int{}, maxWritten: maxImageBytes}
	if lim.MaxBytes > 0 && lim.MaxBytes < x.maxWritten {
		x.maxWritten = lim.MaxBytes
	}
	rk, err := statKey(rootfd)
	if err != nil {
		return nil, err
	}
	x.depth[rk] = 0
	for i, l := range src.layers {
		x.layer = i + 1
		if err := x.applyLayer(l, src.cfg.RootFS.DiffIDs[i]); err != nil {
			return nil, err
		}
	}
	c := src.cfg.Config
	return &Image{
		Digest:     src.digest.String(),
		Env:        c.Env,
		WorkingDir: c.WorkingDir,
		User:       c.User,
		Entrypoint: c.Entrypoint,
		Cmd:        c.Cmd,
		Layers:     len(src.layers),
		SizeBytes:  x.written,
	}, nil
}

// applyLayer reads l's uncompressed tar stream, applies each entry, sets the
// layer's directory mtimes, and checks that the stream hashes to diffID.
func (x *extractor) applyLayer(l v1.Layer, diffID v1.Hash) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("layer %d: %w", x.layer, invalidf("open: %v", err))
	}
	defer rc.Close()
	h, err := v1.Hasher(diffID.Algorithm)
	if err != nil {
		return fmt.Errorf("layer %d: %w", x.layer, invalidf("diff id: %v", err))
	}
	cr := &countingReader{r: io.TeeReader(rc, h), x: x}
	x.touched, x.parents, x.dirTimes = map[string]bool{}, map[string]bool{}, nil
	tr := tar.NewReader(cr)
	for {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("layer %d: %w", x.layer, streamErr(err))
		}
		if x.entries++; x.entries > maxEntries {
			return fmt.Errorf("layer %d: more than %d entries: %w", x.layer, maxEntries, errdefs.ErrResourceExhausted)
		}
		if err := x.applyEntry(hdr, tr); err != nil {
			return fmt.Errorf("layer %d entry %q: %w", x.layer, hdr.Name, err)
		}
	}
	// Hash the end-of-archive padding too: the diff id covers the whole stream.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return fmt.Errorf("layer %d: %w", x.layer, streamErr(err))
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != diffID.Hex {
		return fmt.Errorf("layer %d: %w", x.layer, invalidf("content %s:%s does not match diff id %s", diffID.Algorithm, got, diffID))
	}
	for i := len(x.dirTimes) - 1; i >= 0; i-- {
		if err := x.setDirTime(x.dirTimes[i]); err != nil {
			return fmt.Errorf("layer %d directory %q: %w", x.layer, x.dirTimes[i].rel, classify(err))
		}
	}
	return nil
}

// streamErr classifies an error from reading a layer stream: the size limit
// stays errdefs.ErrResourceExhausted, anything else (corrupt compression or
// tar data) is errdefs.ErrInvalidArgument.
func streamErr(err error) error {
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return err
	}
	return invalidf("read tar stream: %v", err)
}

// cleanName validates an entry name or hard link target from a layer and
// returns it as a cleaned path relative to the rootfs ("" for the root
// itself). Leading slashes and "." components are dropped; a ".." component
// anywhere, a NUL byte, an empty name or a name longer than maxNameLen is an
// errdefs.ErrInvalidArgument error.
func cleanName(n string) (string, error) {
	if n == "" || len(n) > maxNameLen || strings.IndexByte(n, 0) >= 0 {
		return "", invalidf("bad name %q", n)
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", invalidf("name %q contains \"..\"", n)
		}
	}
	return strings.TrimPrefix(path.Clean("/"+n), "/"), nil
}

// owner returns the host uid and gid for hdr's image ids; ids outside
// [0, shift.Size) are an errdefs.ErrInvalidArgument error.
func (x *extractor) owner(hdr *tar.Header) (int, int, error) {
	if hdr.Uid < 0 || hdr.Gid < 0 || int64(hdr.Uid) >= int64(x.shift.Size) || int64(hdr.Gid) >= int64(x.shift.Size) {
		return 0, 0, invalidf("owner %d:%d outside the mapped range 0..%d", hdr.Uid, hdr.Gid, int64(x.shift.Size)-1)
	}
	return int(x.shift.UIDBase) + hdr.Uid, int(x.shift.GIDBase) + hdr.Gid, nil
}

// applyEntry applies one tar entry (hdr; its content is read from r) to the
// rootfs: whiteouts delete, directories are created or updated, regular
// files, symlinks and hard links replace whatever was at their path, devices
// and FIFOs only remove it.
func (x *extractor) applyEntry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the root keeps mode 0755 and the mapped root owner
		}
		return invalidf("non-directory entry for the root")
	}
	dir, base := splitRel(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return x.whiteout(dir, base)
	}
	uid, gid, err := x.owner(hdr)
	if err != nil {
		return err
	}
	pfd, err := x.openParent(dir, true)
	if err != nil {
		return fmt.Errorf("parent directory: %w", classify(err))
	}
	defer unix.Close(pfd)
	mode := uint32(hdr.Mode) & 0o1777 // permissions and sticky; setuid/setgid stripped
	switch hdr.Typeflag {
	case tar.TypeDir:
		err = x.mkdir(pfd, base, uid, gid, mode)
		x.dirTimes = append(x.dirTimes, dirTime{rel, hdr.ModTime})
	case tar.TypeReg, tar.TypeGNUSparse:
		err = x.writeFile(pfd, base, hdr, r, uid, gid, mode)
	case tar.TypeSymlink:
		err = x.symlink(pfd, base, hdr, uid, gid)
	case tar.TypeLink:
		err = x.hardlink(pfd, base, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		_, err = prepare(pfd, base, false) // not created; see the package doc
		return classify(err)
	default:
		return invalidf("unsupported entry type %q", hdr.Typeflag)
	}
	if err != nil {
		return classify(err)
	}
	x.markTouched(rel)
	return nil
}

// mkdir makes name in the directory fd pfd a directory owned by uid/gid with
// permission bits mode: an existing directory is kept (and updated),
// anything else there is replaced.
func (x *extractor) mkdir(pfd int, name string, uid, gid int, mode uint32) error {
	existed, err := prepare(pfd, name, true)
	if err != nil {
		return err
	}
	if !existed {
		if err := x.mkdirAt(pfd, name); err != nil {
			return err
		}
	}
	return fixDir(pfd, name, uid, gid, mode)
}

// writeFile replaces name in the directory fd pfd with a new regular file
// (O_CREAT|O_EXCL|O_NOFOLLOW, so no existing inode is ever written through)
// holding hdr.Size bytes from r, owned by uid/gid, with permission bits mode
// and hdr's mtime. The bytes count against x.maxWritten.
func (x *extractor) writeFile(pfd int, name string, hdr *tar.Header, r io.Reader, uid, gid int, mode uint32) error {
	if hdr.Size < 0 {
		return invalidf("negative size")
	}
	if x.written+hdr.Size > x.maxWritten {
		return fmt.Errorf("the image's files are more than %d bytes: %w", x.maxWritten, ErrTooLarge)
	}
	if _, err := prepare(pfd, name, false); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	err = unix.Fchown(fd, uid, gid)
	if err == nil {
		err = unix.Fchmod(fd, mode)
	}
	if err == nil {
		var n int64
		n, err = io.Copy(f, r)
		x.written += n
		if err != nil && !errors.Is(err, errdefs.ErrResourceExhausted) && !isErrno(err) {
			err = invalidf("read content: %v", err)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return setTimes(pfd, name, hdr.ModTime)
}

// isErrno reports whether err wraps a system call error (a write failure, as
// opposed to a failure reading the layer).
func isErrno(err error) bool {
	var errno unix.Errno
	return errors.As(err, &errno)
}

// symlink replaces name in the directory fd pfd with a symlink to
// hdr.Linkname (any text: it is only ever resolved inside the rootfs) owned
// by uid/gid, with hdr's mtime.
func (x *extractor) symlink(pfd int, name string, hdr *tar.Header, uid, gid int) error {
	t := hdr.Linkname
	if t == "" || len(t) > maxNameLen || strings.IndexByte(t, 0) >= 0 {
		return invalidf("bad symlink target %q", t)
	}
	if _, err := prepare(pfd, name, false); err != nil {
		return err
	}
	if err := unix.Symlinkat(t, pfd, name); err != nil {
		return err
	}
	if err := unix.Fchownat(pfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return setTimes(pfd, name, hdr.ModTime)
}

// hardlink replaces name in the directory fd pfd with a hard link to target,
// an archive path resolved inside the rootfs (RESOLVE_IN_ROOT, final symlink
// not followed). A target that does not exist or is not a regular file is an
// errdefs.ErrInvalidArgument error. The link is made with linkat(AT_EMPTY_PATH)
// from an O_PATH fd of the target, so the inode linked is the one resolved.
func (x *extractor) hardlink(pfd int, name, target string) error {
	trel, err := cleanName(target)
	if err != nil {
		return err
	}
	tfd, err := resolveIn(x.root, trel, unix.O_PATH|unix.O_NOFOLLOW)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return invalidf("hard link target %q does not exist in the rootfs", target)
	}
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	var tst unix.Stat_t
	if err := unix.Fstat(tfd, &tst); err != nil {
		return err
	}
	if tst.Mode&unix.S_IFMT != unix.S_IFREG {
		return invalidf("hard link target %q is not a regular file", target)
	}
	if st, ok, err := lstatAt(pfd, name); err != nil {
		return err
	} else if ok && st.Dev == tst.Dev && st.Ino == tst.Ino {
		return nil // already this inode
	}
	if _, err := prepare(pfd, name, false); err != nil {
		return err
	}
	err = unix.Linkat(tfd, "", pfd, name, unix.AT_EMPTY_PATH)
	if err != unix.ENOENT {
		return err
	}
	if err := unix.Fstat(tfd, &tst); err != nil || tst.Nlink == 0 {
		return invalidf("hard link target %q was removed by the entry itself", target)
	}
	// Without CAP_DAC_READ_SEARCH, AT_EMPTY_PATH fails with ENOENT; the
	// fd's /proc magic link names the same inode.
	return unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tfd), pfd, name, unix.AT_SYMLINK_FOLLOW)
}

// setDirTime sets the mtime of the directory recorded in d, resolving its
// parent again inside the rootfs; a directory removed later in the layer is
// skipped.
func (x *extractor) setDirTime(d dirTime) error {
	dir, base := splitRel(d.rel)
	pfd, err := x.openParent(dir, false)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	st, ok, err := lstatAt(pfd, base)
	if err != nil || !ok || !isDir(&st) {
		return err
	}
	return setTimes(pfd, base, d.mtime)
}
